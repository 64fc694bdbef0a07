"""The metrics of a cost model's predictions: accuracy, and rankings within groups of index arrays
(:mod:`collage_ml.models.groups` builds the groups); averaging them over families, and showing them."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

#: the metrics :func:`~collage_ml.models.evaluate.evaluate` reports, in display order
METRICS: tuple[str, ...] = (
    "pairwise_accuracy",
    "pairwise_resolvable",
    "kendall_tau",
    "top1_regret",
    "backend_pairwise_accuracy",
    "backend_choice_regret",
    "mape",
    "within_10pct",
)
#: metrics where larger is better (the rest: smaller is better)
HIGHER_IS_BETTER = frozenset({"pairwise_accuracy", "pairwise_resolvable", "kendall_tau", "backend_pairwise_accuracy",
                              "within_10pct"})
#: pairs whose labels lie closer than this (a ratio) are inside the measurements' own disagreement: two
#: measurements of one candidate agree within +-10% at best (docs/results/noise.md), so such pairs' order is a coin
#: toss in the labels; ``pairwise_resolvable`` scores only the pairs further apart
RESOLVABLE = 1.10


def _pair_diffs(a: np.ndarray) -> np.ndarray:
    """a_i - a_j for i < j, flattened."""
    return np.subtract.outer(a, a)[np.triu_indices(len(a), 1)]


def _pair_signs(a: np.ndarray) -> np.ndarray:
    """sign(a_i - a_j) for i < j, flattened."""
    return np.sign(_pair_diffs(a))


def _pairs_right(agree: np.ndarray) -> float:
    """How many of the pairs whose sign products are ``agree`` the prediction orders right (a tie: one half)."""
    return float((agree > 0).sum()) + 0.5 * float((agree == 0).sum())


def ranking_metrics(true: np.ndarray, pred: np.ndarray, groups: Iterable[np.ndarray]) -> dict[str, Any]:
    """pairwise accuracy, mean Kendall tau-b and mean top-1 regret over ``groups`` (index arrays).

    ``pairwise_resolvable`` is the pairwise accuracy over the pairs whose true latencies differ by more than
    :data:`RESOLVABLE` (10%): the pairs whose order the labels can tell.

    Returns NaN for a metric no group could score.
    """
    true = np.asarray(true, dtype=np.float64)
    pred = np.asarray(pred, dtype=np.float64)
    pairs = 0
    score = 0.0
    far_pairs = 0
    far_score = 0.0
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
        score += _pairs_right(st[valid] * sp[valid])
        # log gaps of the true latencies (NaN, never far, where one is not positive)
        far = valid & (np.abs(_pair_diffs(np.log(np.where(t > 0, t, np.nan)))) > math.log(RESOLVABLE))
        far_pairs += int(far.sum())
        far_score += _pairs_right(st[far] * sp[far])
        denom = math.sqrt(float(valid.sum()) * float((sp != 0).sum()))
        if denom > 0:
            taus.append(float((st * sp).sum()) / denom)
        best = float(t.min())
        if best > 0:
            regrets.append(float(t[int(np.argmin(p))]) / best - 1.0)
    return {
        "pairwise_accuracy": score / pairs if pairs else math.nan,
        "pairwise_resolvable": far_score / far_pairs if far_pairs else math.nan,
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
    """Every metric of :func:`~collage_ml.models.evaluate.evaluate` from latencies (seconds), given the groups
    as index arrays."""
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
        "pairwise_resolvable": dec["pairwise_resolvable"],
        "top1_regret": dec["top1_regret"],
        "backend_pairwise_accuracy": be["pairwise_accuracy"],
        "backend_choice_regret": be["top1_regret"],
        "n_groups": dec["groups"],
        "n_pairs": dec["pairs"],
        "n_backend_groups": be["groups"],
    }


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


#: short column labels for the metrics in tables
METRIC_LABELS = {
    "pairwise_accuracy": "pairwise",
    "pairwise_resolvable": "pairwise, >10% apart",
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
