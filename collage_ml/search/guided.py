"""Guided op-level search: the cost model decides what is measured, measurements decide the plan.

The loop (:func:`guided_op_level`) works on the candidate list the exhaustive
mode would measure in full:

1. Every candidate gets a predicted latency and a log-space uncertainty.
2. **Bias correction** (:class:`BiasCorrection`; not the probe set, which
   ``collage-ml calibrate`` runs). Predictions are compared with every measurement made so
   far in this run (and the database's cache hits): the per-backend median
   log residual is a bias that shifts that backend's predictions, and the
   90th percentile of the absolute de-biased residuals is a spread added (in
   quadrature) to the model's own uncertainty. Before ``min_calibration``
   measurements exist, ``prior_spread`` stands in for it, and the median log
   residual of the few there are shifts every backend's predictions alike:
   a slow period, or a model that misjudges this machine, moves the first
   measurements (the whole model on two backends) and the predictions they
   are compared with by the same factor.
3. **Re-planning.** The DP runs with measured costs where they exist and,
   elsewhere, the calibrated prediction lowered by ``optimism`` standard
   deviations (``mean * exp(bias - optimism * sd)``). Its plan's unmeasured
   candidates are measured, together with, for each such subgraph, its
   predicted top-``k`` other backends and every backend whose interval
   (``z`` standard deviations) overlaps the chosen one's: the decision the
   cost model is least sure of. Then the DP runs again.
   **A sample first** (``sample_first``, 3): before a plan's parts on a backend
   are measured in full, the plan's most expensive unmeasured parts on each
   backend this run has measured fewer than three parts of are measured
   alone, and the DP runs again with the bias they reveal. On a machine the
   model misjudges for one backend, the plan that looked fast is often given
   up after those few (``benchmarks/guided_replay.py``).
4. It stops when the chosen plan contains only measured candidates (and,
   with ``plan_check``, only measured hand-offs: the tuner prices a backend
   pair's boundary at 0 until a chosen plan uses it, then measures it), or
   when the chosen plan is predicted to beat the best plan measured in full
   by no more than ``min_gain`` (5%, the tuner's margin for a mixed plan over
   a single backend, :data:`~collage_ml.search.judging.MIXED_PLAN_MARGIN`: a
   smaller gain is inside the predictions' error, and would not be kept end
   to end either); then it keeps the measured plan. So that such a plan
   exists from the start, the first round also measures the whole model on
   the ``k + 1`` backends predicted fastest for it (where a backend can run
   it whole). A prediction never stands in for a measurement in the final
   plan. With ``optimism`` large enough that the lowered predictions are
   true lower bounds, and ``min_gain`` 0, the plan is optimal for the
   measured table (every other plan's optimistic cost is already no better;
   with ``min_gain`` it is within that fraction of the optimum); ``optimism=0`` trusts the
   calibrated means, which measures far less on large graphs, where the sum
   of many per-candidate lower bounds is much looser than the bound of a sum.

**Safety.** If the model ranks this run's measurements badly (Kendall's tau
below ``min_tau`` once ``min_calibration`` candidates are measured), the loop
stops trusting it and measures every candidate, as the exhaustive mode does;
the result says so. ``measure_budget`` caps new measurements; when it runs
out, the plan is solved over measured candidates only.

``measure(keys)`` is injected, so the loop is tested against deterministic
cost tables (tests/test_guided.py) and wired to the tuner's measure step by
:class:`collage_ml.search.strategies.Guided`. This module imports neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from collage_ml.candidates import Candidate
from collage_ml.ir.graph import Graph
from collage_ml.search.dp import BoundaryFn, DPResult, NoCoverError, OverheadFn, no_boundary, solve


@dataclass
class GuidedConfig:
    """Knobs of the guided loop; the defaults come from ``benchmarks/guided_vs_exhaustive.py``."""

    k: int = 1  # predicted-best backends measured per chosen subgraph (besides the chosen one)
    z: float = 1.0  # interval half-width for the backend-overlap rule, in calibrated log-space standard deviations
    optimism: float = 0.0  # how far below the calibrated mean the DP prices unmeasured candidates, in the same units
    prior_spread: float = 0.2  # log-space spread used before calibration (0.2 = a factor of 1.22)
    min_calibration: int = 5  # measurements needed before calibrating and judging the model
    min_tau: float = 0.2  # below this rank agreement with the measurements, fall back to exhaustive
    measure_budget: int | None = None  # new measurements at most (None: no cap)
    #: a plan with unmeasured candidates is pursued only when it is predicted to beat the best plan already
    #: measured in full by more than this fraction (0: always); the tuner's margin for a mixed plan
    min_gain: float = 0.05
    #: before a plan's unmeasured candidates are measured in full, this many of them per backend whose parts
    #: this run has not measured yet (the plan's most expensive ones) are measured first, and the DP runs again
    #: with the bias they reveal (0: measure the whole plan at once)
    sample_first: int = 3

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if not self.z >= 0:
            raise ValueError(f"z must be >= 0, got {self.z}")
        if not self.optimism >= 0:
            raise ValueError(f"optimism must be >= 0, got {self.optimism}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
        if self.sample_first < 0:
            raise ValueError(f"sample_first must be >= 0, got {self.sample_first}")
        if self.measure_budget is not None and self.measure_budget < 0:
            raise ValueError(f"measure_budget must be >= 0 or None, got {self.measure_budget}")


@dataclass
class GuidedResult:
    dp: DPResult | None  # None when the measured candidates cannot cover the graph (budget ran out)
    measured: dict[Hashable, float | None]  # key -> measured seconds (None: invalid), incl. cache hits
    new_measurements: int
    rounds: int
    pruned: int  # distinct candidates never measured
    fell_back: bool  # the model disagreed with the measurements; everything was measured
    budget_hit: bool
    tau: float | None  # rank agreement of predictions with this run's measurements
    calibration: BiasCorrection  # as fitted on this run's measurements; the later stages reuse it
    log: list[str] = field(default_factory=list)

    @property
    def bias(self) -> dict[str, float]:
        return dict(self.calibration.bias)

    @property
    def spread(self) -> float:
        return self.calibration.spread


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's tau-a between two sequences (None for fewer than two items or no distinct pairs)."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    n = len(x)
    if n < 2:
        return None
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    iu = np.triu_indices(n, 1)
    prod = (dx * dy)[iu]
    if not np.any(prod):
        return None
    return float(prod.sum() / len(prod))


class BiasCorrection:
    """Per-backend log bias and a residual spread from (prediction, measurement) pairs."""

    def __init__(self, cfg: GuidedConfig):
        self.cfg = cfg
        self.bias: dict[str, float] = {}
        self.global_bias = 0.0
        self.spread = cfg.prior_spread
        self.calibrated = False

    def fit(self, pairs: Sequence[tuple[str, float, float]]) -> None:
        """``pairs``: (backend, predicted seconds, measured seconds)."""
        if not pairs:
            return
        r = np.array([math.log(m) - math.log(p) for _, p, m in pairs])
        self.global_bias = float(np.median(r))
        if len(pairs) < self.cfg.min_calibration:  # too few for more: one shift for every backend
            return
        by: dict[str, list[float]] = {}
        for (b, _, _), x in zip(pairs, r):
            by.setdefault(b, []).append(float(x))
        self.bias = {b: float(np.median(v)) for b, v in by.items() if len(v) >= 3}
        resid = np.array([x - self.bias.get(b, self.global_bias) for (b, _, _), x in zip(pairs, r)])
        self.spread = float(np.quantile(np.abs(resid), 0.9))
        self.calibrated = True

    def adjusted(self, backend: str, mean: float) -> float:
        return mean * math.exp(self.bias.get(backend, self.global_bias))

    def sd(self, model_sd: float) -> float:
        return math.sqrt(model_sd**2 + self.spread**2)

    def bounds(self, backend: str, mean: float, model_sd: float, z: float | None = None) -> tuple[float, float]:
        m = self.adjusted(backend, mean)
        f = math.exp((self.cfg.z if z is None else z) * self.sd(model_sd))
        return m / f, m * f


def guided_op_level(
    graph: Graph,
    cands: Sequence[Candidate],
    keys: Sequence[Hashable],
    pred_mean: Sequence[float],
    pred_sd: Sequence[float],
    measure: Callable[[list[int]], Mapping[Hashable, float | None]],
    boundary: BoundaryFn = no_boundary,
    cfg: GuidedConfig = GuidedConfig(),
    known: Mapping[Hashable, float | None] | None = None,
    log: Callable[[str], None] | None = None,
    plan_check: Callable[[DPResult], bool] | None = None,
    overhead: OverheadFn | None = None,
) -> GuidedResult:
    """Runs the loop in the module docstring.

    ``keys[i]`` identifies candidate i's measurement (equal keys share one);
    ``measure(indices)`` measures the candidates at those indices and returns
    key -> seconds (None: invalid). ``known`` holds free measurements (cache hits).
    ``plan_check(dp)`` is called on a fully measured plan; it returns True when
    it measured something that changes costs (then the DP runs again).
    """
    say = log or (lambda s: None)
    n = len(cands)
    measured: dict[Hashable, float | None] = dict(known or {})
    first_of: dict[Hashable, int] = {}
    for i, k in enumerate(keys):
        first_of.setdefault(k, i)
    by_mask: dict[int, list[int]] = {}
    for i, c in enumerate(cands):
        by_mask.setdefault(c.subgraph.mask, []).append(i)
    cal = BiasCorrection(cfg)
    new = 0
    rounds = 0
    fell_back = budget_hit = False
    tau: float | None = None
    lines: list[str] = []

    def note(s: str) -> None:
        lines.append(s)
        say(s)

    def run(indices: list[int]) -> None:
        nonlocal new
        want = []
        seen = set()
        for i in indices:
            k = keys[i]
            if k in measured or k in seen:
                continue
            seen.add(k)
            want.append(first_of[k])
        if cfg.measure_budget is not None:
            want = want[: max(0, cfg.measure_budget - new)]
        if not want:
            return
        got = measure(want)
        for i in want:
            measured[keys[i]] = got.get(keys[i])
        new += len(want)

    def recalibrate() -> None:
        nonlocal tau
        pairs = [
            (cands[first_of[k]].backend.name, float(pred_mean[first_of[k]]), v)
            for k, v in measured.items()
            if v is not None and v > 0 and k in first_of and pred_mean[first_of[k]] > 0
        ]
        cal.fit(pairs)
        if len(pairs) >= cfg.min_calibration:
            tau = kendall_tau([p for _, p, _ in pairs], [m for _, _, m in pairs])

    def measured_plan() -> DPResult | None:
        """The cheapest cover by measured candidates alone (None: they do not cover the graph yet)."""
        try:
            return solve(graph, cands, [measured[keys[i]] if keys[i] in measured else None for i in range(n)],
                         boundary, overhead=overhead)
        except NoCoverError:
            return None

    def optimistic(i: int) -> float | None:
        k = keys[i]
        if k in measured:
            return measured[k]
        return cal.bounds(cands[i].backend.name, float(pred_mean[i]), float(pred_sd[i]), cfg.optimism)[0]

    def sampled(todo: list[int]) -> list[int]:
        """The plan's ``sample_first`` most expensive unmeasured parts on each backend of which fewer than that
        many parts are measured in this run (empty when every backend of the plan has that many, or when the
        sample would be the plan's whole remainder anyway)."""
        parts: dict[str, int] = {}
        for k, v in measured.items():
            i = first_of.get(k)
            if v is not None and i is not None and cands[i].subgraph.mask != graph.all_mask:
                parts[cands[i].backend.name] = parts.get(cands[i].backend.name, 0) + 1
        out: list[int] = []
        for b in dict.fromkeys(cands[i].backend.name for i in todo):
            if parts.get(b, 0) >= cfg.sample_first:
                continue
            mine = sorted((i for i in todo if cands[i].backend.name == b), key=lambda i: -float(pred_mean[i]))
            out += mine[: cfg.sample_first - parts.get(b, 0)]
        return out if len(out) < len(todo) else []

    # the whole model on its predicted-best k+1 backends first: a plan measured in full to hold the others to
    whole = sorted((i for i, c in enumerate(cands) if c.subgraph.mask == graph.all_mask), key=lambda i: pred_mean[i])
    if cfg.min_gain > 0:
        run(whole[: cfg.k + 1])
    while True:
        recalibrate()
        if tau is not None and tau < cfg.min_tau and not fell_back:
            fell_back = True
            note(f"the cost model disagrees with this run's measurements (Kendall tau {tau:.2f} < {cfg.min_tau}); "
                 f"measuring every candidate")
            run(list(range(n)))
            continue
        rounds += 1
        try:
            dp = solve(graph, cands, [optimistic(i) for i in range(n)], boundary, overhead=overhead)
        except NoCoverError:
            dp = None
            break
        chosen = {id(c) for c in dp.choice}
        todo = [i for i, c in enumerate(cands) if id(c) in chosen and keys[i] not in measured]
        if todo and cfg.min_gain > 0:
            best = measured_plan()
            if best is not None and dp.cost >= best.cost * (1.0 - cfg.min_gain):
                if plan_check is not None and plan_check(best):
                    continue
                note(f"the best plan with unmeasured candidates is predicted at {dp.cost * 1e3:.3f} ms, within "
                     f"{cfg.min_gain:.0%} of the measured {best.cost * 1e3:.3f} ms: keeping the measured one")
                dp = best
                break
        if not todo:
            if plan_check is not None and plan_check(dp):
                continue
            break
        if cfg.measure_budget is not None and new >= cfg.measure_budget:
            budget_hit = True
            break
        if cfg.sample_first:
            sample = sampled(todo)
            if sample:
                before = new
                run(sample)
                if new > before:
                    continue
        batch = list(todo)
        for i in todo:
            alts = [j for j in by_mask[cands[i].subgraph.mask] if j != i and keys[j] not in measured]
            if not alts:
                continue
            alts.sort(key=lambda j: cal.adjusted(cands[j].backend.name, float(pred_mean[j])))
            batch += alts[: cfg.k]
            lo_i, hi_i = cal.bounds(cands[i].backend.name, float(pred_mean[i]), float(pred_sd[i]))
            for j in alts[cfg.k :]:
                lo_j, _ = cal.bounds(cands[j].backend.name, float(pred_mean[j]), float(pred_sd[j]))
                if lo_j <= hi_i:
                    batch.append(j)
        before = new
        run(batch)
        if new == before:  # nothing new could be measured (budget): stop
            budget_hit = True
            break

    if dp is None or budget_hit:
        # solve over measurements only: a prediction never replaces a measurement in the final plan
        costs = [measured.get(keys[i]) if keys[i] in measured else None for i in range(n)]
        try:
            dp = solve(graph, cands, costs, boundary, overhead=overhead)
        except NoCoverError:
            dp = None
            note("the measured candidates do not cover the graph (measure_budget ran out)")
    pruned = len({k for k in keys if k not in measured})
    return GuidedResult(
        dp=dp,
        measured=measured,
        new_measurements=new,
        rounds=rounds,
        pruned=pruned,
        fell_back=fell_back,
        budget_hit=budget_hit,
        tau=tau,
        calibration=cal,
        log=lines,
    )
