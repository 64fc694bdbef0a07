"""In-context costs: what a partition pays inside a plan beyond its latency measured alone.

A candidate is timed alone, called again and again: its weights, its session's
state and its code stay in the caches between calls. Inside a plan the other
partitions run between two of its calls and evict them, so every partition
pays more there. On the Xeon AMX at 1 thread, nasrnn cut into 235 one-node
ONNX Runtime partitions ran 4.4 ms of partition calls whose alone medians sum
to 1.75 ms: its 80 Gemms (1 MiB of weights each) took 3.2 ms against 1.0, and
its weightless elementwise nodes about 1.8x their alone time. A plan of many
partitions looked 2x cheaper to the op-level DP than it ran.

The cost is measured per backend, in executed rotations, as DESIGN.md asks of
hand-offs: ``copies`` compiled copies of one subgraph, each with its own
constants (seeded, different weights), are called round-robin, so that each
call finds its own constants and state evicted by the others; the same number of
calls of one copy gives the alone time. The in-context cost is the rotation's
median minus the alone median, per call, at four constant sizes:

- 0 bytes: one Relu on a ``[1, 256]`` tensor, the cost of a cold call (256 copies: a session's own state is
  small, and 32 copies of it stay in the cache);
- 256 KiB, 1 MiB and 4 MiB: a MatMul ``[1, n] x [n, n]`` with ``n`` = 256, 512, 1024 (at least 8 MiB of
  copies in all).

A backend that compiles slowly (Inductor) stops adding copies after :data:`COMPILE_BUDGET` seconds; the
record's ``extra.copies`` says how many it rotated.

Past the cache, the alone time already streams the weights, so the cost stops
growing with size; :class:`ContextTable` interpolates linearly in bytes and
holds the last value beyond 4 MiB.

The results are :class:`~collage_ml.measure.records.BoundaryCost` records of
the same-backend pair (A, A), stored in the ``boundaries`` table with the
constants' bytes as ``nbytes`` and :data:`CONTEXT_TENSOR` as ``tensor`` (a
hand-off record names a tensor shape there, so the two never meet:
:class:`~collage_ml.measure.boundary.BoundaryTable` skips these). They merge,
export and keep their first settled row as boundary costs do.

The op-level DP adds ``ContextTable.overhead`` to every candidate except the
whole model, whose measurement is already in context, in models with at least
:data:`MIN_MODEL_BYTES` of constants (one inference streams them all, so
whatever the plan, each partition's state is gone by its next call).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

import numpy as np

from collage_ml.errors import describe
from collage_ml.measure.boundary import CONTEXT_PREFIX, _stored, run_record
from collage_ml.measure.records import BoundaryCost, BoundaryKey
from collage_ml.measure.timing import TimingConfig

#: constant bytes the cost is measured at: none (a Relu), then a float32 MatMul weight of 256 KiB, 1 MiB, 4 MiB
CONTEXT_SIZES = (0, 262144, 1048576, 4194304)
#: bytes of constants the copies of one size hold together (enough to leave any core's L2)
ROTATION_BYTES = 8 << 20
MIN_COPIES, MAX_COPIES = 4, 32
#: copies of the weightless Relu: one session's state is small, so it takes many to leave the cache
CALL_COPIES = 256
#: seconds of compiling copies after which a rotation makes do with the copies it has (at least MIN_COPIES)
COMPILE_BUDGET = 10.0
#: a model whose constants are fewer bytes than this is not charged: its partitions may share the cache
#: between calls, and no rotation here has shown what they pay then
MIN_MODEL_BYTES = 4 << 20
#: seconds per timing phase (alone, then rotating)
CONTEXT_TIME_CAP = 0.5
#: the ``tensor`` of a constants record and of an output-memory record; the number is the design's version:
#: records of another one are not read as in-context costs
CONTEXT_TENSOR = CONTEXT_PREFIX + "rotation/2"
OUTPUTS_TENSOR = CONTEXT_PREFIX + "outputs/1"
#: output bytes the output-memory cost is measured at (a Relu on [1, n]): 64 KiB, 256 KiB, 1 MiB, 4 MiB
OUTPUT_SIZES = (65536, 262144, 1048576, 4194304)


def copies_for(nbytes: int) -> int:
    """How many compiled copies a rotation at ``nbytes`` of constants uses."""
    if nbytes <= 0:
        return CALL_COPIES
    return max(MIN_COPIES, min(MAX_COPIES, math.ceil(ROTATION_BYTES / nbytes)))


def context_key(backend, nbytes: int) -> BoundaryKey:
    return BoundaryKey(backend.name, backend.version, backend.name, backend.version, int(nbytes), CONTEXT_TENSOR)


def is_context(key: BoundaryKey) -> bool:
    return key.tensor in (CONTEXT_TENSOR, OUTPUTS_TENSOR)


def outputs_key(backend, nbytes: int) -> BoundaryKey:
    return BoundaryKey(backend.name, backend.version, backend.name, backend.version, int(nbytes), OUTPUTS_TENSOR)


def _graph(nbytes: int, seed: int, numel: int = 256):
    from onnx import TensorProto, helper, numpy_helper

    from collage_ml.ir.importers import from_onnx

    if nbytes <= 0:
        n = numel
        nodes, inits = [helper.make_node("Relu", ["x"], ["y"])], []
    else:
        n = int(round(math.sqrt(nbytes / 4)))
        w = (np.random.default_rng(seed).standard_normal((n, n)) / math.sqrt(n)).astype(np.float32)
        nodes, inits = [helper.make_node("MatMul", ["x", "W"], ["y"])], [numpy_helper.from_array(w, "W")]
    g = helper.make_graph(nodes, "context", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), name=f"context{seed}"), n


@dataclass
class ContextTask:
    """Times ``copies`` compiled copies of one subgraph alone and round-robin, in a worker."""

    backend: tuple[str, str, dict]
    nbytes: int
    threads: int
    copies: int
    timing: TimingConfig = field(default_factory=TimingConfig)

    def execute(self) -> dict:
        from collage_ml.backends.base import to_numpy
        from collage_ml.measure.tasks import build_backend
        from collage_ml.measure.timing import time_callable

        try:
            b = build_backend(self.backend)
            exes, n = [], 256
            t0 = time.perf_counter()
            for k in range(self.copies):
                if k >= MIN_COPIES and time.perf_counter() - t0 > COMPILE_BUDGET:
                    break  # a slow compiler (Inductor): the rotation makes do, and says how many it had
                g, n = _graph(self.nbytes, seed=k)
                exe = b.compile(g.whole(), threads=self.threads)
                exes.append((exe, g))
            x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
            for exe, g in exes[:2]:
                want = g.reference({"x": x})["y"]
                if not np.allclose(to_numpy(exe(x)[0]), want, rtol=1e-3, atol=1e-4):
                    return {"valid": False, "error_text": "wrong numbers from a copy"}
            calls = [e for e, _ in exes]
            first = [calls[0]] * len(calls)

            def run(seq):
                return lambda: [f(x) for f in seq]

            alone = time_callable(run(first), self.timing)
            rot = time_callable(run(calls), self.timing)
            k = len(calls)
            cost = (rot.median - alone.median) / k
            return {
                "valid": True, "samples": [s / k for s in rot.samples], "median": max(cost, 0.0), "spread": rot.spread,
                "extra": {"alone": alone.median / k, "rotating": rot.median / k, "copies": k, "raw": cost},
            }
        except Exception as e:
            return {"valid": False, "error_text": describe(e)}



@dataclass
class OutputsTask:
    """Times a Relu of ``nbytes`` as the protocol times a candidate (each output dropped before the next call,
    so every call writes the same memory) and with a ring of its last outputs kept alive, as a plan keeps
    its intermediates; the cost is the difference per call."""

    backend: tuple[str, str, dict]
    nbytes: int
    threads: int
    timing: TimingConfig = field(default_factory=TimingConfig)

    def execute(self) -> dict:
        from collections import deque

        from collage_ml.backends.base import to_numpy
        from collage_ml.measure.tasks import build_backend
        from collage_ml.measure.timing import time_callable

        try:
            n = max(1, self.nbytes // 4)
            g, _ = _graph(0, 0, numel=n)
            exe = build_backend(self.backend).compile(g.whole(), threads=self.threads)
            x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
            if not np.array_equal(to_numpy(exe(x)[0]), np.maximum(x, 0)):
                return {"valid": False, "error_text": "wrong numbers from the Relu"}
            ring: deque = deque(maxlen=max(MIN_COPIES, min(64, math.ceil(ROTATION_BYTES / max(self.nbytes, 1)))))
            dropped = time_callable(lambda: exe(x), self.timing)
            kept = time_callable(lambda: ring.append(exe(x)), self.timing)
            cost = kept.median - dropped.median
            return {"valid": True, "samples": kept.samples, "median": max(cost, 0.0), "spread": kept.spread,
                    "extra": {"dropped": dropped.median, "kept": kept.median, "ring": ring.maxlen, "raw": cost}}
        except Exception as e:
            return {"valid": False, "error_text": describe(e)}


def context_tasks(backend, threads: int, timing: TimingConfig, sizes: Iterable[int] = CONTEXT_SIZES,
                  output_sizes: Iterable[int] = OUTPUT_SIZES) -> list[tuple[BoundaryKey, object]]:
    """(record key, task) for each of ``backend``'s in-context costs: constants at every size in ``sizes``,
    output memory at every size in ``output_sizes``."""
    spec = backend.spec()
    return ([(context_key(backend, n), ContextTask(spec, int(n), threads, copies_for(n), timing)) for n in sizes]
            + [(outputs_key(backend, n), OutputsTask(spec, int(n), threads, timing)) for n in output_sizes])


def measure_context(runner, backends: Sequence, sizes: Iterable[int] = CONTEXT_SIZES,
                    cached_only: bool = False, output_sizes: Iterable[int] = OUTPUT_SIZES,
                    say: Callable[[str], None] | None = None) -> list[BoundaryCost]:
    """Measures (or reads from the runner's database) every backend's in-context costs (:func:`context_tasks`),
    committing each new one; ``cached_only`` reads the database only. ``say`` hears a line for each backend
    before its first new measurement."""
    timing = replace(runner.timing, time_cap=min(runner.timing.time_cap, CONTEXT_TIME_CAP))
    sizes, output_sizes = tuple(sizes), tuple(output_sizes)
    out = []
    for b in backends:
        announced = False
        for key, task in context_tasks(b, runner.threads, timing, sizes, output_sizes):
            cached = _stored(runner, key)
            if cached is not None:
                out.append(cached)
            elif not cached_only:
                if say is not None and not announced:
                    say(f"measuring what a partition pays inside a plan on {b.name} (once per machine)")
                    announced = True
                out.append(run_record(runner, key, [b], task))
    return out


class ContextTable:
    """In-context cost lookup by (backend, constant bytes): linear in bytes, flat past the largest size."""

    def __init__(self, records: Iterable[BoundaryCost] = ()):
        self.points: dict[str, list[tuple[int, float]]] = {}  # constants
        self.outputs: dict[str, list[tuple[int, float]]] = {}  # output memory
        self.add(records)

    def add(self, records: Iterable[BoundaryCost]) -> None:
        for r in records:
            if not isinstance(r, BoundaryCost) or not is_context(r.key) or not r.valid or r.median is None:
                continue
            into = self.points if r.key.tensor == CONTEXT_TENSOR else self.outputs
            into.setdefault(r.key.first, []).append((int(r.key.nbytes), float(r.median)))
        for d in (self.points, self.outputs):
            for v in d.values():
                v.sort()

    def __bool__(self) -> bool:
        return bool(self.points or self.outputs)

    def output_seconds(self, backend: str, nbytes: int) -> float:
        """Seconds a partition of ``backend`` pays in a plan for writing ``nbytes`` of outputs to memory the cache
        does not hold: linear in bytes from 0, flat past the largest size (where an output leaves the cache even
        when the protocol reuses its memory); 0 if never measured."""
        pts = self.outputs.get(backend)
        if not pts or nbytes <= 0:
            return 0.0
        return float(np.interp(nbytes, [0] + [p[0] for p in pts], [0.0] + [p[1] for p in pts]))

    def seconds(self, backend: str, nbytes: int) -> float:
        """Seconds a partition of ``backend`` with ``nbytes`` of constants pays in a plan; 0 if never measured."""
        pts = self.points.get(backend)
        if not pts:
            return 0.0
        return float(np.interp(max(int(nbytes), 0), [p[0] for p in pts], [p[1] for p in pts]))

    def partition_seconds(self, graph, backend: str, sg) -> float:
        """What a partition ``sg`` of ``graph`` on ``backend`` pays in a plan: 0 for the whole model, which was
        timed in context already, and for every partition of a model with under :data:`MIN_MODEL_BYTES` of
        constants."""
        return self._charge(graph, backend, sg) if self.charges(graph) else 0.0

    def _charge(self, graph, backend: str, sg) -> float:
        if sg.mask == graph.all_mask:
            return 0.0
        return (self.seconds(backend, sum(graph.tensors[t].nbytes for t in sg.constants))
                + self.output_seconds(backend, sum(graph.tensors[t].nbytes for t in sg.outputs)))

    @staticmethod
    def charges(graph) -> bool:
        return graph.param_bytes() >= MIN_MODEL_BYTES

    def overhead(self, graph) -> Callable:
        """The DP's per-candidate overhead for ``graph`` (:meth:`partition_seconds`; the model's size is
        checked once, not per candidate)."""
        if not self.charges(graph):
            return lambda c: 0.0
        return lambda c: self._charge(graph, c.backend.name, c.subgraph)

    def describe(self) -> list[str]:
        """One line per backend: the in-context cost at each size measured, in µs."""
        def part(pts, what):
            return [f"{n // 1024} KiB of {what} +{c * 1e6:.1f} us" for n, c in pts]

        return [f"in context, {b}: " + ", ".join(part(self.points.get(b, []), "constants")
                                                  + part(self.outputs.get(b, []), "outputs"))
                for b in sorted(set(self.points) | set(self.outputs))]

    def rows(self) -> list[dict]:
        """Per backend: µs at each size of constants (``<KiB>KiB_us``) and of outputs (``out<KiB>KiB_us``)."""
        return [{"backend": b, **{f"{n // 1024}KiB_us": round(c * 1e6, 2) for n, c in self.points.get(b, [])},
                 **{f"out{n // 1024}KiB_us": round(c * 1e6, 2) for n, c in self.outputs.get(b, [])}}
                for b in sorted(set(self.points) | set(self.outputs))]
