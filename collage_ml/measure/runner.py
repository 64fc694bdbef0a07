"""The Runner: compiles and times candidates in persistent worker processes.

Each worker is a ``spawn``-ed process that rebuilds backends from their
:meth:`Backend.spec`, compiles a candidate's subgraph, checks its outputs
against the reference activations, and times it (:mod:`.timing`). Workers are
reused across candidates. A crash (segfault, ``os.abort``) or a timeout costs
one worker and marks that one candidate ``invalid`` with the error text; the
run goes on with a fresh worker.

Candidates are grouped by backend and measured one backend per phase, since
a runtime's idle threads slow the next runtime's calls (STACK-NOTES.md). Every
measurement is committed to the database as it arrives; candidates already in
the database for this hardware fingerprint are cache hits and are not run.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from collage_ml.candidates import Candidate
from collage_ml.cost import CandidateKey, Measurement
from collage_ml.errors import BackendError, describe
from collage_ml.measure.timing import Tolerance, TimingConfig

STARTUP_TIMEOUT = 120.0
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


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

    def execute(self) -> dict:
        return execute(self)


def build_backend(spec: tuple[str, str, dict]):
    module, qualname, config = spec
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj(**config)


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
        exe.close()
        return {
            "valid": True, "samples": res.samples, "median": res.median, "spread": res.spread,
            "compile_seconds": compile_seconds, "max_abs_error": cmp.max_abs, "max_rel_error": cmp.max_rel,
        }
    except Exception as e:
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" at {os.path.basename(last[0].filename)}:{last[0].lineno}" if last else ""
        return {"valid": False, "error_text": f"{describe(e, 400)}{where}"}


def _worker_main(fd: int, threads: int) -> None:
    """The worker's loop: receive a task, send back ``task.execute()``; ``None`` stops it."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:  # pragma: no cover
        pass
    import collage_ml.ir.importers  # noqa: F401  (warm the imports before the first timed task)

    conn.send("ready")
    while True:
        try:
            task = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if task is None:
            return
        conn.send(task.execute())


class Worker:
    """One persistent worker process; restarted after a crash or a timeout.

    The worker is a fresh interpreter (``python -m collage_ml.measure.runner``)
    talking over a socket pair, not a ``multiprocessing`` child: that way it
    never re-imports the user's ``__main__``, so scripts without an
    ``if __name__ == "__main__"`` guard work. It gets the parent's
    ``sys.path``, so backends defined in importable user modules resolve.
    """

    def __init__(self, threads: int):
        self.threads = threads
        self.proc: subprocess.Popen | None = None
        self.conn = None

    def start(self) -> None:
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        for k in THREAD_ENV:
            env[k] = str(self.threads)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "collage_ml.measure.runner", str(theirs.fileno()), str(self.threads)],
                pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        # wait for the worker's imports, so a task's timeout covers only the task
        try:
            ok = self.conn.poll(STARTUP_TIMEOUT) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            ok = False
        if not ok:
            self.kill()
            raise RuntimeError(f"measurement worker did not start within {STARTUP_TIMEOUT:g} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, task, timeout: float) -> dict:
        """Runs ``task.execute()`` in the worker; a crash or timeout gives an invalid result dict."""
        if not self.alive():
            self.kill()
            self.start()
        try:
            self.conn.send(task)
            if not self.conn.poll(timeout):
                self.kill()
                return {"valid": False, "error_text": f"timeout: no result after {timeout:g} s"}
            return self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = None
            if self.proc is not None:
                try:
                    code = self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            return {"valid": False, "error_text": f"worker crashed ({_describe_exit(code)})"}

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass
        if self.conn is not None:
            self.conn.close()
        self.proc = None
        self.conn = None

    def stop(self) -> None:
        if self.alive():
            try:
                self.conn.send(None)
                self.proc.wait(5)
            except (OSError, BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Runner:
    """Measures candidates and commits each result to ``db`` (optional).

    ``threads`` is the intra-op thread count used for every backend;
    ``timeout`` bounds one candidate's compile plus timing, in seconds.
    """

    def __init__(
        self,
        db=None,
        threads: int | None = None,
        timeout: float = 120.0,
        timing: TimingConfig = TimingConfig(),
        tolerance: Tolerance = Tolerance(),
        family: str = "",
    ):
        from collage_ml.measure.hardware import fingerprint, hardware_info

        self.db = db
        self.threads = threads or default_threads()
        self.timeout = timeout
        self.timing = timing
        self.tolerance = tolerance
        self.family = family
        self.hardware = fingerprint(self.threads)
        if db is not None:
            db.register_hardware(self.hardware, hardware_info(self.threads))
        self.worker = Worker(self.threads)
        # backends that change process-wide state (ORT's global thread pool) get a worker of their own
        self._group_workers: dict[str, Worker] = {}
        self.cache_hits = 0
        self.measured = 0

    def close(self) -> None:
        self.worker.stop()
        for w in self._group_workers.values():
            w.stop()

    def worker_for(self, backends) -> "Worker":
        """The worker for tasks that build ``backends`` (one backend, or several for a plan or boundary)."""
        groups = {getattr(b, "process_group", None) for b in backends} - {None}
        if not groups:
            return self.worker
        if len(groups) > 1:
            raise BackendError(f"backends of process groups {sorted(groups)} cannot run in one process")
        g = groups.pop()
        if g not in self._group_workers:
            self._group_workers[g] = Worker(self.threads)
        return self._group_workers[g]

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def lookup(self, key: CandidateKey) -> Measurement | None:
        return self.db.get(key, self.hardware) if self.db is not None else None

    def measure(
        self,
        candidates: Sequence[Candidate],
        reference: Mapping[str, np.ndarray],
        family: str | None = None,
        on_result: Callable[[Candidate, Measurement, bool], None] | None = None,
    ) -> list[Measurement]:
        """Measures each candidate (cache hits are not re-run); results align with ``candidates``.

        ``reference`` is :meth:`Graph.reference` of the candidates' graph.
        ``on_result(candidate, measurement, cached)`` is called after each one.
        """
        family = self.family if family is None else family
        results: dict[CandidateKey, Measurement] = {}
        order = sorted(range(len(candidates)), key=lambda i: candidates[i].backend.name)  # one backend per phase
        for i in order:
            c = candidates[i]
            key = c.key
            if key in results:
                continue
            cached = self.lookup(key)
            if cached is not None:
                self.cache_hits += 1
                results[key] = cached
                if on_result:
                    on_result(c, cached, True)
                continue
            m = self.measure_one(c, reference, family)
            results[key] = m
            if on_result:
                on_result(c, m, False)
        return [results[c.key] for c in candidates]

    def measure_one(self, c: Candidate, reference: Mapping[str, np.ndarray], family: str = "") -> Measurement:
        sg = c.subgraph
        feeds, expected = sg.reference_io(reference)
        task = Task(
            c.backend.spec(), sg.to_onnx(check=False).SerializeToString(), feeds, expected, self.threads,
            self.timing, self.tolerance,
        )
        r = self.worker_for([c.backend]).run(task, self.timeout)
        m = Measurement(
            key=c.key,
            hardware=self.hardware,
            valid=bool(r.get("valid")),
            samples=list(r.get("samples", [])),
            median=r.get("median"),
            spread=r.get("spread"),
            compile_seconds=r.get("compile_seconds"),
            max_abs_error=r.get("max_abs_error"),
            max_rel_error=r.get("max_rel_error"),
            threads=self.threads,
            versions=c.backend.versions(),
            family=family,
            error_text=r.get("error_text", ""),
            onnx_bytes=sg.skeleton_onnx(),
            extra={"pattern": c.pattern, "nodes": len(sg)},
        )
        self.measured += 1
        if self.db is not None:
            self.db.commit(m)
        return m


def default_threads() -> int:
    """Intra-op threads for every backend: ``$COLLAGE_ML_THREADS``, else the physical core count."""
    env = os.environ.get("COLLAGE_ML_THREADS")
    if env:
        return max(1, int(env))
    try:
        import psutil

        return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
    except ImportError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


def measure_candidates(
    candidates: Iterable[Candidate], reference: Mapping[str, np.ndarray], db=None, **runner_kwargs
) -> list[Measurement]:
    """One-shot convenience: a Runner for one batch of candidates."""
    with Runner(db=db, **runner_kwargs) as r:
        return r.measure(list(candidates), reference)


if __name__ == "__main__":  # the worker process: python -m collage_ml.measure.runner FD THREADS
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
