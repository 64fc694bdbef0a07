"""The placement report: a typed record whose JSON keys are the report's keys.

:class:`PlaceReport` is what ``place`` returns in :class:`~collage_ml.search.tuner.PlaceResult` and sets
as the placed model's ``report``. Its fields, in order, are the JSON keys that ``collage-ml place
--report`` writes (README, "CLI"); :meth:`PlaceReport.as_dict` gives them as a plain dict. It also reads
like a mapping (``report["chosen"]``, ``report.get(...)``, ``dict(report)``, ``set(report)``), so code
written against the report dict keeps working; setting an unknown key is a ``KeyError``.

``model_saved_to`` is a key only in guided runs that reached the cost model (``cost_model`` is set).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Iterator


@dataclass(eq=False)
class PlaceReport(Mapping):
    model: str
    mode: str
    hardware: str
    threads: int
    backends: list[str]
    chosen: str  # the label of the plan that won: "op-level", "graph-level" or "all-<backend>"
    plan_latency_ms: float
    op_level_predicted_ms: float | None
    op_level_ms: float | None
    op_level_plan: dict | None  # Plan.to_dict() of the DP's plan
    fallback: str | None  # why no finer plan than one backend for the whole model exists
    import_: list[str]  # the importer's notes (JSON key "import")
    invalid_by_backend: dict[str, dict]
    systematic_failures: list[dict]
    graph_level_ms: float | None
    generations: int
    e2e_measurements: int
    baselines_ms: dict[str, float | None]  # backend -> its whole-model candidate's native latency
    baselines_e2e_ms: dict[str, float | None]  # backend -> the whole model on it, end to end
    plans_e2e_ms: dict[str, float | None]
    plan_errors: dict[str, str | None]
    speedup_vs_best_single: float | None
    measurements: int  # candidates measured and committed in this run
    probe_measurements: int  # of those, the probe set's, on a machine the database had not seen
    probe_seconds: float  # wall time of those probe runs (part of search_seconds)
    predicted_candidates: int
    pruned: int
    model_updates: int
    cost_model: str | None  # where guided mode's cost model came from; None in exhaustive mode
    guided: dict | None
    baselines_predicted_ms: dict[str, float]
    cache_hits: int
    #: backend -> {"ratio", "anchors", "age_hours"}: the drift that stale cache hits were rescaled by
    #: (``stale_after_hours``; empty when off or when no hit was stale)
    cache_drift: dict
    anchor_measurements: int  # stale hits timed again to measure that drift (not in ``measurements``)
    candidates: int
    distinct_candidates: int
    dp_states: int
    dp_limit_hit: bool
    dp_seconds: float
    search_seconds: float
    max_abs_error: float
    outputs_match: bool
    mismatch: str | None
    #: the close contest timed again head to head (``search.judging.settle_close_contest``): ``plans`` (label ->
    #: ``earlier_ms``, ``ms``) and ``seconds``; None when one plan stood alone
    head_to_head: dict | None = None
    partitions: list[dict] = field(default_factory=list)
    #: what the op-level DP charged its plan for running in context (included in ``op_level_predicted_ms``)
    dp_overhead_ms: float | None = None
    #: backend -> {"<KiB of constants>KiB_us": in-context cost}: the table the DP charged (empty: in_context off)
    in_context_us: dict = field(default_factory=dict)
    model_saved_to: str | None = None

    # -- the JSON form ---------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """The report as the JSON object it has always been (keys in this order)."""
        return {k: getattr(self, _attr(k)) for k in self}

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.as_dict(), **kw)

    # -- read (and set) like the report dict -------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        for f in fields(self):
            if f.name == "model_saved_to" and self.cost_model is None:
                continue
            yield _key(f.name)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, key: str) -> Any:
        if key not in _KEYS or (key == "model_saved_to" and self.cost_model is None):
            raise KeyError(key)
        return getattr(self, _attr(key))

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in _KEYS:
            raise KeyError(f"{key!r} is not a field of the placement report")
        setattr(self, _attr(key), value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable)


def _key(name: str) -> str:
    return "import" if name == "import_" else name


def _attr(key: str) -> str:
    return "import_" if key == "import" else key


_KEYS = frozenset(_key(f.name) for f in fields(PlaceReport))
