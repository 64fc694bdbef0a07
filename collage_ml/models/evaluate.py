"""How good is a cost model at what the placement search asks of it?

The search never needs a latency for its own sake: it needs to *rank* the
candidates that compete for the same decision. So besides the usual accuracy
numbers this module scores rankings within the groups the search compares:

- **Decision groups**: the candidates the op-level dynamic program compares
  at one step (the ones whose topologically first node is the first uncovered
  node), and **backend groups**: the same subgraph measured on two or more
  backends. :mod:`collage_ml.models.groups` builds both (its docstring has the
  caveat on what a decision group's ranking says about the DP's decision).

:func:`evaluate` returns, as fractions (not percentages):

``n``, ``mape`` (mean ``|pred / true - 1|``), ``within_10pct``,
``kendall_tau`` (mean over decision groups of Kendall's tau-b within the
group), ``pairwise_accuracy`` (over every pair within a decision group whose
true latencies differ, the fraction the prediction orders the same way; a
predicted tie counts one half), ``pairwise_resolvable`` (the same over the
pairs whose true latencies differ by more than 10%, the measurements' own
agreement tolerance: the orders the labels can vouch for), ``top1_regret``
(mean over groups of the true latency of the predicted-fastest candidate over
the truly fastest, minus 1),
``backend_pairwise_accuracy`` and ``backend_choice_regret`` (the same over
backend groups), ``n_groups``, ``n_backend_groups`` and ``ungrouped`` (samples
in no decision group: random subgraphs, other batch sizes, and sources that
are not zoo families and cannot be rebuilt).

:func:`leave_one_family_out` and :func:`few_shot` are the two protocols the
benchmark (``benchmarks/cost_model.py``) reports.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from collage_ml.models.dataset import Dataset, Sample
# the groups and the metrics are re-exported: importers take them from here
from collage_ml.models.groups import DecisionGroups, backend_groups, decision_groups
from collage_ml.models.metrics import (
    HIGHER_IS_BETTER,
    METRIC_LABELS,
    METRICS,
    average_metrics,
    format_metric,
    json_safe,
    metrics_from_predictions,
    ranking_metrics,
)


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


# ----------------------------------------------------------------------------- protocols
def leave_one_family_out(
    make_model: Callable[[], Any],
    dataset: Dataset,
    families: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    predictions: dict[str, dict[str, Any]] | None = None,
    extra_train: Dataset | None = None,
    **group_kw: Any,
) -> dict[str, dict[str, Any]]:
    """For each family: fit ``make_model()`` on every other source, evaluate on that family's samples.

    ``families`` defaults to every source of ``dataset``. Each family's metrics
    gain ``n_train`` and ``fit_seconds``. ``predictions``, when given, is
    filled with family -> ``{"backend", "hash", "true", "pred", "std"}`` arrays (for plots; ``std`` is the
    model's log-space uncertainty).
    ``extra_train`` (for example synthetic networks, or another machine's rows)
    joins every fold's training set, less its own rows of the held-out family;
    it is never scored. ``progress`` receives one line per step.
    """
    fams = list(families) if families is not None else dataset.sources()
    known = set(dataset.sources())
    unknown = [f for f in fams if f not in known]
    if unknown:
        raise ValueError(f"unknown families {', '.join(unknown)}; the dataset has {', '.join(sorted(known))}")
    out: dict[str, dict[str, Any]] = {}
    for i, fam in enumerate(fams):
        train, test = dataset.split_by_source([fam])
        if extra_train is not None:
            train = train + extra_train.filter(lambda s, fam=fam: s.source != fam)
        if not len(train) or not len(test):
            continue
        if progress:
            progress(f"[{i + 1}/{len(fams)}] {fam}: training on {len(train)} samples, testing on {len(test)}")
        model = make_model()
        t0 = time.perf_counter()
        model.fit(train)
        fit_s = time.perf_counter() - t0
        pred, std = model.predict(test.samples)
        pred = np.asarray(pred, dtype=np.float64)
        m = evaluate_predictions(test, pred, **group_kw)
        m["n_train"] = len(train)
        m["fit_seconds"] = fit_s
        out[fam] = m
        if predictions is not None:
            predictions[fam] = {
                "backend": [s.backend for s in test],
                "hash": [s.info.hash for s in test],
                "true": test.latencies(),
                "pred": pred,
                "std": np.asarray(std, dtype=np.float64),
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
