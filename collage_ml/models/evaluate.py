"""How good is a cost model at what the placement search asks of it?

The search never needs a latency for its own sake: it needs to *rank* the
candidates that compete for the same decision. So besides the usual accuracy
numbers this module scores rankings within the groups the search compares:

- **Decision groups.** The op-level dynamic program covers a model node by
  node in topological order; at each step the candidates that compete are the
  ones whose topologically first node is the first uncovered node.
  :func:`decision_groups` rebuilds these groups by enumerating each zoo source
  family's full-size model at batch 1 (the way ``collage-ml collect --sampler
  enumerate`` does) and mapping every (subgraph hash, backend) to the first
  node of each place it occurs.

  Caveat: the candidates of one group cover *different* node sets (a 1-node
  op and a 3-node region starting at the same node), and the DP compares
  ``cost(candidate) + best(rest)``, not the candidate costs alone. These
  metrics compare the candidate latencies as the model predicts them, i.e. the
  term of the DP's sum that the cost model is responsible for; a perfect
  ranking here is necessary for a perfect DP decision, not sufficient.
- **Backend groups.** The same subgraph (hash) measured on two or more
  backends: which backend should run it. This is the cleanest comparison
  (same work, different backend).

:func:`evaluate` returns, as fractions (not percentages):

``n``, ``mape`` (mean ``|pred / true - 1|``), ``within_10pct``,
``kendall_tau`` (mean over decision groups of Kendall's tau-b within the
group), ``pairwise_accuracy`` (over every pair within a decision group whose
true latencies differ, the fraction the prediction orders the same way; a
predicted tie counts one half), ``top1_regret`` (mean over groups of the true
latency of the predicted-fastest candidate over the truly fastest, minus 1),
``backend_pairwise_accuracy`` and ``backend_choice_regret`` (the same over
backend groups), ``n_groups``, ``n_backend_groups`` and ``ungrouped`` (samples
in no decision group: random subgraphs, other batch sizes, and sources that
are not zoo families and cannot be rebuilt).

:func:`leave_one_family_out` and :func:`few_shot` are the two protocols the
benchmark (``benchmarks/cost_model.py``) reports.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from collage_ml.models.dataset import Dataset, Sample

#: the metrics :func:`evaluate` reports, in display order
METRICS: tuple[str, ...] = (
    "pairwise_accuracy",
    "kendall_tau",
    "top1_regret",
    "backend_pairwise_accuracy",
    "backend_choice_regret",
    "mape",
    "within_10pct",
)
#: metrics where larger is better (the rest: smaller is better)
HIGHER_IS_BETTER = frozenset({"pairwise_accuracy", "kendall_tau", "backend_pairwise_accuracy", "within_10pct"})


# ----------------------------------------------------------------------------- decision groups
@dataclass
class DecisionGroups:
    """Index arrays into one dataset's samples; see :func:`decision_groups`."""

    groups: list[np.ndarray] = field(default_factory=list)
    labels: list[tuple[str, str, int]] = field(default_factory=list)  # (hardware, family, first node)
    ungrouped: int = 0  # samples in no group
    unrebuilt: dict[str, int] = field(default_factory=dict)  # source that is no zoo family -> samples
    n: int = 0  # samples of the dataset the indices refer to

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self):
        return iter(self.groups)


# (model name, max_region_size, backends) -> first node -> [(hash, backend)]
_ENUM_CACHE: dict[tuple[str, int | None, tuple[str, ...]], dict[int, list[tuple[str, str]]]] = {}


def _zoo_families() -> set[str]:
    from collage_ml.ir import zoo

    return {e.family for e in zoo.entries(include_tiny=False)}


def _enumeration(model: str, max_region_size: int | None, backends: tuple[str, ...]) -> dict[int, list[tuple[str, str]]]:
    key = (model, max_region_size, backends)
    hit = _ENUM_CACHE.get(key)
    if hit is not None:
        return hit
    from collage_ml.backends import get_backend
    from collage_ml.candidates import enumerate_candidates
    from collage_ml.errors import CollageError
    from collage_ml.ir.importers import import_model

    bs = []
    for name in backends:
        try:
            bs.append(get_backend(name))  # patterns need no installed backend: no require()
        except CollageError:
            continue  # a backend this install does not know cannot be rebuilt
    graph = import_model(model, batch=1)
    by_node: dict[int, list[tuple[str, str]]] = {}
    seen: set[tuple[int, str]] = set()
    for c in enumerate_candidates(graph, bs, max_region_size):
        mask = c.subgraph.mask
        if (mask, c.backend.name) in seen:
            continue
        seen.add((mask, c.backend.name))
        first = (mask & -mask).bit_length() - 1  # lowest set bit: the topologically first node
        by_node.setdefault(first, []).append((c.subgraph.hash, c.backend.name))
    _ENUM_CACHE[key] = by_node
    return by_node


def decision_groups(
    dataset: Dataset | Sequence[Sample],
    max_region_size: int | None = 3,
    backends: Iterable[str] | None = None,
    models: Mapping[str, str] | None = None,
) -> DecisionGroups:
    """The decision groups of ``dataset`` (see the module docstring).

    Each zoo source family's full-size model is enumerated at batch 1 over
    ``backends`` (default: the backends present in the data) with region
    patterns bounded by ``max_region_size`` (3 is what the shipped datasets
    used). A group is (hardware, family, first node) -> the dataset's samples
    with those (hash, backend) keys, one sample per key; groups with fewer than
    two samples are dropped, and so are exact duplicates within a family (a
    block repeated in a model, like BERT's layers, is one decision, scored once).

    ``models`` maps a source family to the zoo model to rebuild it from
    (default: the family's full-size model; tests use ``-tiny`` ones).
    Sources that are no zoo family (and not in ``models``) are counted in
    ``unrebuilt``. Enumerations are cached in-process.

    Rows that recorded their decision (``Sample.decision``: the source graph's hash and the candidate's
    first node, stored by the Runner since protocol m2) are grouped by it directly, from any model, zoo or
    not, and are not rebuilt.
    """
    samples = list(dataset)
    names = tuple(sorted({s.backend for s in samples} if backends is None else set(backends)))
    models = dict(models or {})
    zoo_fams = _zoo_families()
    index: dict[tuple[str, str, str], int] = {}  # (hardware, hash, backend) -> first sample
    hardware: list[str] = []
    sources: dict[str, int] = {}
    out = DecisionGroups(n=len(samples))
    grouped = np.zeros(len(samples), dtype=bool)
    # rows that recorded their decision (source graph hash, first node) group by it, whatever model they came from
    recorded: dict[tuple, dict[tuple[str, str], int]] = {}
    for i, s in enumerate(samples):
        if s.decision is not None:
            recorded.setdefault((s.hardware, *s.decision), {}).setdefault((s.info.hash, s.backend), i)
    seen_rec: set[tuple[int, ...]] = set()
    for (hw, src_hash, node), members in sorted(recorded.items()):
        idx = sorted(members.values())
        if len(idx) < 2:
            continue
        # a block repeated in a model is one decision: same (hash, backend) sets are scored once
        sig = (hw, src_hash, tuple(sorted(members)))
        if sig in seen_rec:
            continue
        seen_rec.add(sig)
        arr = np.array(idx, dtype=np.int64)
        out.groups.append(arr)
        out.labels.append((hw, samples[idx[0]].source, node))
        grouped[arr] = True
    for i, s in enumerate(samples):
        if s.decision is not None:
            continue
        k = (s.hardware, s.info.hash, s.backend)
        if k not in index:
            index[k] = i
        if s.hardware not in hardware:
            hardware.append(s.hardware)
        sources[s.source] = sources.get(s.source, 0) + 1
    rebuild = []
    for src in sorted(sources):
        if src in models:
            rebuild.append((src, models[src]))
        elif src in zoo_fams:
            rebuild.append((src, src))
        else:
            out.unrebuilt[src] = sources[src]
    for family, model in rebuild:
        by_node = _enumeration(model, max_region_size, names)
        for hw in hardware:
            seen: set[tuple[int, ...]] = set()
            for node in sorted(by_node):
                idx = sorted({index[(hw, h, b)] for h, b in by_node[node] if (hw, h, b) in index})
                if len(idx) < 2 or tuple(idx) in seen:
                    continue
                seen.add(tuple(idx))
                arr = np.array(idx, dtype=np.int64)
                out.groups.append(arr)
                out.labels.append((hw, family, node))
                grouped[arr] = True
    out.ungrouped = int((~grouped).sum())
    return out


def backend_groups(dataset: Dataset | Sequence[Sample]) -> list[np.ndarray]:
    """Index arrays: one per (hardware, subgraph hash) measured on two or more backends (one sample each)."""
    by: dict[tuple[str, str], dict[str, int]] = {}
    for i, s in enumerate(dataset):
        by.setdefault((s.hardware, s.info.hash), {}).setdefault(s.backend, i)
    return [np.array(sorted(d.values()), dtype=np.int64) for d in by.values() if len(d) >= 2]


# ----------------------------------------------------------------------------- metrics
def _pair_signs(a: np.ndarray) -> np.ndarray:
    """sign(a_i - a_j) for i < j, flattened."""
    d = np.sign(np.subtract.outer(a, a))
    iu = np.triu_indices(len(a), 1)
    return d[iu]


def ranking_metrics(true: np.ndarray, pred: np.ndarray, groups: Iterable[np.ndarray]) -> dict[str, Any]:
    """pairwise accuracy, mean Kendall tau-b and mean top-1 regret over ``groups`` (index arrays).

    Returns NaN for a metric no group could score.
    """
    true = np.asarray(true, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    pairs = 0
    score = 0.0
    taus: list[float] = []
    regrets: list[float] = []
    n = 0
    for g in groups:
        if len(g) < 2:
            continue
        n += 1
        t, p = true[g], pred[g]
        st, sp = _pair_signs(t), _pair_signs(p)
        valid = st != 0
        pairs += int(valid.sum())
        agree = st[valid] * sp[valid]
        score += float((agree > 0).sum()) + 0.5 * float((agree == 0).sum())
        denom = math.sqrt(float(valid.sum()) * float((sp != 0).sum()))
        if denom > 0:
            taus.append(float((st * sp).sum()) / denom)
        best = float(t.min())
        if best > 0:
            regrets.append(float(t[int(np.argmin(p))]) / best - 1.0)
    return {
        "pairwise_accuracy": score / pairs if pairs else math.nan,
        "kendall_tau": float(np.mean(taus)) if taus else math.nan,
        "top1_regret": float(np.mean(regrets)) if regrets else math.nan,
        "groups": n,
        "pairs": pairs,
    }


def metrics_from_predictions(
    true: np.ndarray,
    pred: np.ndarray,
    groups: Iterable[np.ndarray] = (),
    backend_groups_: Iterable[np.ndarray] = (),
) -> dict[str, Any]:
    """Every metric of :func:`evaluate` from latencies (seconds), given the groups as index arrays."""
    true = np.asarray(true, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    if true.shape != pred.shape:
        raise ValueError(f"{len(true)} true latencies but {len(pred)} predictions")
    n = len(true)
    ape = np.abs(pred / true - 1.0) if n else np.zeros(0)
    dec = ranking_metrics(true, pred, groups)
    be = ranking_metrics(true, pred, backend_groups_)
    return {
        "n": n,
        "mape": float(ape.mean()) if n else math.nan,
        "within_10pct": float((ape <= 0.10).mean()) if n else math.nan,
        "kendall_tau": dec["kendall_tau"],
        "pairwise_accuracy": dec["pairwise_accuracy"],
        "top1_regret": dec["top1_regret"],
        "backend_pairwise_accuracy": be["pairwise_accuracy"],
        "backend_choice_regret": be["top1_regret"],
        "n_groups": dec["groups"],
        "n_pairs": dec["pairs"],
        "n_backend_groups": be["groups"],
    }


def evaluate_predictions(
    dataset: Dataset | Sequence[Sample], pred: np.ndarray, groups: DecisionGroups | None = None, **group_kw: Any
) -> dict[str, Any]:
    """:func:`evaluate` for predictions made already (latency seconds, one per sample)."""
    samples = list(dataset)
    if groups is None:
        groups = decision_groups(samples, **group_kw)
    elif groups.n != len(samples):
        raise ValueError(f"the decision groups index {groups.n} samples, the dataset has {len(samples)}")
    true = np.array([s.latency for s in samples], dtype=np.float64)
    out = metrics_from_predictions(true, pred, groups.groups, backend_groups(samples))
    out["ungrouped"] = groups.ungrouped
    return out


def evaluate(model: Any, dataset: Dataset | Sequence[Sample], groups: DecisionGroups | None = None, **group_kw: Any) -> dict[str, Any]:
    """The metrics of ``model`` (a :class:`~collage_ml.models.base.CostModel`) on ``dataset`` (module docstring).

    ``groups`` defaults to :func:`decision_groups` of ``dataset`` (``group_kw``
    is passed on). Every sample is predicted for its own hardware descriptor.
    """
    samples = list(dataset)
    if not samples:
        raise ValueError("cannot evaluate on an empty dataset")
    pred, _ = model.predict(samples)
    return evaluate_predictions(samples, np.asarray(pred, dtype=np.float64), groups, **group_kw)


def average_metrics(per_family: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Unweighted mean over families of every numeric metric (NaNs left out); counts are summed."""
    out: dict[str, Any] = {"families": len(per_family)}
    keys: list[str] = []
    for m in per_family.values():
        keys += [k for k in m if k not in keys]
    for k in keys:
        vals = [m.get(k) for m in per_family.values()]
        nums = [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not nums:
            continue
        if k in ("n", "n_groups", "n_pairs", "n_backend_groups", "ungrouped", "n_train"):
            out[k] = int(sum(nums))
        else:
            finite = [v for v in nums if math.isfinite(v)]
            out[k] = float(np.mean(finite)) if finite else math.nan
    return out


# ----------------------------------------------------------------------------- protocols
def leave_one_family_out(
    make_model: Callable[[], Any],
    dataset: Dataset,
    families: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    predictions: dict[str, dict[str, Any]] | None = None,
    **group_kw: Any,
) -> dict[str, dict[str, Any]]:
    """For each family: fit ``make_model()`` on every other source, evaluate on that family's samples.

    ``families`` defaults to every source of ``dataset``. Each family's metrics
    gain ``n_train`` and ``fit_seconds``. ``predictions``, when given, is
    filled with family -> ``{"backend", "true", "pred"}`` arrays (for plots).
    ``progress`` receives one line per step.
    """
    fams = list(families) if families is not None else dataset.sources()
    known = set(dataset.sources())
    unknown = [f for f in fams if f not in known]
    if unknown:
        raise ValueError(f"unknown families {', '.join(unknown)}; the dataset has {', '.join(sorted(known))}")
    out: dict[str, dict[str, Any]] = {}
    for i, fam in enumerate(fams):
        train, test = dataset.split_by_source([fam])
        if not len(train) or not len(test):
            continue
        if progress:
            progress(f"[{i + 1}/{len(fams)}] {fam}: training on {len(train)} samples, testing on {len(test)}")
        model = make_model()
        t0 = time.perf_counter()
        model.fit(train)
        fit_s = time.perf_counter() - t0
        pred, _ = model.predict(test.samples)
        pred = np.asarray(pred, dtype=np.float64)
        m = evaluate_predictions(test, pred, **group_kw)
        m["n_train"] = len(train)
        m["fit_seconds"] = fit_s
        out[fam] = m
        if predictions is not None:
            predictions[fam] = {
                "backend": [s.backend for s in test],
                "true": test.latencies(),
                "pred": pred,
            }
    return out


def few_shot(
    model: Any,
    target: Dataset,
    ns: Sequence[int] = (10, 50, 200),
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    **group_kw: Any,
) -> dict[int, dict[str, Any]]:
    """Transfer ``model`` (trained on the source data, or a zero-argument factory of one) to ``target``.

    A pool of ``max(ns)`` samples of ``target`` is drawn (seeded, by whole
    subgraphs: all backends of a subgraph fall on the same side, so the test
    holds only subgraphs never updated on), then shuffled; for each N a fresh
    copy of the model (saved and loaded through a temporary directory) is
    ``update()``-d with the pool's first N samples and evaluated on the rest of
    ``target``, the same held-out rest for every N. N = 0 (no update) is always
    reported. Returns N -> metrics (plus ``n_update``, ``update`` (what
    ``update`` returned) and ``update_seconds``).
    """
    from collage_ml.models.base import CostModel, load_model

    base = model if isinstance(model, CostModel) or not callable(model) else model()
    ns = sorted({int(n) for n in ns if int(n) > 0})
    hashes = sorted({s.info.hash for s in target})
    rng = random.Random(seed)
    rng.shuffle(hashes)
    by_hash: dict[str, list[Sample]] = {}
    for s in target:
        by_hash.setdefault(s.info.hash, []).append(s)
    pool: list[Sample] = []
    need = max(ns) if ns else 0
    used = 0
    for h in hashes:
        if len(pool) >= need:
            break
        group = by_hash[h]
        rng.shuffle(group)
        pool += group
        used += 1
    rng.shuffle(pool)  # the first N span many subgraphs, not all backends of a few
    test = Dataset([s for h in hashes[used:] for s in by_hash[h]])
    if not len(test):
        raise ValueError(f"the target dataset ({len(target)} samples) leaves nothing to test after {need} updates")
    groups = decision_groups(test, **group_kw)
    out: dict[int, dict[str, Any]] = {}
    m = evaluate(base, test, groups)
    m.update(n_update=0, update=None, update_seconds=0.0)
    out[0] = m
    with tempfile.TemporaryDirectory(prefix="collage-few-shot-") as tmp:
        saved = base.save(Path(tmp) / "base")
        for n in ns:
            if progress:
                progress(f"few-shot: updating on {n} samples, testing on {len(test)}")
            copy = load_model(saved)
            t0 = time.perf_counter()
            info = copy.update(Dataset(pool[:n]))
            dt = time.perf_counter() - t0
            m = evaluate(copy, test, groups)
            m.update(n_update=min(n, len(pool)), update=info, update_seconds=dt)
            out[n] = m
    return out


#: short column labels for the metrics in tables
METRIC_LABELS = {
    "pairwise_accuracy": "pairwise",
    "kendall_tau": "tau",
    "top1_regret": "top-1 regret",
    "backend_pairwise_accuracy": "backend pairwise",
    "backend_choice_regret": "backend regret",
    "mape": "MAPE",
    "within_10pct": "within 10%",
}


def format_metric(name: str, value: Any) -> str:
    """A metric for a table: fractions as percentages, tau with 3 decimals, counts as integers."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    if name in ("kendall_tau",):
        return f"{value:.3f}"
    if name in METRICS:
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def json_safe(o: Any) -> Any:
    """Metrics as JSON-safe values: NaN and infinities become null, arrays lists, keys strings."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {str(k): json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    if hasattr(o, "tolist"):
        return json_safe(o.tolist())
    return o


__all__ = [
    "DecisionGroups",
    "HIGHER_IS_BETTER",
    "METRICS",
    "average_metrics",
    "backend_groups",
    "decision_groups",
    "evaluate",
    "evaluate_predictions",
    "few_shot",
    "format_metric",
    "json_safe",
    "leave_one_family_out",
    "metrics_from_predictions",
    "ranking_metrics",
]
