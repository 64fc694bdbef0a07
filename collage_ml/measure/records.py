"""Records of their own kinds: boundary (hand-off) costs and end-to-end plan timings.

A candidate :class:`~collage_ml.cost.Measurement` is keyed by what was measured:
a subgraph on a backend. These two records are not candidates, so they are not
stored as fake candidate keys; each has its own key and its own table
(``db.records``):

- :class:`BoundaryCost`: what handing a tensor from one backend to the next
  costs, keyed by the ordered backend pair (names and versions), the tensor's
  size in bytes and its descriptor (``float32[1,256]``), with the hardware
  fingerprint and the protocol (``measure.boundary`` measures it).
- :class:`PlanTiming`: a plan judged end to end, keyed by :func:`plan_hash`
  (the model's structural hash and the plan's partitions with their backends'
  names and versions), with the hardware fingerprint and the protocol. Every
  time a plan is judged (``measure.e2e.measure_plan``: the tuner's rounds and
  the graph-level search's fitness) adds one *run* to its record, so a record
  holds each worker process's median, and its ``median`` is the lowest of them
  (the protocol's minimum over processes).

Before these tables existed, boundary costs were candidate rows with subgraph
hash ``boundary:<nbytes>``, backend ``A->B`` and version ``vA|vB``
(:func:`boundary_from_legacy` reads one).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from collage_ml.cost import MAX_ATTEMPTS, PROTOCOL, Measurement

#: the subgraph-hash prefix of the boundary rows older versions stored among the candidates
LEGACY_BOUNDARY_PREFIX = "boundary:"


@dataclass(frozen=True)
class BoundaryKey:
    """What identifies a boundary cost, together with the hardware fingerprint and the protocol."""

    first: str  # the backend that produces the tensor
    first_version: str
    second: str  # the backend that consumes it
    second_version: str
    nbytes: int
    tensor: str = ""  # e.g. "float32[1,256]"

    @property
    def pair(self) -> tuple[str, str]:
        return self.first, self.second


def boundary_key(first: Any, second: Any, numel: int, dtype: str = "float32", itemsize: int = 4) -> BoundaryKey:
    """The key of handing a ``[1, numel]`` tensor from backend ``first`` to backend ``second``."""
    return BoundaryKey(first.name, first.version, second.name, second.version, int(numel) * itemsize,
                       f"{dtype}[1,{int(numel)}]")


@dataclass
class BoundaryCost:
    """One measured (or failed) hand-off on one machine: seconds over what the two sides cost alone.

    ``valid``, ``failed``, ``attempts`` and ``status`` mean what they mean for a
    :class:`~collage_ml.cost.Measurement`. ``extra`` holds the chain's and each side's medians.
    """

    key: BoundaryKey
    hardware: str
    valid: bool
    samples: list[float] = field(default_factory=list)
    median: float | None = None
    spread: float | None = None
    threads: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    error_text: str = ""
    timestamp: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    failed: bool = False
    protocol: str = PROTOCOL
    attempts: int = 1

    @property
    def status(self) -> str:
        return "valid" if self.valid else ("failed" if self.failed else "invalid")

    @property
    def retryable(self) -> bool:
        return self.status == "failed" and self.attempts < MAX_ATTEMPTS

    def to_dict(self) -> dict:
        return asdict(self)


def is_legacy_boundary(m: Measurement) -> bool:
    return m.key.subgraph_hash.startswith(LEGACY_BOUNDARY_PREFIX)


def boundary_from_legacy(m: Measurement) -> BoundaryCost | None:
    """The boundary cost a legacy ``boundary:<nbytes>`` candidate row stands for, or None if it is not one."""
    if not is_legacy_boundary(m):
        return None
    size = m.key.subgraph_hash[len(LEGACY_BOUNDARY_PREFIX):]
    first, arrow, second = m.key.backend.partition("->")
    if not (size.isdigit() and arrow and first and second):
        return None
    nbytes = int(size)
    v1, _, v2 = m.key.backend_version.partition("|")
    # the chains were [1, n] float32 tensors: the descriptor follows from the size
    tensor = f"float32[1,{nbytes // 4}]" if nbytes % 4 == 0 else ""
    return BoundaryCost(
        BoundaryKey(first, v1, second, v2, nbytes, tensor), m.hardware, m.valid, list(m.samples), m.median,
        m.spread, m.threads, dict(m.versions), m.error_text, m.timestamp, dict(m.extra), m.failed, m.protocol,
        m.attempts,
    )


# ----------------------------------------------------------------------------- plans


def plan_hash(graph_hash: str, partitions: Sequence[tuple[str, str, Sequence[int]]]) -> str:
    """A plan's key: the model's structural hash and its (backend name, backend version, nodes) partitions,
    in any order. The same cover on the same backends hashes the same, whatever the labels or costs."""
    parts = sorted((str(b), str(v), sorted(int(i) for i in nodes)) for b, v, nodes in partitions)
    data = json.dumps({"graph": graph_hash, "partitions": parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(data.encode(), digest_size=20).hexdigest()


#: per-run fields kept from a worker's result dict (``measure.e2e.PlanTask``)
_RUN_FIELDS = ("median", "spread", "samples", "compile_seconds", "max_abs_error", "partitions", "calls_per_sample",
               "pressure", "retimed", "contended", "cpus_available", "error_text", "method")


def run_from_result(result: dict, process: int, timestamp: float | None = None) -> dict:
    """One end-to-end run as a plan timing stores it: the worker's result fields, its status and process."""
    run = {k: result[k] for k in _RUN_FIELDS if k in result}
    run["status"] = "valid" if result.get("valid") else ("failed" if result.get("failed") else "invalid")
    run["process"] = int(process)
    run["timestamp"] = time.time() if timestamp is None else float(timestamp)
    return run


@dataclass
class PlanTiming:
    """Every end-to-end judgement of one plan on one machine under one protocol.

    ``plan`` is the plan as JSON data (backends by registered name), ``summary`` its shape
    (``partitions``, ``executed_partitions`` after merging, ``backends``, ``nodes`` per partition).
    ``runs`` has one dict per judgement: ``status``, ``median``, ``samples``, ``spread``, ``process``,
    ``timestamp``, ``contended``, ``error_text``, ... (:func:`run_from_result`).
    """

    plan_hash: str
    hardware: str
    protocol: str
    graph_hash: str
    model: str = ""
    plan: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    threads: int = 1
    versions: dict[str, str] = field(default_factory=dict)
    timestamp: float = field(default_factory=time.time)

    @property
    def valid_runs(self) -> list[dict]:
        return [r for r in self.runs if r.get("status") == "valid" and r.get("median") is not None]

    @property
    def valid(self) -> bool:
        return bool(self.valid_runs)

    @property
    def process_medians(self) -> list[float]:
        """Each valid run's median, in the order they were taken."""
        return [float(r["median"]) for r in self.valid_runs]

    @property
    def median(self) -> float | None:
        """The lowest of the runs' medians (seconds), or None when no run was valid."""
        ms = self.process_medians
        return min(ms) if ms else None

    @property
    def error_text(self) -> str:
        """The first failed or invalid run's error, when no run was valid."""
        if self.valid:
            return ""
        return next((str(r.get("error_text", "")) for r in self.runs if r.get("error_text")), "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(valid=self.valid, median=self.median, process_medians=self.process_medians)
        return d


def plan_timing(graph: Any, plan: Any, backends: Sequence[Any], result: dict, process: int, hardware: str,
                protocol: str, threads: int) -> PlanTiming:
    """The record of one end-to-end run of ``plan`` (its partitions on ``backends``, one per partition)."""
    graph_hash = plan.graph_hash or graph.whole().hash
    parts = [(b.name, b.version, p.nodes) for p, b in zip(plan.partitions, backends)]
    versions: dict[str, str] = {}
    for b in backends:
        try:
            versions.update(b.versions())
        except Exception:  # a version lookup never costs the record
            versions.setdefault(b.name, str(b.version))
    summary = {
        "partitions": len(plan.partitions),
        "executed_partitions": result.get("partitions"),
        "backends": sorted({p.backend for p in plan.partitions}),
        "nodes": [len(p.nodes) for p in plan.partitions],
    }
    return PlanTiming(plan_hash(graph_hash, parts), hardware, protocol, graph_hash, plan.model, plan.to_dict(),
                      summary, [run_from_result(result, process)], threads, versions)


def record_plan_timing(runner: Any, graph: Any, plan: Any, backends: Sequence[Any], result: dict,
                       process: int = 0) -> PlanTiming | None:
    """Commits one end-to-end run to the runner's database (when it has one); returns the record."""
    db = getattr(runner, "db", None)
    if db is None:
        return None
    rec = plan_timing(graph, plan, backends, result, process, runner.hardware, runner.timing.name, runner.threads)
    db.commit_plan_timing(rec)
    return rec
