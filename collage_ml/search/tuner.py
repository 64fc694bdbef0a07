"""Placement: enumerate candidates, measure them, solve the op-level DP, judge plans end to end.

``mode="exhaustive"`` is Collage as published: every candidate is measured
(or read from the database, when this hardware measured it before). The DP
picks the cheapest cover by the sum of measured candidate costs plus measured
boundary costs. Then every plan worth considering is judged by its *executed*
end-to-end latency: the DP plan (after merging adjacent same-backend
regions) and, for every backend that can run the whole model, that backend
alone. How they are judged, and which one is kept, is :mod:`collage_ml.search.judging`'s
(the close contest is timed again head to head), so a placement is never slower than
the best single backend by more than noise.

``mode="guided"`` differs only in what it measures: the cost model predicts
every candidate and only what it cannot rule out is measured
(:class:`~collage_ml.search.strategies.Guided`, over the loop in
:mod:`collage_ml.search.guided`).

:class:`Tuner` runs this pipeline with one of the strategies of
:mod:`collage_ml.search.strategies` and owns the one measure step,
:meth:`Tuner.measure`: every candidate measured by ``place`` or ``collect``
goes through it, is committed to the database, and is handed once to the cost
model's feedback. The report is a :class:`~collage_ml.search.report.PlaceReport`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from collage_ml.backends.base import Backend, resolve_backends
from collage_ml.candidates import Candidate, enumerate_candidates
from collage_ml.cost import CandidateKey
from collage_ml.db import default_db_path
from collage_ml.defaults import MAX_REGION_SIZE
from collage_ml.errors import CollageError, describe
from collage_ml.ir.graph import Graph
from collage_ml.measure.e2e import measure_head_to_head, measure_plan
from collage_ml.measure.runner import Runner
from collage_ml.measure.timing import Tolerance, TimingConfig
from collage_ml.placed import PlacedModel
from collage_ml.plan import Plan
from collage_ml.search.evolutionary import EvoConfig, GraphLevelSearch
from collage_ml.search.failures import FailureLog, no_cover_reason, uncovered_nodes
from collage_ml.search.guided import GuidedConfig
from collage_ml.search.judging import (choose_plan, measure_plans_e2e, reused_whole_model_timings,
                                      settle_close_contest)
from collage_ml.search.report import PlaceReport
from collage_ml.search.strategies import Exhaustive, Guided, Problem, Strategy

MODES = ("exhaustive", "guided")


@dataclass
class PlaceResult:
    placed: PlacedModel
    report: PlaceReport
    plans: dict[str, dict] = field(default_factory=dict)  # label -> e2e result


class Tuner:
    """Measures what its strategy decides, and closes the feedback loop: the one measure step.

    :meth:`measure` runs candidates through the :class:`~collage_ml.measure.runner.Runner`, which
    commits each measurement to the database as it arrives (cache hits are read, not run again), and
    hands every *new* measurement, once, to ``feedback`` (a :class:`~collage_ml.models.feedback.Feedback`,
    or None: nothing to update). :meth:`flush` updates and saves the cost model with what it was handed.
    ``place`` (through :meth:`place`) and ``collect`` measure candidates only through this step.

    :meth:`place` is the placement pipeline of the module docstring; ``strategy``
    (:mod:`collage_ml.search.strategies`) decides what it measures.
    """

    def __init__(self, runner: Runner, strategy: Strategy | None = None, feedback: Any = None,
                 log: Callable[[str], None] | None = None):
        self.runner = runner
        self.strategy = strategy if strategy is not None else Exhaustive()
        self.feedback = feedback
        self.say = log or (lambda s: None)
        self.new = 0  # measurements made and committed through this tuner
        self.failures: FailureLog | None = None  # set by place (per graph)

    def measure(self, candidates: Sequence[Candidate], reference, family: str | None = None,
                on_result: Callable[[Candidate, Any, bool], None] | None = None) -> list:
        """Measures ``candidates`` (results align with them) and feeds the new measurements back.

        ``on_result(candidate, measurement, new)`` is called once per distinct candidate; ``new`` is False
        for a cache hit and for a measurement the database refused (another process committed it first).
        """
        def seen(c, m, cached):
            new = not cached and getattr(m, "committed", True)
            if new:
                self.new += 1
                if self.feedback is not None:
                    self.feedback.add([(c, m)])
            if on_result is not None:
                on_result(c, m, new)

        return self.runner.measure(candidates, reference, family, on_result=seen)

    def flush(self, family: str = "") -> dict | None:
        """Updates (and saves) the cost model with the new measurements; None when there was nothing to learn."""
        return self.feedback.flush(family) if self.feedback is not None else None

    def op_level(self, p: Problem):
        """The strategy's op-level stage on ``p``: measure what it decides, solve the DP
        (an :class:`~collage_ml.search.strategies.OpLevel`); failures are logged in :attr:`failures`."""
        self.failures = FailureLog(p.graph)
        return self.strategy.op_level(self, p)

    def place(self, p: Problem, *, family: str, tolerance: Tolerance, graph_level: bool,
              evo_config: EvoConfig | None, t_start: float) -> PlaceResult:
        """The op-level stage, the fallback, the end-to-end judging and the graph-level search (module
        docstring); the fastest plan measured end to end is compiled, checked and reported."""
        graph, backends, cands, runner, say = p.graph, p.backends, p.cands, self.runner, self.say
        baselines = list(p.baselines)
        # a node no backend supports cannot be covered whatever the measurements say: straight to the fallback
        if uncovered_nodes(graph, cands, {c.key: 1.0 for c in cands}):
            fallback = no_cover_reason(graph, cands, {c.key: 1.0 for c in cands}, None, backends)
            self.failures = FailureLog(graph)
            cost_of, dp, table, dp_seconds, context = {}, None, None, 0.0, None
        else:
            op = self.op_level(p)
            dp, cost_of, table, dp_seconds, budget_hit = op.dp, op.cost_of, op.table, op.dp_seconds, op.budget_hit
            context = op.context
            fallback = None
            if dp is None:
                fallback = no_cover_reason(graph, cands, cost_of, self.failures, backends)
                if budget_hit:
                    fallback += " (measure_budget ran out: raise it, or use mode='exhaustive')"
        failures = self.failures
        # a backend failing most candidates the same way is said once, not candidate by candidate
        for line in failures.summary_lines():
            say(f"systematic failure: {line}")
        common = dict(hardware=runner.hardware, threads=runner.threads,
                      versions={k: v for b in backends for k, v in b.versions().items()})
        plans: dict[str, Plan] = {}
        dp_plan = None
        if dp is not None:
            dp_plan = Plan.from_candidates(graph, dp.choice, dp.per_candidate, predicted_ms=dp.cost * 1e3, **common)
            plans["op-level"] = dp_plan
        else:
            say(f"no finer plan: {fallback}; trying the whole model on each backend")
            baselines = baselines + _fallback_baselines(graph, backends, baselines)
            need = list({c.key: c for c in baselines if c.key not in cost_of}.values())
            if need:
                ms = self.measure(need, p.ref)
                failures.add(zip(need, ms))
                cost_of.update({c.key: (m.median if m.valid else None) for c, m in zip(need, ms)})
        baseline_ms: dict[str, float | None] = {b.name: None for b in backends}
        baseline_pred_ms: dict[str, float] = {}
        for c in baselines:
            cst = cost_of.get(c.key)
            baseline_ms[c.backend.name] = None if cst is None else cst * 1e3
            if cst is not None:
                plans[f"all-{c.backend.name}"] = Plan.single(graph, c.backend, predicted_ms=cst * 1e3, **common)
            elif dp is not None and c.key not in cost_of:
                # not measured as a kernel (guided): judged end to end only if the model says it may win
                est, worth = self.strategy.judge_whole_model(c, dp.cost)
                if est is not None:
                    baseline_pred_ms[c.backend.name] = est * 1e3
                if worth:
                    plans[f"all-{c.backend.name}"] = Plan.single(graph, c.backend, predicted_ms=est * 1e3, **common)
        # judge by executed end-to-end latency, every plan through the same executor; the close ones are
        # then timed head to head (judging.py). A plan equal to another is measured once.
        known_plans = (reused_whole_model_timings(plans, baselines, cost_of, self.strategy.surprising)
                       if self.strategy.reuse_whole_model_timings else {})
        results, e2e_count = measure_plans_e2e(runner, graph, plans, p.ref, say, known_plans)
        evo = None
        region_names = [b.name for b in backends if any(pt.kind == "region" for pt in b.patterns)]
        if dp is None and not results:
            tried = "; ".join(f"{c.backend.name}: {failures.errors.get(c.backend.name, {}).get(c.key)}"
                              for c in baselines)
            raise CollageError(f"no plan: {fallback}, and "
                               + (f"no backend ran the whole model ({tried})" if tried else
                                  "no backend supports the whole model"))
        if graph_level and region_names and dp is not None and results["op-level"].get("valid"):
            evo = _graph_level(runner, graph, dp_plan, backends, region_names, plans, results, p.ref,
                               cost_of, table, evo_config, say, self.strategy, context)
            if evo.best is not None:
                plans["graph-level"] = evo.best.plan
                results["graph-level"] = {"valid": True, "median": evo.best.seconds}
        valid = {k: v for k, v in results.items() if v.get("valid")}
        if not valid:
            errors = "; ".join(f"{k}: {v.get('error_text')}" for k, v in results.items())
            raise CollageError(f"no plan ran correctly end to end ({errors})"
                               + (f"; no finer plan: {fallback}" if fallback else ""))
        head_to_head = settle_close_contest(
            valid, plans, lambda contenders: measure_head_to_head(runner, graph, contenders, p.ref), say)
        if head_to_head is not None:
            e2e_count += head_to_head["timed"]
        best_label = choose_plan(valid, plans)
        best = plans[best_label]
        best.measured_ms = valid[best_label]["median"] * 1e3
        single_e2e = {
            b.name: (results[f"all-{b.name}"]["median"] * 1e3
                     if results.get(f"all-{b.name}", {}).get("valid") else None)
            for b in backends
        }
        placed = best.compile(graph, threads=runner.threads)
        check = _check(placed, graph, p.ref, tolerance)
        # e2e and graph-level measurements are plans, not candidates: the model learns from kernels only
        info = self.flush(family or graph.name)
        report = PlaceReport(
            model=graph.name,
            mode=self.strategy.name,
            hardware=runner.hardware,
            threads=runner.threads,
            backends=[b.name for b in backends],
            chosen=best_label,
            plan_latency_ms=best.measured_ms,
            op_level_predicted_ms=dp.cost * 1e3 if dp is not None else None,
            op_level_ms=results["op-level"]["median"] * 1e3 if results.get("op-level", {}).get("valid") else None,
            op_level_plan=dp_plan.to_dict() if dp_plan is not None else None,
            fallback=fallback,
            import_=list(graph.import_notes),
            invalid_by_backend=failures.by_backend(),
            systematic_failures=failures.systematic(),
            # the head-to-head's timing where the graph-level plan was in the close contest, its own otherwise
            graph_level_ms=(results["graph-level"]["median"] * 1e3 if results.get("graph-level", {}).get("valid")
                            else evo.best.seconds * 1e3 if evo is not None and evo.best is not None else None),
            generations=evo.generations if evo is not None else 0,
            e2e_measurements=(evo.e2e_measurements if evo is not None else 0) + e2e_count,
            baselines_ms=baseline_ms,
            baselines_e2e_ms=single_e2e,
            plans_e2e_ms={k: (v["median"] * 1e3 if v.get("valid") else None) for k, v in results.items()},
            plan_errors={k: v.get("error_text") for k, v in results.items() if not v.get("valid")},
            speedup_vs_best_single=_speedup(best.measured_ms, single_e2e),
            measurements=runner.measured,
            **self.strategy.report_fields(self),
            baselines_predicted_ms=baseline_pred_ms,
            cache_hits=runner.cache_hits,
            cache_drift=dict(runner.drift),
            anchor_measurements=runner.anchor_measurements,
            candidates=len(cands),
            distinct_candidates=len({c.key for c in cands}),
            dp_states=dp.states if dp is not None else 0,
            dp_limit_hit=dp.limit_hit if dp is not None else False,
            dp_seconds=dp_seconds,
            search_seconds=time.perf_counter() - t_start,
            max_abs_error=check.max_abs,
            outputs_match=check.ok,
            mismatch=check.detail,
            head_to_head=head_to_head,
            partitions=[
                {"backend": pt.backend, "nodes": len(pt.nodes), "predicted_ms": pt.predicted_ms,
                 "measured_ms": pt.measured_ms}
                for pt in placed.plan.partitions
            ],
            dp_overhead_ms=dp.overhead_cost * 1e3 if dp is not None and context else None,
            in_context_us={r.pop("backend"): r for r in context.rows()} if context else {},
            model_saved_to=info.get("saved_to") if info else None,
        )
        placed.report = report
        return PlaceResult(placed, report, results)


def _open_db(db):
    from collage_ml.db import Database

    if db is None:
        path = default_db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        return Database(path), True
    if isinstance(db, (str, Path)):
        return Database(db), True
    return db, False


def place(
    graph: Graph,
    backends: Sequence[Backend] | str | None = None,
    mode: str = "exhaustive",
    db=None,
    *,
    max_region_size: int = MAX_REGION_SIZE,
    threads: int | None = None,
    timing: TimingConfig = TimingConfig(),
    tolerance: Tolerance = Tolerance(),
    timeout: float = 300.0,
    progress: bool = True,
    family: str = "",
    log: Callable[[str], None] | None = None,
    graph_level: bool = True,
    evo_config: EvoConfig | None = None,
    cost_model: Any = "default",
    measure_budget: int | None = None,
    guided_config: GuidedConfig | None = None,
    stale_after_hours: float | None = None,
    in_context: bool = True,
) -> PlaceResult:
    """Places ``graph`` on ``backends`` (default: the CPU default set). See the module docstring.

    When no combination of valid candidates covers the graph, the plan is the
    whole model on the fastest backend that ran it (onnxruntime is always
    tried: it ran the reference), and ``report["fallback"]`` says why nothing
    finer was possible. Any error from the search reaches the caller as a
    :class:`CollageError` (one line in the CLI), never as a bare exception.
    """
    try:
        return _place(graph, backends, mode, db, max_region_size=max_region_size, threads=threads, timing=timing,
                      tolerance=tolerance, timeout=timeout, progress=progress, family=family, log=log,
                      graph_level=graph_level, evo_config=evo_config, cost_model=cost_model,
                      measure_budget=measure_budget, guided_config=guided_config,
                      stale_after_hours=stale_after_hours, in_context=in_context)
    except (CollageError, ValueError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise CollageError(f"placement of {graph.name} failed: {describe(e)} (--debug shows the traceback)") from e


def _place(graph, backends, mode, db, *, max_region_size, threads, timing, tolerance, timeout, progress, family, log,
           graph_level, evo_config, cost_model, measure_budget, guided_config, stale_after_hours,
           in_context=True) -> PlaceResult:
    if mode not in MODES:
        raise CollageError(f"unknown mode {mode!r}; available: {', '.join(MODES)}")
    if max_region_size < 1:
        raise ValueError(f"max_region_size must be >= 1, got {max_region_size}")
    if stale_after_hours is not None and not stale_after_hours >= 0:
        raise ValueError(f"stale_after_hours must be >= 0, got {stale_after_hours}")
    t_start = time.perf_counter()
    backends = list(backends) if isinstance(backends, (list, tuple)) else resolve_backends(backends)
    if not backends:
        raise CollageError("no backend is available")
    say = log or (lambda s: None)
    database, owned = _open_db(db)
    try:
        with Runner(db=database, threads=threads, timing=timing, tolerance=tolerance, timeout=timeout,
                    family=family or graph.name,
                    stale_after=None if stale_after_hours is None else stale_after_hours * 3600.0) as runner:
            ref = graph.reference()
            for note in graph.import_notes:
                say(f"import: {note}")
            cands = list(enumerate_candidates(graph, backends, max_region_size=max_region_size))
            whole = graph.whole()
            # every backend that supports every node gets its whole-model baseline measured natively
            baselines = [Candidate(whole, b, "whole-model") for b in backends if b.supports_subgraph(whole)]
            todo = cands + [c for c in baselines
                            if not any(x.backend is c.backend and x.subgraph.mask == whole.mask for x in cands)]
            say(f"{graph.name}: {len(graph)} nodes, {len(cands)} candidates ({len({c.key for c in todo})} distinct) "
                f"on {', '.join(b.name for b in backends)}")
            if mode == "guided":
                cfg = replace(guided_config or GuidedConfig(),
                              **({} if measure_budget is None else {"measure_budget": measure_budget}))
                strategy: Strategy = Guided(cost_model, getattr(database, "path", None), progress, cfg, in_context)
            else:
                strategy = Exhaustive(progress, in_context)
            tuner = Tuner(runner, strategy, log=say)
            return tuner.place(Problem(graph, backends, cands, baselines, todo, ref), family=family,
                               tolerance=tolerance, graph_level=graph_level, evo_config=evo_config, t_start=t_start)
    finally:
        if owned:
            database.close()


def _fallback_baselines(graph: Graph, backends: Sequence[Backend], have: Sequence[Candidate]) -> list[Candidate]:
    """Whole-model candidates for the fallback that the normal baselines lack: onnxruntime's always (it ran
    the reference, so it may run the whole model even where its probe declined a node alone)."""
    from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend

    whole = graph.whole()
    return [Candidate(whole, b, "whole-model") for b in backends
            if isinstance(b, OnnxRuntimeBackend) and not any(x.backend is b for x in have)]


def _graph_level(runner, graph, dp_plan, backends, region_names, plans, results, ref, cost_of, table,
                 config, say, strategy: Strategy, context=None):
    """Runs the evolutionary search seeded with the already measured plans."""
    by_name = {b.name: b for b in backends}
    known = {plans[k].canonical(): ((v["median"] if v.get("valid") else None), v.get("error_text", ""))
             for k, v in results.items()}

    def fitness(plan: Plan):
        r = measure_plan(runner, graph, plan, ref)
        return (r["median"] if r.get("valid") else None), r.get("error_text", "")

    def estimate(plan: Plan) -> float:
        total = 0.0
        owner = {}
        for k, p in enumerate(plan.partitions):
            for n in p.nodes:
                owner[n] = k
        for k, p in enumerate(plan.partitions):
            b = by_name[p.backend]
            sg = graph.subgraph(p.mask)
            key = CandidateKey(sg.hash, b.name, b.version)
            cost = cost_of.get(key)
            if cost is None:
                m = runner.lookup(key)
                cost = m.median if m is not None and m.valid else None
            if cost is None:
                cost = strategy.predict_partition(sg, b)
            if cost is None:
                # not measured as one piece: the sum of its op-level groups' costs, on any backend
                cost = sum((g.measured_ms or 0.0) / 1e3 for g in dp_plan.partitions if not g.mask & ~p.mask)
            total += cost
            if context and len(plan.partitions) > 1:
                total += context.partition_seconds(graph, p.backend, sg)
            for t in sg.inputs:
                if t in graph.producer and owner[graph.producer[t]] != k:
                    src = plan.partitions[owner[graph.producer[t]]].backend
                    total += table.seconds(src, p.backend, graph.tensors[t].nbytes)
        return total

    cfg, worth = strategy.graph_level(config or EvoConfig())
    say(f"graph-level search: {len(dp_plan.partitions)} groups, {len(region_names)} region backends, "
        f"up to {cfg.generations} generations")
    search = GraphLevelSearch(graph, dp_plan, region_names, fitness, estimate, cfg, known=known,
                              specs={n: by_name[n].spec() for n in region_names}, worth=worth)
    return search.run()


def _speedup(plan_ms: float, baselines: Mapping[str, float | None]) -> float | None:
    vals = [v for v in baselines.values() if v]
    return min(vals) / plan_ms if vals and plan_ms else None


def _check(placed: PlacedModel, graph: Graph, ref, tolerance: Tolerance):
    from collage_ml.backends.base import to_numpy
    from collage_ml.measure.timing import compare

    out = placed.run({n: ref[n] for n in graph.input_names})
    names = list(graph.output_names)
    return compare([to_numpy(out[n]) for n in names], {n: ref[n] for n in names}, names, tolerance)
