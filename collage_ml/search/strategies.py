"""The tuner's strategies: what to measure, and how far to trust a prediction.

A strategy answers the questions where exhaustive and guided placement differ; the
:class:`~collage_ml.search.tuner.Tuner` asks them and does everything else the same way.

- :meth:`~Strategy.op_level`: measure candidates (through :meth:`Tuner.measure
  <collage_ml.search.tuner.Tuner.measure>`, the one measure step) and solve the op-level DP.
  :class:`Exhaustive` measures every candidate and every whole-model baseline, as Collage did;
  :class:`Guided` runs :func:`~collage_ml.search.guided.guided_op_level`, which measures only what the
  cost model cannot rule out, and prices an unmeasured hand-off at 0 until a chosen plan uses it.
- :meth:`~Strategy.judge_whole_model`: is a whole-model plan that was never measured as a kernel
  worth an end-to-end measurement? (exhaustive mode measured every one.)
- :attr:`~Strategy.reuse_whole_model_timings`: may a one-partition plan reuse its whole-model
  candidate's native timing instead of an end-to-end run (slow models only)? :meth:`~Strategy.surprising`
  names the timings that must be confirmed end to end all the same (far from the prediction).
- :meth:`~Strategy.graph_level` and :meth:`~Strategy.predict_partition`: how the evolutionary
  search filters individuals and prices a partition nobody measured.
- :meth:`~Strategy.report_fields`: the report's strategy-specific keys.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from collage_ml.candidates import Candidate
from collage_ml.measure.boundary import BoundaryTable, measure_boundaries
from collage_ml.measure.context import ContextTable, measure_context
from collage_ml.search.dp import DPResult, NoCoverError, solve
from collage_ml.search.evolutionary import EvoConfig
from collage_ml.search.guided import GuidedConfig, GuidedResult, guided_op_level
from collage_ml.ui import Bar


@dataclass
class Problem:
    """One placement's inputs: the graph, its backends, its candidates and the reference activations."""

    graph: Any
    backends: list
    cands: list[Candidate]  # every enumerated candidate
    baselines: list[Candidate]  # the whole model on each backend that supports every node
    todo: list[Candidate]  # cands plus the baselines no candidate already is: what exhaustive mode measures
    ref: Any  # Graph.reference()


@dataclass
class OpLevel:
    """What the op-level stage found."""

    dp: DPResult | None  # None: the valid (measured) candidates do not cover the graph
    cost_of: dict  # candidate key -> measured seconds (None: invalid), for every candidate measured or read
    table: BoundaryTable  # hand-off costs, as measured so far
    dp_seconds: float
    budget_hit: bool = False  # guided: measure_budget ran out
    context: ContextTable | None = None  # in-context costs the DP charged (None: in_context was off)


class Strategy:
    """The exhaustive answers; :class:`Guided` overrides them (module docstring)."""

    name = ""  # the report's "mode"
    reuse_whole_model_timings = False

    def __init__(self, progress: bool = False, in_context: bool = True):
        self.progress = progress
        self.in_context = in_context

    def context(self, runner, p: Problem, say: Callable[[str], None] | None = None) -> ContextTable | None:
        """Every backend's in-context cost (:mod:`collage_ml.measure.context`), measured once per machine and
        read from the database after that; None when ``in_context`` is off or the model is not charged."""
        if not self.in_context or not ContextTable.charges(p.graph):
            return None  # off, or a model too small to be charged: nothing to measure
        return ContextTable(measure_context(runner, p.backends, say=say))

    def op_level(self, tuner, p: Problem) -> OpLevel:
        raise NotImplementedError

    def judge_whole_model(self, c: Candidate, best_seconds: float) -> tuple[float | None, bool]:
        """(estimated seconds or None, worth an end-to-end measurement) for an unmeasured baseline."""
        return None, False

    def surprising(self, c: Candidate, seconds: float) -> bool:
        """Is ``c``'s measured ``seconds`` far enough from what was expected to time it again?"""
        return False

    def graph_level(self, cfg: EvoConfig) -> tuple[EvoConfig, Callable[[float, float | None], bool] | None]:
        """The evolutionary search's config and its ``worth(estimate, best)`` filter (None: measure all)."""
        return cfg, None

    def predict_partition(self, sg, backend) -> float | None:
        return None

    def report_fields(self, tuner) -> dict[str, Any]:
        return {"probe_measurements": 0, "probe_seconds": 0.0, "predicted_candidates": 0, "pruned": 0, "model_updates": 0,
                "cost_model": None, "guided": None}


class Exhaustive(Strategy):
    """Measures every candidate (cache hits excepted) and every whole-model baseline, then solves the DP."""

    name = "exhaustive"

    def op_level(self, tuner, p: Problem) -> OpLevel:
        todo = p.todo
        table = BoundaryTable(measure_boundaries(tuner.runner, p.backends))
        ctx = self.context(tuner.runner, p, tuner.say)
        bar = Bar(self.progress and bool(todo)).start().task("measuring", len({c.key for c in todo}))
        seen: set = set()

        def on_result(c, m, new):
            if c.key not in seen:
                seen.add(c.key)
                bar.step(c.backend.name, m.valid)

        try:
            ms = tuner.measure(todo, p.ref, on_result=on_result)
        finally:
            bar.close()
        cost_of = {c.key: (m.median if m.valid else None) for c, m in zip(todo, ms)}
        tuner.failures.add(zip(todo, ms))
        t_dp = time.perf_counter()
        try:
            dp = solve(p.graph, p.cands, [cost_of[c.key] for c in p.cands], table.seconds,
                       overhead=ctx.overhead(p.graph) if ctx else None)
        except NoCoverError:
            dp = None
        return OpLevel(dp, cost_of, table, time.perf_counter() - t_dp, context=ctx)


class Guided(Strategy):
    """The cost model decides what is measured (:mod:`collage_ml.search.guided`); measurements decide the plan.

    :meth:`op_level` resolves ``cost_model`` (``"default"``: the updated model next to the database, else
    the shipped one), gives the tuner its feedback, predicts every candidate and runs the guided loop.
    """

    name = "guided"

    def __init__(self, cost_model: Any = "default", db_path=None, progress: bool = False,
                 cfg: GuidedConfig | None = None, in_context: bool = True):
        super().__init__(progress, in_context)
        self.spec = cost_model
        self.db_path = db_path
        self.cfg = cfg or GuidedConfig()
        self.model = self.source = self.hw = None
        self.probe_measurements = 0
        self.probe_seconds = 0.0
        self.predicted = 0
        self.result: GuidedResult | None = None
        self.cal = None
        self.e2e_skipped = 0
        self.boundary_pairs_measured = 0
        self._pred: dict = {}
        self._tuner = None

    @property
    def reuse_whole_model_timings(self) -> bool:  # only once the guided loop ran (it timed the whole models)
        return self.result is not None

    def start(self, tuner, backends=()) -> None:
        """Resolves the cost model, describes the machine to it (running the probe set of ``backends`` first
        where the database has none for this machine), and hands the tuner the feedback that updates it."""
        from collage_ml.featurize.hardware import HardwareDesc, calibrated
        from collage_ml.models.feedback import Feedback, resolve_cost_model

        runner = tuner.runner
        self.model, self.source, save_to = resolve_cost_model(self.spec, self.db_path, runner.hardware)
        before, t0 = runner.measured, time.perf_counter()
        if getattr(self.model, "uses_probes", True) and backends:
            self.hw = calibrated(runner, backends, progress=self.progress, say=tuner.say)
        else:
            self.hw = HardwareDesc.current(runner.threads)
        self.probe_measurements = runner.measured - before
        self.probe_seconds = time.perf_counter() - t0 if self.probe_measurements else 0.0
        tuner.feedback = Feedback(self.model, save_to, self.hw)
        self._tuner = tuner

    def _predict(self, cands) -> None:
        uniq: dict = {}
        for c in cands:
            if c.key not in self._pred:
                uniq.setdefault(c.key, c)
        if uniq:
            mean, sd = self.model.predict(list(uniq.values()), self.hw)
            for k, m, s in zip(uniq, mean, sd):
                self._pred[k] = (float(m), float(s))
            self.predicted += len(uniq)

    # -- the op-level stage ------------------------------------------------------------------
    def op_level(self, tuner, p: Problem) -> OpLevel:
        self.start(tuner, [c.backend for c in list(p.cands) + list(p.baselines)])
        runner, say = tuner.runner, tuner.say
        self.graph, self.cands = p.graph, list(p.cands)
        # the boundary table, measured lazily: pairs already in the DB are free; an unmeasured pair costs 0
        # (optimistic) until a plan uses it, and is then measured (all sizes) before re-planning
        self._bk = {b.name: b for b in p.backends}
        self.table = BoundaryTable(measure_boundaries(runner, p.backends, cached_only=True))
        ctx = self.context(runner, p, say)
        t_dp = time.perf_counter()
        self._predict(self.cands + list(p.baselines))
        keys = [c.key for c in self.cands]
        runner.refresh_stale(self.cands + list(p.baselines), p.ref)  # stale hits join at this hour's scale
        known: dict = {}
        for k in dict.fromkeys(keys):
            m = runner.lookup(k)
            if m is not None:
                known[k] = m.median if m.valid else None
        runner.cache_hits += len(known)
        say(f"guided: predicted {self.predicted} candidates with {type(self.model).__name__} "
            f"({self.source}); {len(known)} already measured")
        # the total is an upper bound (guided mode measures few of them), so no ETA
        bar = Bar(self.progress and len(set(keys)) > len(known), eta=False).start()
        bar.task("measuring (guided; of at most)", len(set(keys)) - len(known))

        def measure(indices: list[int]) -> dict:
            batch = [self.cands[i] for i in indices]
            ms = tuner.measure(batch, p.ref, on_result=lambda c, m, new: bar.step(c.backend.name, m.valid))
            tuner.failures.add(zip(batch, ms))
            return {c.key: (m.median if m.valid else None) for c, m in zip(batch, ms)}

        try:
            g = self.result = guided_op_level(
                p.graph, self.cands, keys, [self._pred[k][0] for k in keys], [self._pred[k][1] for k in keys],
                measure, self.table.seconds, self.cfg, known, say, plan_check=self._check_handoffs,
                overhead=ctx.overhead(p.graph) if ctx else None,
            )
        finally:
            bar.close()
        self.cal = g.calibration
        cost_of = {c.key: g.measured.get(c.key) for c in p.todo if c.key in g.measured}
        return OpLevel(g.dp, cost_of, self.table, time.perf_counter() - t_dp, budget_hit=g.budget_hit, context=ctx)

    def _check_handoffs(self, dp) -> bool:
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
        self._tuner.say(f"guided: measuring hand-off costs {', '.join(f'{a}->{b}' for a, b in sorted(need))}")
        pairs = [(self._bk[a], self._bk[b]) for a, b in sorted(need)]
        self.table.add(measure_boundaries(self._tuner.runner, [], pairs=pairs))
        self.boundary_pairs_measured += len(need)
        for a, b in need:  # a pair whose every size failed stays free, but is never measured twice
            self.table.points.setdefault((a, b), [(1, 0.0)])
        return True

    # -- predictions for the end-to-end stages ------------------------------------------------
    def _prediction(self, c) -> tuple[float, float]:
        self._predict([c])
        return self._pred[c.key]

    def whole_model_estimate(self, c) -> float | None:
        """Calibrated estimate of running the whole model on ``c``'s backend.

        A region backend compiles the whole model as one region, which the model predicts directly. An
        op-level backend (torch eager) runs it kernel by kernel, so its estimate is the op-level DP over
        that backend's own candidates (measured costs where known); None when they do not cover the graph.
        """
        b = c.backend
        if any(p.kind == "region" for p in b.patterns):
            m, _ = self._prediction(c)
            return self.cal.adjusted(b.name, m)
        own = [x for x in self.cands if x.backend is b]
        costs = []
        for x in own:
            if self.result is not None and x.key in self.result.measured:
                costs.append(self.result.measured[x.key])
            else:
                m, _ = self._prediction(x)
                costs.append(self.cal.adjusted(b.name, m))
        try:
            return solve(self.graph, own, costs).cost
        except NoCoverError:
            return None

    def judge_whole_model(self, c, best_seconds):
        """Worth an end-to-end run if the optimistic end of the estimate's interval beats ``best_seconds``."""
        est = self.whole_model_estimate(c)
        _, sd = self._prediction(c)
        ok = est is not None and est / math.exp(self.cfg.z * self.cal.sd(sd)) <= best_seconds
        if not ok:
            self.e2e_skipped += 1
        return est, ok

    def surprising(self, c, seconds):
        """Farther from the prediction than ``z`` calibrated standard deviations (log space); the prediction
        is bias-corrected once the run is calibrated, raw before (two whole-model timings, one of them slow,
        would otherwise move the bias halfway to the slow one)."""
        m, sd = self._prediction(c)
        expected = self.cal.adjusted(c.backend.name, m) if self.cal.calibrated else m
        return abs(math.log(seconds / expected)) > self.cfg.z * self.cal.sd(sd)

    def graph_level(self, cfg):
        return replace(cfg, force_seeds=False), self.worth_measuring

    def worth_measuring(self, estimate: float, best: float | None) -> bool:
        """Graph-level: measure an individual only if its optimistic estimate can beat the best measured plan."""
        if best is None:
            return True
        return estimate / math.exp(self.cfg.z * self.cal.sd(0.0)) <= best

    def predict_partition(self, sg, backend) -> float:
        m, _ = self._prediction(Candidate(sg, backend, "partition"))
        return self.cal.adjusted(backend.name, m)

    # -- the report ------------------------------------------------------------------------
    def report_fields(self, tuner) -> dict[str, Any]:
        r = self.result
        if r is None:  # never reached the guided loop (a node no backend supports)
            return {"probe_measurements": self.probe_measurements, "probe_seconds": self.probe_seconds,
                    "predicted_candidates": 0, "pruned": 0,
                    "model_updates": 0, "cost_model": None,
                    "guided": {"rounds": 0, "new_measurements": 0, "fell_back_to_exhaustive": False,
                               "budget_hit": False}}
        cfg_keys = ("k", "z", "optimism", "prior_spread", "min_calibration", "min_tau", "measure_budget", "min_gain")
        return {
            "probe_measurements": self.probe_measurements,
            "probe_seconds": self.probe_seconds,
            "predicted_candidates": self.predicted,
            "pruned": r.pruned,
            "model_updates": tuner.feedback.updates,
            "cost_model": self.source,
            "guided": {
                "rounds": r.rounds,
                "new_measurements": r.new_measurements,
                "fell_back_to_exhaustive": r.fell_back,
                "budget_hit": r.budget_hit,
                "kendall_tau": r.tau,
                "bias": r.bias,
                "spread": r.spread,
                "config": {k: getattr(self.cfg, k) for k in cfg_keys},
                "whole_model_plans_skipped": self.e2e_skipped,
                "boundary_pairs_measured": self.boundary_pairs_measured,
            },
        }
