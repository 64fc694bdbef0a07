"""The samplers of ``collect``: which candidates a source graph gives (random, focus), and the focus weights."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from collage_ml.errors import CollageError

if TYPE_CHECKING:
    from collage_ml.collector.planning import _Work

SAMPLERS = ("enumerate", "random", "focus")
#: random subgraphs drawn per (model, batch size) by the random and focus samplers
DEFAULT_SAMPLES_PER_GRAPH = 100
#: of the focus sampler's pool, the share kept when max_candidates is not given
DEFAULT_FOCUS_SHARE = 0.25

FOCUS_NEEDS_MODEL = (
    "focus sampling needs a trained cost model (--cost-model); train one with `collage-ml train` first"
)


def _check_sampler(sampler: str) -> str:
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    return sampler


def focus_weights(candidates: Sequence[Any], cost_model: Any) -> list[float]:
    """The focus sampler's weights: one per candidate, highest where the cost model is least sure.

    Uses ``cost_model.predict(candidates) -> (mean, uncertainty)``; the
    uncertainty is the standard deviation of the predicted *log* latency
    (:mod:`collage_ml.models.base`), already relative, so it is the weight
    itself (nn-Meter's adaptive loop). A candidate the model cannot predict
    (NaN/inf) gets the largest weight.
    """
    import numpy as np

    cands = list(candidates)
    if not cands:
        return []
    mean, unc = cost_model.predict(cands)
    mean = np.asarray(mean, dtype=float).reshape(-1)
    unc = np.asarray(unc, dtype=float).reshape(-1)
    if len(mean) != len(cands) or len(unc) != len(cands):
        raise CollageError(
            f"the cost model predicted {len(mean)} means and {len(unc)} uncertainties for {len(cands)} candidates"
        )
    rel = np.abs(unc)
    finite = np.isfinite(rel)
    top = float(rel[finite].max()) if finite.any() else 1.0
    rel = np.where(finite, rel, max(top, 1e-6))
    return np.clip(rel, 1e-6, None).tolist()


def _load_cost_model(cost_model: Any) -> Any:
    """A cost-model object (anything with ``predict``), or a path loaded with ``collage_ml.models.load``."""
    if cost_model is None:
        raise CollageError(FOCUS_NEEDS_MODEL)
    if not isinstance(cost_model, (str, os.PathLike)):
        if not callable(getattr(cost_model, "predict", None)):
            raise CollageError(f"the cost model {type(cost_model).__name__} has no predict(candidates) method")
        return cost_model
    from collage_ml.models import load_model
    from collage_ml.models.base import parse_default

    if not parse_default(cost_model)[0] and not Path(cost_model).exists():  # a path, not "default[:KIND]"
        raise CollageError(f"{Path(cost_model)}: no such cost model; train one with `collage-ml train` first")
    return load_model(cost_model)


def _random_candidates(graph, backends, count: int, max_size: int, seed: int, label: str):
    """Candidates on random convex subgraphs: each sampled subgraph on every backend whose patterns can run it."""
    from collage_ml.candidates import Candidate
    from collage_ml.collector.sampling import sample_subgraphs

    supported: list[int] = []
    op_masks: list[set[int]] = []
    region: list[bool] = []
    for b in backends:
        sup = 0
        for n in graph.nodes:
            if b.supports(graph, n):
                sup |= 1 << n.index
        supported.append(sup)
        region.append(any(p.kind == "region" for p in b.patterns))
        ops: set[int] = set()
        for p in b.patterns:
            if p.kind == "op":
                ops.update(p.matches(graph, lambda n, s=sup: bool(s >> n.index & 1)))
        op_masks.append(ops)

    def runnable(i: int, mask: int) -> bool:
        return (region[i] and mask & ~supported[i] == 0) or mask in op_masks[i]

    allowed = 0
    for s in supported:
        allowed |= s
    sgs = sample_subgraphs(
        graph, count, max_size, seed, label=label, allowed=allowed,
        keep=lambda sg: any(runnable(i, sg.mask) for i in range(len(backends))),
    )
    pattern = f"random:{label}"
    for sg in sgs:
        for i, b in enumerate(backends):
            if runnable(i, sg.mask):
                yield Candidate(sg, b, pattern)


def _focus_select(works: list[_Work], seed: int, max_candidates: int | None) -> list[_Work]:
    """Weighted sampling without replacement (Efraimidis-Spirakis keys ``u ** (1 / w)``), seeded."""
    import random

    rng = random.Random(f"collage-ml-focus|{seed}")
    scored = []
    for wi, w in enumerate(works):
        for ii, (item, weight) in enumerate(zip(w.items, w.weights or [1.0] * len(w.items))):
            scored.append((rng.random() ** (1.0 / max(weight, 1e-12)), wi, ii))
    total = len(scored)
    n = max_candidates if max_candidates is not None else math.ceil(DEFAULT_FOCUS_SHARE * total)
    chosen = sorted(scored, reverse=True)[:n]
    keep: dict[int, set[int]] = {}
    for _, wi, ii in chosen:
        keep.setdefault(wi, set()).add(ii)
    out = []
    for wi, w in enumerate(works):
        if wi in keep:
            w.items = [it for ii, it in enumerate(w.items) if ii in keep[wi]]
            w.weights = None
            out.append(w)
    return out
