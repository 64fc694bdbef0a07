"""The Tuner: its strategies decide what is measured, and its one measure step commits and feeds back.

Deterministic: a Runner whose candidates cost what a table says (no worker process is started), the
fake backends of tests/fake_backends.py (via tests/test_dp.py's A and B), its random DAGs, and a cost model that
predicts the table. A real database counts the commits.
"""

from __future__ import annotations

import math
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from collage_ml.db import Database
from collage_ml.measure.runner import Runner
from collage_ml.measure.timing import TimingConfig
from collage_ml.models.base import CostModel
from collage_ml.search.dp import solve
from collage_ml.search.guided import GuidedConfig
from collage_ml.search.report import PlaceReport
from collage_ml.search.strategies import Exhaustive, Guided, Problem
from collage_ml.search.tuner import Tuner
from tests.test_dp import A, B, all_candidates, random_dag
from tests.test_guided import true_costs


class _NoWorker:
    """Stands in for a worker process: a boundary (hand-off) costs nothing."""

    def run(self, task, timeout):
        return {"valid": True, "median": 0.0, "samples": [0.0], "spread": 0.0}


class TableRunner(Runner):
    """The real Runner (cache lookups, de-duplication, commits), with latencies from ``costs`` (key ->
    seconds, None: invalid) instead of worker processes. ``runs`` counts how often each key was run."""

    def __init__(self, costs, db=None):
        super().__init__(db=db, threads=1, timing=TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                                                               processes=1, max_processes=1))
        self.costs = costs
        self.runs: Counter = Counter()

    def worker_for(self, backends, index=0):
        return _NoWorker()

    def measure_chunks(self, chunks, reference, family=""):
        out = []
        for chunk in chunks:
            out.append([])
            for c in chunk:
                self.runs[c.key] += 1
                t = self.costs[c.key]
                r = ({"valid": True, "median": t, "samples": [t], "spread": 0.0} if t is not None
                     else {"valid": False, "error_text": "the table says invalid"})
                out[-1].append(self._measurement(c, r, family))
        return out


class TableModel(CostModel):
    """Predicts the table's latency (by candidate key) with a small log-space spread; records updates."""

    kind = "fixture-table"

    uses_probes = False  # a table of latencies: the machine does not enter

    def __init__(self, costs=None, sd: float = 0.01):
        super().__init__(sd=sd)
        self.costs = dict(costs or {})
        self.updates_seen: list[int] = []

    def fit(self, data):
        return self

    def update(self, new):
        self.updates_seen.append(len(new))
        return {"n": len(new)}

    def predict_log(self, samples):
        mu = np.log([self.costs[s.key] for s in samples])
        return mu, np.full(len(samples), float(self.params["sd"]))

    def _save_payload(self, directory: Path) -> dict:
        return {}

    def _load_payload(self, directory: Path, meta: dict) -> None:
        pass


class Recorder:
    """A feedback that records what it is handed."""

    def __init__(self):
        self.pairs = []
        self.flushed = 0

    def add(self, pairs):
        self.pairs.extend(pairs)

    def flush(self, family=""):
        self.flushed += 1
        return None


def _case(seed: int, n: int = 7):
    """A random DAG, every candidate on two fake backends, a cost per distinct key, and the true optimum."""
    graph = random_dag(n, seed)
    cands = all_candidates(graph)
    costs: dict = {}
    for c, t in zip(cands, true_costs(cands, seed)):
        costs.setdefault(c.key, t)  # isomorphic subgraphs share a key, hence a measurement
    best = solve(graph, cands, [costs[c.key] for c in cands])
    return graph, cands, costs, best


def _problem(graph, cands):
    return Problem(graph, [A, B], cands, [], list(cands), {})


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "m.db") as d:
        commits: Counter = Counter()
        real = d.commit

        def commit(m):
            commits[m.key] += 1
            return real(m)

        d.commit = commit
        d.commits = commits
        yield d


def _candidate_commits(db):
    return Counter({k: v for k, v in db.commits.items() if not k.subgraph_hash.startswith("boundary:")})


@pytest.mark.parametrize("seed", range(3))
def test_exhaustive_measures_every_candidate_once(seed, db):
    graph, cands, costs, best = _case(seed)
    runner = TableRunner(costs, db)
    op = Tuner(runner, Exhaustive()).op_level(_problem(graph, cands))
    assert set(runner.runs) == set(costs) and set(runner.runs.values()) == {1}
    assert set(_candidate_commits(db)) == set(costs) and set(_candidate_commits(db).values()) == {1}
    assert runner.measured == len(costs) and op.table.points  # hand-offs were measured too (at no cost here)
    assert op.dp.cost == pytest.approx(best.cost, rel=1e-12)
    assert set(op.cost_of) == set(costs)
    # again on the same database: every candidate is a cache hit, nothing is run or committed
    again = TableRunner(costs, db)
    db.commits.clear()
    op2 = Tuner(again, Exhaustive()).op_level(_problem(graph, cands))
    assert not again.runs and not db.commits and again.cache_hits == len(costs)
    assert op2.dp.cost == pytest.approx(best.cost, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_guided_measures_fewer_and_finds_the_optimum(seed, db):
    graph, cands, costs, best = _case(seed)
    model = TableModel(costs)
    runner = TableRunner(costs, db)
    tuner = Tuner(runner, Guided(model, None, False, GuidedConfig()))
    op = tuner.op_level(_problem(graph, cands))
    assert op.dp.cost == pytest.approx(best.cost, rel=1e-12)
    measured = set(runner.runs)
    assert 0 < len(measured) < len(costs) and set(runner.runs.values()) == {1}
    assert set(_candidate_commits(db)) == measured and set(_candidate_commits(db).values()) == {1}
    # every chosen candidate was measured: a prediction never stands in for a measurement
    assert {c.key for c in op.dp.choice} <= measured
    # each new measurement went to the model's feedback once, and reaches the model on flush
    fed = Counter(c.key for c, _ in tuner.feedback.pairs)
    assert set(fed) == measured and set(fed.values()) == {1}
    assert tuner.flush("dag") is not None and model.updates_seen == [len(measured)]
    rep = tuner.strategy.report_fields(tuner)
    assert rep["pruned"] == len(costs) - len(measured) and rep["model_updates"] == 1
    assert rep["guided"]["new_measurements"] == len(measured)


def test_measure_commits_and_feeds_back_once_per_new_candidate(db):
    graph, cands, costs, _ = _case(0, n=5)
    costs[cands[0].key] = None  # one invalid: committed and fed back like any other (the model skips it)
    runner = TableRunner(costs, db)
    fb = Recorder()
    tuner = Tuner(runner, feedback=fb)
    seen = []
    ms = tuner.measure(cands + cands[:4], {}, on_result=lambda c, m, new: seen.append((c.key, new)))
    assert len(ms) == len(cands) + 4 and [m.key for m in ms] == [c.key for c in cands + cands[:4]]
    assert Counter(k for k, _ in seen) == Counter(set(costs)) and all(new for _, new in seen)
    assert db.commits == Counter(set(costs))
    assert Counter(c.key for c, _ in fb.pairs) == Counter(set(costs))
    assert tuner.new == len(costs) == runner.measured
    # a second time: cache hits, not run, not committed, not fed back
    db.commits.clear()
    seen.clear()
    tuner.measure(cands, {}, on_result=lambda c, m, new: seen.append((c.key, new)))
    assert not db.commits and not any(new for _, new in seen) and len(fb.pairs) == len(costs)
    assert set(runner.runs.values()) == {1}


def test_measure_does_not_feed_back_what_the_database_refused(tmp_path):
    graph, cands, costs, _ = _case(1, n=4)
    with Database(tmp_path / "m.db") as d:
        refused = cands[0].key
        real = d.commit
        d.commit = lambda m: False if m.key == refused else real(m)  # another process committed it first
        fb = Recorder()
        tuner = Tuner(TableRunner(costs, d), feedback=fb)
        news = {}
        tuner.measure(cands, {}, on_result=lambda c, m, new: news.__setitem__(c.key, new))
        assert news[refused] is False and all(v for k, v in news.items() if k != refused)
        assert refused not in {c.key for c, _ in fb.pairs} and len(fb.pairs) == len(costs) - 1


def test_flush_without_feedback_is_none():
    assert Tuner(TableRunner({})).flush("x") is None


# ----------------------------------------------------------------------------- the report

#: the report's JSON keys, in order, as `place --report` has always written them (the two probe keys and
#: head_to_head since #16; the in-context pair since stop 40)
KEYS = ["model", "mode", "hardware", "threads", "backends", "chosen", "plan_latency_ms", "op_level_predicted_ms",
        "op_level_ms", "op_level_plan", "fallback", "import", "invalid_by_backend", "systematic_failures",
        "graph_level_ms", "generations", "e2e_measurements", "baselines_ms", "baselines_e2e_ms", "plans_e2e_ms",
        "plan_errors", "speedup_vs_best_single", "measurements", "probe_measurements", "probe_seconds",
        "predicted_candidates", "pruned", "model_updates", "cost_model", "guided", "baselines_predicted_ms", "cache_hits", "cache_drift", "anchor_measurements", "candidates", "distinct_candidates",
        "dp_states", "dp_limit_hit", "dp_seconds", "search_seconds", "max_abs_error", "outputs_match", "mismatch",
        "head_to_head", "partitions", "dp_overhead_ms", "in_context_us"]


def _report(**kw):
    values = {k: None for k in KEYS}
    values.update(model="m", mode="exhaustive", partitions=[{"backend": "fake-a", "nodes": 3}], **kw)
    values["import_"] = values.pop("import")
    return PlaceReport(**values)


def test_report_keys_and_dict_access():
    rep = _report()
    assert list(rep.as_dict()) == KEYS and list(rep) == KEYS and len(rep) == len(KEYS)
    assert json.loads(rep.to_json()) == json.loads(json.dumps(dict(rep)))
    assert rep["model"] == "m" and rep.get("import") is None and "model_saved_to" not in rep
    assert rep.get("nope", 7) == 7
    rep["outputs_match"] = False
    assert rep.outputs_match is False and rep["outputs_match"] is False
    with pytest.raises(KeyError):
        rep["nope"] = 1
    # a guided run that reached its cost model says where the updated model went
    g = _report(cost_model="given", model_saved_to="/x/cost-models/y")
    assert list(g) == KEYS + ["model_saved_to"] and g["model_saved_to"] == "/x/cost-models/y"
    assert g == dict(g.as_dict()) and g != rep


def test_guided_strategy_is_the_only_one_that_needs_a_cost_model():
    # the exhaustive strategy answers every question without predictions
    s = Exhaustive()
    c = all_candidates(random_dag(3, 0))[0]
    assert s.judge_whole_model(c, 1.0) == (None, False) and s.predict_partition(c.subgraph, A) is None
    assert s.report_fields(None)["cost_model"] is None and not s.reuse_whole_model_timings
    g = Guided(TableModel({}))
    assert g.report_fields(None)["guided"]["rounds"] == 0 and not g.reuse_whole_model_timings


def test_a_mixed_plan_must_beat_the_best_single_backend_plan_by_the_margin():
    """End-to-end noise must not pick a mixed plan: within MIXED_PLAN_MARGIN the one-partition plan is kept."""
    from collage_ml.plan import Partition, Plan
    from collage_ml.search.judging import MIXED_PLAN_MARGIN, choose_plan

    def plan(*backends):
        return Plan("m", [Partition(b, [i]) for i, b in enumerate(backends)])

    plans = {"op-level": plan("openvino", "onnxruntime"), "all-openvino": plan("openvino"),
             "all-onnxruntime": plan("onnxruntime")}

    def res(mixed, ov, ort=1.0):
        return {"op-level": {"median": mixed}, "all-openvino": {"median": ov}, "all-onnxruntime": {"median": ort}}

    assert MIXED_PLAN_MARGIN == pytest.approx(0.05)
    assert choose_plan(res(0.879, 0.904), plans) == "all-openvino"  # 2.8% ahead: noise, not a win
    assert choose_plan(res(0.80, 0.904), plans) == "op-level"  # 11.5% ahead: a real gain
    assert choose_plan(res(0.95, 0.904), plans) == "all-openvino"  # the fastest is single anyway
    assert choose_plan(res(0.879, 0.904), plans, margin=0.0) == "op-level"
    only_mixed = {"op-level": plans["op-level"]}
    assert choose_plan({"op-level": {"median": 1.0}}, only_mixed) == "op-level"


class _LabelPlan:
    """The parts of a Plan that the end-to-end rounds read: a canonical form and the partitions."""

    def __init__(self, name: str):
        self.name, self.partitions = name, [name]

    def canonical(self):
        return (self.name,)


def test_a_plan_caught_in_a_slow_period_in_round_one_is_timed_again(monkeypatch):
    """Round one reads plan b 25% behind a (a slow period); round two, in another process, finds b faster.
    A plan within SECOND_ROUND_MARGIN of the first round's best gets its second look; one far behind does not."""
    from collage_ml.search import judging

    reads = {("a", 0): 1.00, ("b", 0): 1.25, ("c", 0): 3.0, ("a", 1): 1.02, ("b", 1): 0.90, ("c", 1): 0.5}
    calls = _fake_rounds(monkeypatch, reads)
    plans = {k: _LabelPlan(k) for k in "abc"}
    results, count = judging.measure_plans_e2e(None, None, plans, {}, lambda s: None, contest=None)
    assert judging.SECOND_ROUND_MARGIN >= 0.25
    assert ("b", 1) in calls and ("c", 1) not in calls and count == 5
    assert results["b"]["median"] == 0.90 and results["a"]["median"] == 1.00 and results["c"]["median"] == 3.0
    assert min(results, key=lambda k: results[k]["median"]) == "b"


def _fake_rounds(monkeypatch, reads):
    from collage_ml.search import judging

    calls = []

    def fake_measure_plan(runner, graph, plan, ref, process=0):
        calls.append((plan.name, process))
        return {"valid": True, "median": reads[(plan.name, process)]}

    monkeypatch.setattr(judging, "measure_plan", fake_measure_plan)
    return calls


def test_round_two_is_left_to_the_head_to_head_when_it_holds_every_close_plan(monkeypatch):
    """Two close plans and one far behind: the head-to-head that follows times both close plans again and
    replaces their timings, so round two is not run at all (one read per plan); with four close plans and
    room for three in a contest, round two runs on the close ones, to pick which three enter."""
    from collage_ml.search import judging

    reads = {(k, r): v for k, v in {"a": 1.0, "b": 1.25, "c": 3.0, "d": 1.1, "e": 1.2}.items() for r in (0, 1)}
    calls = _fake_rounds(monkeypatch, reads)
    plans = {k: _LabelPlan(k) for k in "abc"}
    results, count = judging.measure_plans_e2e(None, None, plans, {}, lambda s: None)
    assert count == 3 and all(p == 0 for _, p in calls) and results["b"]["median"] == 1.25

    calls.clear()
    plans = {k: _LabelPlan(k) for k in "abcde"}
    results, count = judging.measure_plans_e2e(None, None, plans, {}, lambda s: None, contest=3)
    assert sorted(n for n, p in calls if p == 1) == ["a", "b", "d", "e"] and count == 9

    calls.clear()  # a plan already timed whole (guided) counts among the close ones, and is not run again
    plans = {k: _LabelPlan(k) for k in "abcd"}
    known = {"d": {"valid": True, "median": 1.05, "source": judging.REUSED_SOURCE}}
    results, count = judging.measure_plans_e2e(None, None, plans, {}, lambda s: None, known=known, contest=2)
    assert sorted(n for n, p in calls if p == 1) == ["a", "b"] and ("d", 0) not in calls and count == 5


def test_a_whole_model_timing_far_from_its_prediction_is_confirmed_end_to_end():
    """Guided mode reuses a slow model's native whole-model timing instead of an end-to-end run, except where
    the timing is far from the prediction: a slow period read nasnet's OpenVINO whole model 1.7x slow."""
    from collage_ml.candidates import Candidate
    from collage_ml.featurize.hardware import HardwareDesc
    from collage_ml.search.guided import BiasCorrection, GuidedConfig

    c = Candidate(random_dag(3, 0).whole(), A)
    g = Guided(TableModel({c.key: 0.010}, sd=0.05))
    g.model, g.hw, g.cal = g.spec, HardwareDesc.current(1), BiasCorrection(GuidedConfig())
    assert not g.surprising(c, 0.011)  # 10% off: inside sqrt(0.05^2 + 0.2^2) before calibration
    assert g.surprising(c, 0.0176) and g.surprising(c, 0.006)
    assert not Exhaustive().surprising(c, 1.0)
    # once calibrated, a backend that reads 1.7x its predictions everywhere is expected to: not a surprise
    g.cal.fit([("fake-a", 1.0, 1.7)] * 6)
    assert g.cal.calibrated and not g.surprising(c, 0.0176)
