"""Guided op-level search: the cost model decides what is measured, measurements decide the plan.

The loop (:func:`guided_op_level`) works on the candidate list the exhaustive
mode would measure in full:

1. Every candidate gets a predicted latency and a log-space uncertainty.
2. **Calibration.** Predictions are compared with every measurement made so
   far in this run (and the database's cache hits): the per-backend median
   log residual is a bias that shifts that backend's predictions, and the
   90th percentile of the absolute de-biased residuals is a spread added (in
   quadrature) to the model's own uncertainty. Before ``min_calibration``
   measurements exist, ``prior_spread`` stands in for it.
3. **Re-planning.** The DP runs with measured costs where they exist and,
   elsewhere, the calibrated prediction lowered by ``optimism`` standard
   deviations (``mean * exp(bias - optimism * sd)``). Its plan's unmeasured
   candidates are measured, together with, for each such subgraph, its
   predicted top-``k`` other backends and every backend whose interval
   (``z`` standard deviations) overlaps the chosen one's: the decision the
   cost model is least sure of. Then the DP runs again.
4. It stops when the chosen plan contains only measured candidates (and,
   with ``plan_check``, only measured hand-offs: the tuner prices a backend
   pair's boundary at 0 until a chosen plan uses it, then measures it). A
   prediction never stands in for a measurement in the final plan. With
   ``optimism`` large enough that the lowered predictions are true lower
   bounds, the plan is optimal for the measured table (every other plan's
   optimistic cost is already no better); ``optimism=0`` trusts the
   calibrated means, which measures far less on large graphs, where the sum
   of many per-candidate lower bounds is much looser than the bound of a sum.

**Safety.** If the model ranks this run's measurements badly (Kendall's tau
below ``min_tau`` once ``min_calibration`` candidates are measured), the loop
stops trusting it and measures every candidate, as the exhaustive mode does;
the result says so. ``measure_budget`` caps new measurements; when it runs
out, the plan is solved over measured candidates only.

``measure(keys)`` is injected, so the loop is tested against deterministic
cost tables (tests/test_guided.py) and wired to the real Runner by
:mod:`collage_ml.search.tuner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

from collage_ml.candidates import Candidate
from collage_ml.ir.graph import Graph
from collage_ml.search.dp import BoundaryFn, DPResult, NoCoverError, no_boundary, solve


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

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        if not self.z >= 0:
            raise ValueError(f"z must be >= 0, got {self.z}")
        if not self.optimism >= 0:
            raise ValueError(f"optimism must be >= 0, got {self.optimism}")
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
    calibration: Calibration  # as fitted on this run's measurements; the later stages reuse it
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


class Calibration:
    """Per-backend log bias and a residual spread from (prediction, measurement) pairs."""

    def __init__(self, cfg: GuidedConfig):
        self.cfg = cfg
        self.bias: dict[str, float] = {}
        self.global_bias = 0.0
        self.spread = cfg.prior_spread
        self.calibrated = False

    def fit(self, pairs: Sequence[tuple[str, float, float]]) -> None:
        """``pairs``: (backend, predicted seconds, measured seconds)."""
        if len(pairs) < self.cfg.min_calibration:
            return
        r = np.array([math.log(m) - math.log(p) for _, p, m in pairs])
        self.global_bias = float(np.median(r))
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
    cal = Calibration(cfg)
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

    def optimistic(i: int) -> float | None:
        k = keys[i]
        if k in measured:
            return measured[k]
        return cal.bounds(cands[i].backend.name, float(pred_mean[i]), float(pred_sd[i]), cfg.optimism)[0]

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
            dp = solve(graph, cands, [optimistic(i) for i in range(n)], boundary)
        except NoCoverError:
            dp = None
            break
        chosen = {id(c) for c in dp.choice}
        todo = [i for i, c in enumerate(cands) if id(c) in chosen and keys[i] not in measured]
        if not todo:
            if plan_check is not None and plan_check(dp):
                continue
            break
        if cfg.measure_budget is not None and new >= cfg.measure_budget:
            budget_hit = True
            break
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
            dp = solve(graph, cands, costs, boundary)
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


class GuidedSession:
    """Wires :func:`guided_op_level` to a Runner, a cost model and the feedback loop, for one ``place`` call."""

    def __init__(self, graph, cands, baselines, runner, database, cost_model, ref, progress: bool, say, cfg: GuidedConfig):
        from collage_ml.featurize.hardware import HardwareDesc, calibrated
        from collage_ml.models.feedback import Feedback, resolve_cost_model

        self.graph = graph
        self.cands = list(cands)
        self.baselines = list(baselines)
        self.runner = runner
        self.ref = ref
        self.progress = progress
        self.say = say
        self.cfg = cfg
        db_path = getattr(database, "path", None)
        self.model, self.source, save_to = resolve_cost_model(cost_model, db_path, runner.hardware)
        # the model reads the machine from its probes: measured here first on a machine the DB has not seen
        before = runner.measured
        if getattr(self.model, "uses_probes", True):
            self.hw = calibrated(runner, [c.backend for c in self.cands + self.baselines], progress=progress, say=say)
        else:
            self.hw = HardwareDesc.current(runner.threads)
        self.probe_measurements = runner.measured - before
        self.feedback = Feedback(self.model, save_to, self.hw)
        self.predicted = 0
        self.result: GuidedResult | None = None
        self._pred: dict = {}
        self.e2e_skipped = 0
        from collage_ml.search.failures import FailureLog

        self.failures = FailureLog(graph)

    def _predict(self, cands) -> None:
        todo = [c for c in cands if c.key not in self._pred]
        uniq: dict = {}
        for c in todo:
            uniq.setdefault(c.key, c)
        if uniq:
            mean, sd = self.model.predict(list(uniq.values()), self.hw)
            for k, m, s in zip(uniq, mean, sd):
                self._pred[k] = (float(m), float(s))
            self.predicted += len(uniq)

    def boundaries(self, backends):
        """The boundary table, measured lazily: pairs already in the DB are free; an unmeasured pair
        costs 0 (optimistic) until a plan uses it, and is then measured (all sizes) before re-planning."""
        from collage_ml.measure.boundary import BoundaryTable, measure_boundaries

        self._bk = {b.name: b for b in backends}
        self.table = BoundaryTable(measure_boundaries(self.runner, backends, cached_only=True))
        self.boundary_pairs_measured = 0
        return self.table.seconds

    def _check_handoffs(self, dp) -> bool:
        from collage_ml.measure.boundary import measure_boundaries

        owner: dict[int, str] = {}
        for c in dp.choice:
            for n in c.subgraph.node_indices:
                owner[n] = c.backend.name
        need = set()
        for c in dp.choice:
            for t in c.subgraph.inputs:
                if t in self.graph.producer:
                    pair = (owner[self.graph.producer[t]], c.backend.name)
                    if pair not in self.table.points:
                        need.add(pair)
        if not need:
            return False
        self.say(f"guided: measuring hand-off costs {', '.join(f'{a}->{b}' for a, b in sorted(need))}")
        self.table.add(measure_boundaries(self.runner, [], pairs=[(self._bk[a], self._bk[b]) for a, b in sorted(need)]))
        self.boundary_pairs_measured += len(need)
        for a, b in need:  # a pair whose every size failed stays free, but is never measured twice
            self.table.points.setdefault((a, b), [(1, 0.0)])
        return True

    def op_level(self, boundary: BoundaryFn) -> GuidedResult:
        from collage_ml.search.tuner import Progress

        self._predict(self.cands + self.baselines)
        keys = [c.key for c in self.cands]
        known: dict = {}
        for k in dict.fromkeys(keys):
            m = self.runner.lookup(k)
            if m is not None:
                known[k] = m.median if m.valid else None
        self.runner.cache_hits += len(known)
        self.say(f"guided: predicted {self.predicted} candidates with {type(self.model).__name__} "
                 f"({self.source}); {len(known)} already measured")
        # the total is an upper bound (guided mode measures few of them), so no ETA
        bar = Progress(self.progress, len(set(keys)) - len(known), "measuring (guided; of at most)", eta=False)

        def measure(indices: list[int]) -> dict:
            batch = [self.cands[i] for i in indices]
            out: dict = {}
            pairs = []

            def on_result(c, m, cached):
                bar.step(c, m, cached)

            ms = self.runner.measure(batch, self.ref, on_result=on_result)
            for c, m in zip(batch, ms):
                out[c.key] = m.median if m.valid else None
                pairs.append((c, m))
            self.feedback.add(pairs)
            self.failures.add(pairs)
            return out

        try:
            self.result = guided_op_level(
                self.graph, self.cands, keys,
                [self._pred[k][0] for k in keys], [self._pred[k][1] for k in keys],
                measure, boundary, self.cfg, known, self.say, plan_check=self._check_handoffs,
            )
        finally:
            bar.close()
        self.cal = self.result.calibration
        return self.result

    # -- predictions for the end-to-end stages ------------------------------------------------
    def baseline_prediction(self, c) -> tuple[float, float]:
        self._predict([c])
        return self._pred[c.key]

    def bounds(self, c) -> tuple[float, float]:
        m, s = self.baseline_prediction(c)
        return self.cal.bounds(c.backend.name, m, s)

    def whole_model_estimate(self, c) -> float | None:
        """Calibrated estimate of running the whole model on ``c``'s backend.

        A region backend compiles the whole model as one region, which the
        model predicts directly. An op-level backend (torch eager) runs it
        kernel by kernel, so its estimate is the op-level DP over that
        backend's own candidates (measured costs where known); None when they
        do not cover the graph.
        """
        b = c.backend
        if any(p.kind == "region" for p in b.patterns):
            m, _ = self.baseline_prediction(c)
            return self.cal.adjusted(b.name, m)
        own = [x for x in self.cands if x.backend is b]
        costs = []
        for x in own:
            if self.result is not None and x.key in self.result.measured:
                costs.append(self.result.measured[x.key])
            else:
                m, _ = self.baseline_prediction(x)
                costs.append(self.cal.adjusted(b.name, m))
        try:
            return solve(self.graph, own, costs).cost
        except NoCoverError:
            return None

    def worth_trying(self, c, est: float | None, best_seconds: float) -> bool:
        """Is a whole-model plan on ``c``'s backend, estimated at ``est`` (:meth:`whole_model_estimate`),
        worth an end-to-end measurement against ``best_seconds``?"""
        _, sd = self.baseline_prediction(c)
        ok = est is not None and est / math.exp(self.cfg.z * self.cal.sd(sd)) <= best_seconds
        if not ok:
            self.e2e_skipped += 1
        return ok

    def predict_partition(self, sg, backend) -> float:
        from collage_ml.candidates import Candidate

        c = Candidate(sg, backend, "partition")
        m, _ = self.baseline_prediction(c)
        return self.cal.adjusted(backend.name, m)

    def worth_measuring(self, estimate: float, best: float | None) -> bool:
        """Graph-level: measure an individual only if its optimistic estimate can beat the best measured plan."""
        if best is None:
            return True
        return estimate / math.exp(self.cfg.z * self.cal.sd(0.0)) <= best

    def summary(self) -> dict:
        r = self.result
        return {
            "rounds": r.rounds,
            "new_measurements": r.new_measurements,
            "fell_back_to_exhaustive": r.fell_back,
            "budget_hit": r.budget_hit,
            "kendall_tau": r.tau,
            "bias": r.bias,
            "spread": r.spread,
            "config": {k: getattr(self.cfg, k) for k in ("k", "z", "optimism", "prior_spread", "min_calibration", "min_tau",
                                                          "measure_budget")},
            "whole_model_plans_skipped": self.e2e_skipped,
            "boundary_pairs_measured": self.boundary_pairs_measured,
        }
