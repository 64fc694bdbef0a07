"""Boundary costs: what a hand-off between two partitions costs, per ordered backend pair.

Measured in *executed chains*, as DESIGN.md asks: a tensor of ``nbytes``
goes through a one-node partition on backend A, is handed to a one-node
partition on backend B, and the pair is called back to back. The boundary
cost is the chain's median minus the medians of A and B timed alone:
dispatch, any copy, and the threads of one runtime still spinning (or already
asleep) when the other starts. Same-backend pairs (A->A) give the cost of
cutting one session into two.

Results are :class:`~collage_ml.measure.records.BoundaryCost` records, stored
in the database's ``boundaries`` table, keyed by the ordered backend pair (names
and versions), the tensor's bytes and descriptor (``float32[1,256]``), the
hardware fingerprint and the protocol; never as fake candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from collage_ml.cost import Measurement
from collage_ml.errors import describe
from collage_ml.measure.records import BoundaryCost, boundary_from_legacy, boundary_key

#: how the ``tensor`` of an in-context record (:mod:`collage_ml.measure.context`), which shares the table, begins
CONTEXT_PREFIX = "context:"
from collage_ml.measure.timing import TimingConfig

#: tensor sizes the table is measured at (float32 elements): 1 KiB, 64 KiB, 1 MiB, 4 MiB
SIZES = (256, 16384, 262144, 1048576)
#: seconds per timing phase (each side alone, then the chain): the table has 4 sizes per backend pair
BOUNDARY_TIME_CAP = 0.5


def _chain_graph(numel: int):
    from onnx import TensorProto, helper

    from collage_ml.ir.importers import from_onnx

    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    g = helper.make_graph(
        nodes, "boundary",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, numel])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, numel])],
    )
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), name="boundary")


@dataclass
class BoundaryTask:
    first: tuple[str, str, dict]
    second: tuple[str, str, dict]
    numel: int
    threads: int
    timing: TimingConfig = field(default_factory=TimingConfig)

    def execute(self) -> dict:
        from collage_ml.backends.base import to_numpy
        from collage_ml.measure.tasks import build_backend
        from collage_ml.measure.timing import time_callable

        try:
            g = _chain_graph(self.numel)
            a = build_backend(self.first).compile(g.subgraph([0]), threads=self.threads)
            b = build_backend(self.second).compile(g.subgraph([1]), threads=self.threads)
            x = np.random.default_rng(0).standard_normal((1, self.numel)).astype(np.float32)
            h = a(x)[0]
            if not np.allclose(to_numpy(b(h)[0]), np.maximum(x, 0)):
                return {"valid": False, "error_text": "wrong numbers across the hand-off"}
            # one backend per phase first (each alone), then the chain
            ta = time_callable(lambda: a(x), self.timing)
            tb = time_callable(lambda: b(h), self.timing)
            tc = time_callable(lambda: b(a(x)[0]), self.timing)
            cost = tc.median - ta.median - tb.median
            return {
                "valid": True, "samples": tc.samples, "median": max(cost, 0.0), "spread": tc.spread,
                "extra": {"chain": tc.median, "first": ta.median, "second": tb.median, "raw": cost},
            }
        except Exception as e:
            return {"valid": False, "error_text": describe(e)}


def _stored(runner, key) -> BoundaryCost | None:
    """The runner's database's boundary cost of ``key`` on its hardware and protocol, unless it is to be retried."""
    if runner.db is None:
        return None
    b = runner.db.get_boundary(key, runner.hardware, runner.timing.name)
    return None if b is None or b.retryable else b


def measure_boundaries(
    runner, backends: Sequence, sizes: Iterable[int] = SIZES, pairs: Iterable[tuple] | None = None,
    cached_only: bool = False,
) -> list[BoundaryCost]:
    """Measures (or reads from the runner's DB) the boundary cost of every ordered backend pair, at every
    size in ``sizes`` (float32 elements), and commits each new one to the DB's ``boundaries`` table.

    ``pairs`` restricts it to those (first, second) backend pairs; ``cached_only`` reads the DB only.
    """
    out = []
    sizes = tuple(sizes)
    todo = list(pairs) if pairs is not None else [(a, b) for a in backends for b in backends]
    for a, b in todo:
        for numel in sizes:
            key = boundary_key(a, b, numel)
            cached = _stored(runner, key)
            if cached is not None:
                out.append(cached)
                continue
            if cached_only:
                continue
            timing = replace(runner.timing, time_cap=min(runner.timing.time_cap, BOUNDARY_TIME_CAP))
            out.append(run_record(runner, key, [a, b], BoundaryTask(a.spec(), b.spec(), numel, runner.threads, timing)))
    return out


def run_record(runner, key, backends: Sequence, task) -> BoundaryCost:
    """Runs ``task`` in a worker of ``backends`` and commits its result as the record of ``key`` (boundary
    costs and in-context costs alike)."""
    r = runner.worker_for(list(backends)).run(task, runner.timeout)
    rec = BoundaryCost(
        key=key, hardware=runner.hardware, valid=bool(r.get("valid")), samples=list(r.get("samples", [])),
        median=r.get("median"), spread=r.get("spread"), threads=runner.threads,
        versions={k: v for b in backends for k, v in b.versions().items()}, error_text=r.get("error_text", ""),
        extra=r.get("extra", {}), failed=bool(r.get("failed")), protocol=runner.timing.name,
    )
    if runner.db is not None:
        runner.db.commit_boundary(rec)
    return rec


class BoundaryTable:
    """Boundary cost lookup by (first backend, second backend, bytes), interpolated in log-size."""

    def __init__(self, records: Iterable[BoundaryCost | Measurement] = ()):
        self.points: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.add(records)

    def add(self, records: Iterable[BoundaryCost | Measurement]) -> None:
        """Adds boundary costs (invalid ones, and in-context costs of :mod:`collage_ml.measure.context`, are
        ignored). A :class:`Measurement` in the old shape of a boundary cost (``boundary:<nbytes>``) counts as one;
        any other measurement is ignored."""
        for r in records:
            b = boundary_from_legacy(r) if isinstance(r, Measurement) else r
            if b is None or not b.valid or b.median is None or b.key.tensor.startswith(CONTEXT_PREFIX):
                continue
            self.points.setdefault(b.key.pair, []).append((int(b.key.nbytes), float(b.median)))
        for v in self.points.values():
            v.sort()

    def cost(self, first: str, second: str, nbytes: int) -> float | None:
        """Seconds, or None when the pair was never measured."""
        pts = self.points.get((first, second))
        if not pts:
            return None
        xs = [math.log(max(p[0], 1)) for p in pts]
        ys = [p[1] for p in pts]
        return float(np.interp(math.log(max(nbytes, 1)), xs, ys))

    def seconds(self, first: str, second: str, nbytes: int) -> float:
        """:meth:`cost`, with 0 for a pair never measured: the search's boundary function."""
        v = self.cost(first, second, nbytes)
        return 0.0 if v is None else v

    def rows(self) -> list[dict]:
        return [
            {"from": a, "to": b, **{f"{n // 1024}KiB_us": round(c * 1e6, 2) for n, c in pts}}
            for (a, b), pts in sorted(self.points.items())
        ]
