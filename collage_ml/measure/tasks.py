"""What a measurement worker runs: the tasks the Runner sends it, and the compiled candidates it keeps.

These run inside a worker process (:mod:`.worker`): :class:`Task` compiles, checks and times one candidate
(:func:`execute`), :class:`RetimeTask` times a kept candidate once more (one more window of the protocol,
:mod:`.timing`), and :class:`ReleaseTask` closes kept ones. The parent side, which decides what to send and
combines the windows, is :class:`~collage_ml.measure.runner.Runner`.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from collage_ml.errors import describe
from collage_ml.measure.timing import Tolerance, TimingConfig


@dataclass
class Task:
    """Everything a worker needs to measure one candidate (picklable)."""

    backend_spec: tuple[str, str, dict]
    onnx_bytes: bytes
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    threads: int
    timing: TimingConfig = field(default_factory=TimingConfig)
    tolerance: Tolerance = field(default_factory=Tolerance)
    #: a token: the worker keeps the compiled candidate under it for the protocol's later windows
    #: (:class:`RetimeTask`) until a :class:`ReleaseTask` names it; empty: closed after timing
    keep: str = ""

    def execute(self) -> dict:
        return execute(self)


#: compiled candidates this worker process keeps between the windows of the protocol (``keep_compiled``):
#: token -> (executable, its arguments)
_KEPT: dict[str, tuple] = {}


@dataclass
class RetimeTask:
    """Times a candidate that this worker compiled, checked and kept (:attr:`Task.keep`) once more: one more
    window of the protocol, without compiling again. ``lost`` in the result: the worker no longer has it
    (it was restarted since), and the candidate must be compiled again."""

    token: str
    timing: TimingConfig = field(default_factory=TimingConfig)

    def execute(self) -> dict:
        from collage_ml.measure.timing import time_callable

        kept = _KEPT.get(self.token)
        if kept is None:
            return {"valid": False, "failed": True, "lost": True, "error_text": "the kept candidate is gone"}
        exe, args = kept
        try:
            return {"valid": True, **timing_fields(time_callable(lambda: exe(*args), self.timing))}
        except MemoryError as e:
            return {"valid": False, "failed": True, "error_text": f"out of memory: {describe(e, 400)}"}
        except Exception as e:
            return {"valid": False, "error_text": f"{describe(e, 400)} (in a later window; the first was valid)"}


@dataclass
class ReleaseTask:
    """Closes and forgets the kept candidates ``tokens`` in this worker."""

    tokens: list[str]

    def execute(self) -> dict:
        released = 0
        for t in self.tokens:
            kept = _KEPT.pop(t, None)
            if kept is not None:
                released += 1
                try:
                    kept[0].close()
                except Exception:  # closing is best effort: the worker goes on either way
                    pass
        return {"valid": True, "released": released}


def build_backend(spec: tuple[str, str, dict]):
    """A backend from its spec, on the channel between a process and its own workers (trusted)."""
    from collage_ml.backends.base import Backend

    return Backend.from_spec(spec, trusted=True)


def execute(task: Task) -> dict:
    """Compiles, checks and times one candidate in this process. Never raises."""
    import onnx

    from collage_ml.backends.base import to_numpy
    from collage_ml.ir.importers import from_onnx
    from collage_ml.measure.timing import compare, time_callable

    try:
        backend = build_backend(task.backend_spec)
        graph = from_onnx(onnx.load_from_string(task.onnx_bytes), name="candidate")
        sg = graph.whole()
        t0 = time.perf_counter()
        exe = backend.compile(sg, threads=task.threads)
        compile_seconds = time.perf_counter() - t0
        args = [task.feeds[n] for n in exe.input_names]
        outs = exe(*args)
        cmp = compare([to_numpy(o) for o in outs], task.expected, list(exe.output_names), task.tolerance)
        if not cmp.ok:
            return {
                "valid": False, "error_text": f"wrong numbers: {cmp.detail}", "compile_seconds": compile_seconds,
                "max_abs_error": cmp.max_abs, "max_rel_error": cmp.max_rel,
            }
        res = time_callable(lambda: exe(*args), task.timing)
        if task.keep:
            _KEPT[task.keep] = (exe, args)
        else:
            exe.close()
        return {
            "valid": True, "compile_seconds": compile_seconds, "max_abs_error": cmp.max_abs,
            "max_rel_error": cmp.max_rel, **timing_fields(res),
        }
    except MemoryError as e:  # a fact about this run (the machine's memory), not about the backend
        return {"valid": False, "failed": True, "error_text": f"out of memory: {describe(e, 400)}"}
    except Exception as e:
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
        return {"valid": False, "error_text": f"{describe(e, 400)}{where}"}


def timing_fields(res) -> dict:
    """A worker's result fields for one :class:`~collage_ml.measure.timing.TimingResult`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return {
        "samples": res.samples, "median": res.median, "spread": res.spread, "calls_per_sample": res.calls_per_sample,
        "pressure": res.pressure, "steal": res.steal, "retimed": res.retimed, "contended": res.contended,
        "cpus_available": cpus, "started": res.extra.get("started"),
    }
