"""Exhaustive placement end to end: real backends, real measurements, a real database."""

import math
import json

import pytest

import collage_ml
from collage_ml.cli import main
from collage_ml.db import Database
from collage_ml.ir import zoo
from collage_ml.measure.timing import TimingConfig
from collage_ml.search.evolutionary import EvoConfig
from collage_ml.search.judging import MIXED_PLAN_MARGIN

# one process per candidate: these tests are about placement and storage, not the protocol (test_protocol.py)
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=15, time_cap=0.1, processes=1, max_processes=1)
TINY = [n for n in zoo.names() if n.endswith("-tiny")]
REPORT_KEYS = {"model", "mode", "hardware", "plan_latency_ms", "baselines_ms", "measurements", "cache_hits",
               "candidates", "search_seconds", "max_abs_error", "partitions"}


@pytest.mark.parametrize("model", TINY)
def test_place_every_tiny_model_matches_reference(model, tmp_path):
    pm = collage_ml.place(model, backends="onnxruntime,openvino,torch", db=tmp_path / "m.db",
                          max_region_size=2, timing=FAST,
                          evo_config=EvoConfig(generations=1, measure_per_generation=2, random_seeds=1))
    rep = pm.report
    assert REPORT_KEYS <= set(rep)
    assert rep["outputs_match"], rep["mismatch"]
    assert rep["max_abs_error"] < 1e-3
    # a fresh database: every distinct candidate was measured in this run (a cache hit is a repeat of one)
    assert rep["measurements"] >= rep["distinct_candidates"] > 0
    # the chosen plan is the fastest of the plans measured end to end in this run (when several were close,
    # the fastest of those timed again head to head; README, "Search"), or the fastest one-partition plan when
    # the fastest has several partitions and beats it by no more than MIXED_PLAN_MARGIN
    e2e = {k: v for k, v in rep["plans_e2e_ms"].items() if v is not None}
    if rep["head_to_head"] is not None:
        e2e = {k: v["ms"] for k, v in rep["head_to_head"]["plans"].items() if v["ms"] is not None}
    if rep["plan_latency_ms"] != pytest.approx(min(e2e.values())):
        assert len(rep["partitions"]) == 1, rep
        assert rep["plan_latency_ms"] in [pytest.approx(v) for v in e2e.values()]
        assert min(e2e.values()) >= rep["plan_latency_ms"] * (1 - MIXED_PLAN_MARGIN), (rep["plan_latency_ms"], e2e)
    for p in rep["partitions"]:
        assert p["backend"] in ("onnxruntime", "openvino", "torch") and p["nodes"] > 0
    assert sum(p["nodes"] for p in rep["partitions"]) == len(pm.graph)


def test_second_place_hits_the_cache(tmp_path):
    db = tmp_path / "m.db"
    first = collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST)
    again = collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST)
    assert first.report["measurements"] > 0
    assert again.report["measurements"] == 0
    assert again.report["cache_hits"] >= first.report["measurements"] - 1
    with Database(db) as d:
        st = d.stats()
    assert st["families"].get("dcgan", 0) > 0


def test_in_context_costs_are_measured_once_charged_and_reported(tmp_path, monkeypatch):
    from collage_ml.measure import context

    db = tmp_path / "m.db"
    kw = dict(backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST, graph_level=False)
    # dcgan-tiny holds under MIN_MODEL_BYTES of weights: not charged, and nothing measured for it
    small = collage_ml.place("dcgan-tiny", **kw)
    assert small.report["in_context_us"] == {} and small.report["dp_overhead_ms"] is None
    with Database(db) as d:
        assert not any(context.is_context(b.key) for b in d.boundaries(valid=None))
    monkeypatch.setattr(context, "MIN_MODEL_BYTES", 0)
    said = []
    rep = collage_ml.place("dcgan-tiny", log=said.append, **kw).report
    assert set(rep["in_context_us"]) == {"onnxruntime", "torch"}
    assert set(rep["in_context_us"]["onnxruntime"]) == {"0KiB_us", "256KiB_us", "1024KiB_us", "4096KiB_us",
                                                         "out64KiB_us", "out256KiB_us", "out1024KiB_us",
                                                         "out4096KiB_us"}
    assert rep["dp_overhead_ms"] is not None and rep["dp_overhead_ms"] >= 0.0
    # the charge is part of the DP's price: a one-partition plan (the whole model) pays none
    if len(rep["op_level_plan"]["partitions"]) == 1:
        assert rep["dp_overhead_ms"] == 0.0
    assert any("inside a plan" in line for line in said)
    # stored once: the next placement reads them, says nothing, and in_context=False leaves them out
    said.clear()
    again = collage_ml.place("dcgan-tiny", log=said.append, **kw).report
    assert again["in_context_us"] == rep["in_context_us"] and not any("inside a plan" in x for x in said)
    off = collage_ml.place("dcgan-tiny", in_context=False, **kw).report
    assert off["in_context_us"] == {} and off["dp_overhead_ms"] is None


def test_stale_hits_are_rescaled_in_a_placement_and_the_cli_says_so(tmp_path, capsys):
    """``--stale-after``: a placement on a day-old cache times a few hits per backend again, and reports the drift
    it rescaled the stale ones by; without it the cache is used as stored."""
    import sqlite3
    import time

    db = tmp_path / "m.db"
    collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST,
                     graph_level=False)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE measurements SET timestamp = ?", (time.time() - 86400,))
    plain = collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST,
                             graph_level=False).report
    assert plain["cache_drift"] == {} and plain["anchor_measurements"] == 0 and plain["measurements"] == 0
    rc = main(["place", "dcgan-tiny", "--backends", "onnxruntime,torch", "--db", str(db), "--max-region-size", "2",
               "--no-graph-level", "--stale-after", "1", "--report", str(tmp_path / "r.json"), "--no-progress"])
    assert rc == 0
    rep = json.loads((tmp_path / "r.json").read_text())
    assert set(rep["cache_drift"]) == {"onnxruntime", "torch"} and rep["measurements"] == 0
    assert rep["anchor_measurements"] == sum(int(d["anchors"]) for d in rep["cache_drift"].values()) <= 6
    assert all(23.9 < d["age_hours"] < 24.5 and d["ratio"] > 0 for d in rep["cache_drift"].values())
    assert "stale cache hits rescaled by" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["place", "dcgan-tiny", "--db", str(db), "--stale-after", "-1"])
    assert "--stale-after: expected a finite number >= 0, got '-1'" in capsys.readouterr().err


def test_place_cli_report_and_saved_model(tmp_path, capsys):
    rep_path = tmp_path / "reports" / "r.json"  # its folder does not exist yet
    rc = main(["place", "resnet50-tiny", "--backends", "onnxruntime,torch", "--db", str(tmp_path / "m.db"),
               "--max-region-size", "2", "--report", str(rep_path), "--out", str(tmp_path / "pm"), "--no-progress"])
    assert rc == 0
    rep = json.loads(rep_path.read_text())
    assert REPORT_KEYS <= set(rep) and set(rep["baselines_ms"]) == {"onnxruntime", "torch"}
    out = capsys.readouterr().out
    assert "all on onnxruntime" in out and "placed" in out
    pm = collage_ml.load(tmp_path / "pm")
    ref = pm.graph.reference()
    y = pm(ref[pm.graph.input_names[0]])
    import numpy as np

    np.testing.assert_allclose(y, ref[pm.graph.output_names[0]], rtol=1e-3, atol=1e-4)


def test_place_cli_exit_1_when_outputs_differ(tmp_path, monkeypatch, capsys):
    from collage_ml import api

    real = api.place

    def wrong(*a, **k):
        pm = real(*a, **k)
        pm.report["outputs_match"] = False
        pm.report["mismatch"] = "output 'y' differs from the reference: max abs error 1"
        return pm

    monkeypatch.setattr(api, "place", wrong)
    rc = main(["place", "dcgan-tiny", "--backends", "onnxruntime", "--db", str(tmp_path / "m.db"), "--no-progress"])
    assert rc == 1
    assert "do not match the reference" in capsys.readouterr().err


def test_place_errors(tmp_path, capsys):
    assert main(["place", "nope-model", "--db", str(tmp_path / "m.db")]) == 1
    assert "unknown" in capsys.readouterr().err.lower()
    assert main(["place", "dcgan-tiny", "--backends", "onnxruntim", "--db", str(tmp_path / "m.db")]) == 1
    assert "did you mean onnxruntime" in capsys.readouterr().err
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 100)
    assert main(["place", "dcgan-tiny", "--backends", "onnxruntime", "--db", str(bad)]) == 1
    assert "bad.db" in capsys.readouterr().err
