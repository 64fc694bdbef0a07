"""Close contests are settled head to head: the plans that could still win are timed again, alternately in
one process, and only those timings are compared (``search.judging.settle_close_contest``,
``measure.e2e.measure_head_to_head``)."""

from __future__ import annotations

import math

import pytest

from collage_ml.db import Database
from collage_ml.measure.timing import TimingConfig
from collage_ml.plan import Partition, Plan
from collage_ml.search.judging import HEAD_TO_HEAD_MARGIN, choose_plan, settle_close_contest

from .helpers import chain_model

FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0, warmup=1, warmup_seconds=0.0, min_repeats=3,
                    max_repeats=10, time_cap=0.05, processes=1, max_processes=1)


def plan(*backends):
    return Plan("m", [Partition(b, [i]) for i, b in enumerate(backends)])


def contest():
    plans = {"all-b": plan("b"), "graph-level": plan("b"), "all-a": plan("a"), "op-level": plan("a", "b"),
             "all-c": plan("c")}
    # all-a read 20% slow in its own window; all-c is far behind everything
    valid = {"all-b": {"valid": True, "median": 1.00}, "graph-level": {"valid": True, "median": 1.01},
             "all-a": {"valid": True, "median": 1.20}, "op-level": {"valid": True, "median": 1.30},
             "all-c": {"valid": True, "median": 2.00}}
    return plans, valid


def test_the_close_plans_are_timed_again_and_only_they_are_compared():
    plans, valid = contest()
    asked = []

    def duel(contenders):
        asked.append(sorted(contenders))
        return {"all-b": {"valid": True, "median": 1.00}, "all-a": {"valid": True, "median": 0.90},
                "op-level": {"valid": False, "error_text": "wrong numbers: y"}}

    assert HEAD_TO_HEAD_MARGIN >= 0.25  # a slow read of 20% must not decide
    assert choose_plan(valid, plans) == "all-b"  # what the earlier timings say
    done = settle_close_contest(valid, plans, duel)
    # one plan per canonical form (graph-level is all-b again), within the margin, all-c left out
    assert asked == [["all-a", "all-b", "op-level"]] and done["timed"] == 3
    assert set(valid) == {"all-a", "all-b", "graph-level"}  # op-level failed now, all-c was not in the contest
    assert valid["all-a"]["median"] == 0.90 and valid["all-a"]["earlier_median"] == 1.20
    assert valid["graph-level"]["median"] == 1.00 and valid["graph-level"]["earlier_median"] == 1.01
    assert done["plans"]["all-a"] == {"earlier_ms": pytest.approx(1200.0), "ms": pytest.approx(900.0)}
    assert done["plans"]["op-level"]["ms"] is None
    assert choose_plan(valid, plans) == "all-a"


def test_at_most_the_fastest_few_and_none_when_one_plan_stands_alone():
    plans, valid = contest()
    asked = []

    def duel(contenders):
        asked.append(sorted(contenders))
        return {k: {"valid": True, "median": 1.0} for k in contenders}

    settle_close_contest(valid, plans, duel, most=2)
    assert asked == [["all-a", "all-b"]]
    plans, valid = contest()
    assert settle_close_contest(valid, plans, duel, margin=0.1) is None  # all-b and its copy only
    assert len(asked) == 1 and valid["all-c"]["median"] == 2.00


def test_a_failed_duel_keeps_the_earlier_timings():
    plans, valid = contest()
    said = []
    done = settle_close_contest(valid, plans, lambda c: {k: {"valid": False, "error_text": "worker crashed"}
                                                         for k in c}, said.append)
    assert done["failed"] and len(valid) == 5 and valid["all-a"]["median"] == 1.20
    assert "keeping the earlier timings" in said[-1] and "worker crashed" in said[-1]


def test_head_to_head_times_real_plans_alternately_and_keeps_the_runs(tmp_path):
    from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend
    from collage_ml.ir.importers import from_onnx
    from collage_ml.measure.e2e import HEAD_TO_HEAD_MIN_ROUNDS, HEAD_TO_HEAD_ROUNDS, measure_head_to_head
    from collage_ml.measure.runner import Runner
    from tests.fake_backends import SlowFixture, WrongNumbersFixture

    g = from_onnx(chain_model(), name="chain")
    ref = g.reference()
    plans = {"fast": Plan.single(g, OnnxRuntimeBackend()), "slow": Plan.single(g, SlowFixture()),
             "wrong": Plan.single(g, WrongNumbersFixture())}
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=FAST) as r:
        got = measure_head_to_head(r, g, plans, ref)
        runs = [run for p in db.plan_timings() for run in p.runs]
    assert got["fast"]["valid"] and got["slow"]["valid"]
    assert not got["wrong"]["valid"] and "wrong numbers" in got["wrong"]["error_text"]
    for k in ("fast", "slow"):  # 2 ms apart in every round: decided after the first HEAD_TO_HEAD_MIN_ROUNDS
        assert len(got[k]["samples"]) == HEAD_TO_HEAD_MIN_ROUNDS < HEAD_TO_HEAD_ROUNDS
        assert got[k]["method"] == "head-to-head"
    # the slow plan is the fast one plus 2 ms of busy waiting per call
    assert got["slow"]["median"] - got["fast"]["median"] >= 0.9 * SlowFixture.DELAY
    assert got["fast"]["median"] < SlowFixture.DELAY
    assert sorted(run["status"] for run in runs) == ["invalid", "valid", "valid"]
    assert sorted(run.get("method", "") for run in runs) == ["", "head-to-head", "head-to-head"]


def test_a_reused_whole_model_timing_gets_a_wider_margin():
    """A native whole-model timing (guided mode reuses them) was taken in one stretch: 1.6x behind, it is still
    timed head to head; an end-to-end timing 1.6x behind is not."""
    from collage_ml.search.judging import HEAD_TO_HEAD_REUSED_MARGIN, REUSED_SOURCE

    plans = {"op-level": plan("b"), "all-a": plan("a")}
    asked = []

    def duel(contenders):
        asked.append(sorted(contenders))
        return {k: {"valid": True, "median": 1.0} for k in contenders}

    assert HEAD_TO_HEAD_REUSED_MARGIN >= 0.7  # slow periods read kernels up to about 1.7x slower (docs/results/noise.md)
    valid = {"op-level": {"valid": True, "median": 1.0}, "all-a": {"valid": True, "median": 1.6}}
    assert settle_close_contest(valid, plans, duel) is None and asked == []
    valid["all-a"]["source"] = REUSED_SOURCE
    assert settle_close_contest(valid, plans, duel)["timed"] == 2 and asked == [["all-a", "op-level"]]


def test_a_contest_is_decided_when_every_round_says_the_same_by_the_margin():
    from collage_ml.measure.e2e import HEAD_TO_HEAD_CLEAR, decided

    assert HEAD_TO_HEAD_CLEAR == pytest.approx(0.10)
    assert decided([[1.0, 1.0, 1.0], [1.2, 1.3, 1.15]])
    assert decided([[1.2, 1.3, 1.15], [1.0, 1.0, 1.0]])  # whichever plan leads
    # one round in which the other plan came within 10% (or ahead): not decided, whatever the medians say
    assert not decided([[1.0, 1.0, 1.0], [1.2, 1.05, 1.3]])
    assert not decided([[1.0, 1.0, 1.0], [1.2, 1.3, 1.3], [1.0, 1.0, 0.99]])
    # a slow period inside one round slows both plans of that round alike
    assert decided([[1.0, 1.8, 1.0], [1.2, 2.1, 1.2]])
    assert decided([[1.0]])


def test_whole_model_timings_stand_in_for_plans_and_a_surprising_one_goes_to_the_contest_first():
    """Guided mode reuses a whole model's native timing as its plan's (re-timing costs a compile and a window),
    except under REUSE_WHOLE_MODEL_TIMING_ABOVE. A timing far from its prediction is flagged, and enters the
    head-to-head ahead of plans that read faster, where it is within the reused margin: that is where a slow
    period's misread (nasnet's OpenVINO whole model at 17.6 ms against 10.1) is caught."""
    from types import SimpleNamespace as NS

    from collage_ml.search import judging

    def cand(name):
        return NS(backend=NS(name=name), key=("whole", name))

    cands = [cand(n) for n in ("openvino", "inductor", "onnxruntime", "torch")]
    cost_of = {("whole", "openvino"): 0.0176, ("whole", "inductor"): 0.360, ("whole", "onnxruntime"): 0.0134,
               ("whole", "torch"): 0.004}
    plans = {f"all-{c.backend.name}": NS(partitions=[NS(backend=c.backend.name)]) for c in cands}
    plans["op-level"] = NS(partitions=[NS(backend="openvino"), NS(backend="onnxruntime")])  # two partitions
    got = judging.reused_whole_model_timings(plans, cands, cost_of, lambda c, s: c.backend.name == "openvino")
    # torch's 4 ms is under the floor (a fast model's timings are re-timed); the op-level plan is no whole model
    assert sorted(got) == ["all-inductor", "all-onnxruntime", "all-openvino"]
    assert all(v["source"] == judging.REUSED_SOURCE and v["valid"] for v in got.values())
    assert [k for k, v in got.items() if v["surprising"]] == ["all-openvino"]

    # three plans read faster than the surprising one; the contest holds three: the fastest, then the flagged
    valid = {k: dict(v) for k, v in got.items()}
    valid["op-level"] = {"valid": True, "median": 0.0130}
    valid["graph-level"] = {"valid": True, "median": 0.0132}
    plans["graph-level"] = NS(partitions=[NS(backend="openvino"), NS(backend="torch")])
    for k, pl in plans.items():
        pl.canonical = (lambda k=k: (k,))
    seen = []

    def duel(contenders):
        seen.append(sorted(contenders))
        return {k: {"valid": True, "median": 0.010 if k == "all-openvino" else 0.013} for k in contenders}

    judging.settle_close_contest(valid, plans, duel)
    assert seen == [["all-openvino", "graph-level", "op-level"]]
    assert min(valid, key=lambda k: valid[k]["median"]) == "all-openvino"
