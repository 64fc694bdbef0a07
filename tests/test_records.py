"""Records of their own kinds: boundary costs and end-to-end plan timings, each in its own table.

Round trips of both tables, the move of the old ``boundary:<nbytes>`` candidate rows (writable opens) and
their reading as boundaries (read-only opens), a read-only open of a file without the tables, merge (and the
Ray shard merge) carrying them, ``Dataset.from_db`` counting each kind, and every plan judged end to end kept.
"""

from __future__ import annotations

import math
import json
import sqlite3
from pathlib import Path

import pytest

from collage_ml.cost import PROTOCOL, CandidateKey, Measurement
from collage_ml.db import _INSERT_MEASUREMENT, SCHEMA_VERSION, Database, _measurement_row
from collage_ml.measure.records import BoundaryCost, BoundaryKey, PlanTiming, plan_hash
from collage_ml.measure.timing import TimingConfig

from .helpers import chain_model

REPO = Path(__file__).resolve().parents[1]
HW = "cpu-test-t1-000000000000"
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=10, time_cap=0.05, processes=1,
                    max_processes=1)
KEY = BoundaryKey("onnxruntime", "1.32.0", "torch", "2.13.0", 4096, "float32[1,1024]")


def boundary(key=KEY, median=1.3e-3, hw=HW, **kw) -> BoundaryCost:
    d = dict(samples=[] if median is None else [median] * 3, median=median, spread=0.01, versions={"onnxruntime": "1.32.0"},
             extra={"chain": 2e-3, "first": 4e-4, "second": 3e-4})
    d.update(kw)
    valid = d.pop("valid", not d.get("failed") and d.get("median") is not None)
    return BoundaryCost(key, hw, valid, **d)


def plan_timing(h="p0", runs=((1.0e-3, 0, 100.0),), hw=HW) -> PlanTiming:
    return PlanTiming(h, hw, PROTOCOL, "g0", "chain", {"model": "chain", "partitions": [], "format": 2},
                      {"partitions": 2, "backends": ["onnxruntime", "torch"]},
                      [{"status": "valid", "median": m, "samples": [m] * 3, "process": p, "timestamp": ts}
                       for m, p, ts in runs])


def legacy_row(nbytes=4096, pair="onnxruntime->torch", version="1.32.0|2.13.0", median=1.3e-3) -> Measurement:
    return Measurement(CandidateKey(f"boundary:{nbytes}", pair, version), HW, True, samples=[median] * 3,
                       median=median, spread=0.0, family="boundary", extra={"chain": 2e-3})


def write_legacy(path: Path, ms) -> None:
    """Writes rows straight into ``measurements``, as collage-ml did before the boundaries table."""
    with Database(path) as db:
        db._write(lambda c: [c.execute(_INSERT_MEASUREMENT, _measurement_row(m)) for m in ms], "legacy")


def raw_count(path: Path, sql: str) -> int:
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as c:
        return c.execute(sql).fetchone()[0]


def candidate(h="h0", backend="onnxruntime", onnx_bytes=None) -> Measurement:
    return Measurement(CandidateKey(h, backend, "1.32.0"), HW, True, samples=[1e-3] * 3, median=1e-3, spread=0.0,
                       family="chain", onnx_bytes=onnx_bytes)


# ----------------------------------------------------------------------------- round trips


def test_boundary_round_trip_and_failed_rows(tmp_path):
    with Database(tmp_path / "m.db") as db:
        assert db.commit_boundary(boundary())
        assert not db.commit_boundary(boundary(median=9e-3))  # a settled key is never overwritten
        got = db.get_boundary(KEY, HW)
        assert got is not None and got.median == pytest.approx(1.3e-3) and got.extra["chain"] == 2e-3
        assert got.key == KEY and got.protocol == PROTOCOL and got.status == "valid"
        assert db.get_boundary(KEY, HW, "m1") is None and db.get_boundary(KEY, "other-hw") is None
        # a failed hand-off is retried: a later failure counts an attempt, a settled result replaces it
        other = BoundaryKey("torch", "2.13.0", "onnxruntime", "1.32.0", 64, "float32[1,16]")
        assert db.commit_boundary(boundary(other, median=None, failed=True, error_text="timeout: no result"))
        assert db.commit_boundary(boundary(other, median=None, failed=True, error_text="timeout: no result"))
        assert db.get_boundary(other, HW).attempts == 2 and db.get_boundary(other, HW).retryable
        assert db.commit_boundary(boundary(other, median=2e-5))
        b = db.get_boundary(other, HW)
        assert b.valid and b.median == pytest.approx(2e-5) and b.attempts == 3
        assert len(db.boundaries()) == 2 and len(db.boundaries(hardware="other-hw")) == 0
        assert len(db) == 0  # none of it is a candidate measurement


def test_plan_timing_round_trip_keeps_every_run(tmp_path):
    with Database(tmp_path / "m.db") as db:
        assert db.commit_plan_timing(plan_timing(runs=[(2.0e-3, 0, 100.0)])) == 1
        assert db.commit_plan_timing(plan_timing(runs=[(1.5e-3, 1, 101.0)])) == 1  # a second process
        assert db.commit_plan_timing(plan_timing(runs=[(1.5e-3, 1, 101.0)])) == 0  # the same run, once
        p = db.get_plan_timing("p0", HW)
        assert p is not None and p.process_medians == [2.0e-3, 1.5e-3] and p.median == pytest.approx(1.5e-3)
        assert p.valid and p.graph_hash == "g0" and p.summary["backends"] == ["onnxruntime", "torch"]
        assert p.plan["model"] == "chain"
        bad = PlanTiming("p1", HW, PROTOCOL, "g0", runs=[{"status": "invalid", "error_text": "wrong numbers: x",
                                                       "process": 0, "timestamp": 1.0}])
        assert db.commit_plan_timing(bad) == 1
        assert [x.plan_hash for x in db.plan_timings(valid=False)] == ["p1"]
        assert db.plan_timings(valid=False)[0].error_text == "wrong numbers: x"
        assert {x.plan_hash for x in db.plan_timings(graph_hash="g0")} == {"p0", "p1"}
        st = db.stats()
        assert st["plan_timings"] == 2 and st["plan_timings_valid"] == 1 and st["total"] == 0
        with sqlite3.connect(db.path) as c:  # the queryable columns follow the runs
            assert c.execute("SELECT n_runs, median, valid FROM plan_timings WHERE plan_hash = 'p0'").fetchone() == (
                2, pytest.approx(1.5e-3), 1)


def test_plan_hash_is_the_cover_on_its_backends():
    a = plan_hash("g", [("onnxruntime", "1", [0, 1]), ("torch", "2", [2])])
    assert a == plan_hash("g", [("torch", "2", [2]), ("onnxruntime", "1", [1, 0])])  # order does not matter
    assert a != plan_hash("g", [("onnxruntime", "1", [0, 1]), ("torch", "3", [2])])  # a backend's version does
    assert a != plan_hash("h", [("onnxruntime", "1", [0, 1]), ("torch", "2", [2])])  # and the model


# ----------------------------------------------------------------------------- old boundary rows


def test_old_boundary_rows_read_as_boundaries_and_move_on_a_writable_open(tmp_path):
    from collage_ml.models.dataset import Dataset

    path = tmp_path / "m.db"
    write_legacy(path, [legacy_row(), legacy_row(1024, median=1e-4), candidate(),
                        legacy_row(7, pair="no-arrow")])  # the last one does not parse as a boundary
    assert raw_count(path, "SELECT COUNT(*) FROM measurements") == 4
    before = path.read_bytes()
    with Database(path, readonly=True) as ro:  # read-only: read as boundaries, never as measurements
        assert len(ro) == 1 and [m.key.subgraph_hash for m in ro.measurements()] == ["h0"]
        assert sorted(b.key.nbytes for b in ro.boundaries()) == [1024, 4096]
        assert ro.get_boundary(KEY, HW).median == pytest.approx(1.3e-3)
        assert ro.stats()["boundaries"] == 2 and ro.stats()["total"] == 1
        ds = Dataset.from_db(ro)
        assert ds.kinds["boundaries"] == 2 and ds.skipped == 1  # the candidate has no ONNX; no boundary counted
    assert path.read_bytes() == before
    with Database(path) as db:  # writable: moved, in one transaction
        assert db.legacy_boundaries_moved == 2
        assert len(db) == 1 and len(db.boundaries()) == 2 and db.get_boundary(KEY, HW) is not None
    assert raw_count(path, "SELECT COUNT(*) FROM measurements") == 2  # the candidate and the unparseable row
    assert raw_count(path, "SELECT COUNT(*) FROM boundaries") == 2
    with Database(path) as again:
        assert again.legacy_boundaries_moved == 0 and len(again.boundaries()) == 2
        assert again.schema_version == SCHEMA_VERSION


def test_old_shaped_commits_become_boundaries(tmp_path):
    from collage_ml.measure.boundary import BoundaryTable

    with Database(tmp_path / "m.db") as db:
        assert db.commit(legacy_row())
        assert db.commit_many([legacy_row(1024, median=1e-4), candidate()]) == 2
        assert len(db) == 1 and len(db.boundaries()) == 2
        table = BoundaryTable(db.boundaries())
        assert table.cost("onnxruntime", "torch", 2048) is not None and table.cost("torch", "onnxruntime", 1) is None
        assert BoundaryTable([legacy_row()]).cost("onnxruntime", "torch", 4096) == pytest.approx(1.3e-3)


def _v1_copy(tmp_path) -> Path:
    src = REPO / "datasets" / "cpu-2core-zen4-t1" / "measurements.db"
    if not src.exists():
        pytest.skip("the shipped dataset is not in this checkout")
    dst = tmp_path / "v1.db"
    with sqlite3.connect(f"{src.as_uri()}?mode=ro", uri=True) as s, sqlite3.connect(dst) as d:
        s.backup(d)
    with sqlite3.connect(dst) as c:
        if c.execute("PRAGMA user_version").fetchone()[0] != 1:
            pytest.skip("the shipped dataset is no longer schema 1")
    return dst


def test_shipped_schema_1_copy_reads_without_tables_and_migrates_without_loss(tmp_path):
    path = _v1_copy(tmp_path)
    n = raw_count(path, "SELECT COUNT(*) FROM measurements")
    with sqlite3.connect(path) as c:  # one old boundary row, written the way schema 1 did
        cols = [r[1] for r in c.execute("PRAGMA table_info(measurements)") if r[1] != "id"]
        sel = ", ".join({"subgraph_hash": "'boundary:4096'", "backend": "'onnxruntime->torch'",
                         "backend_version": "'1.32.0|2.13.0'", "family": "'boundary'"}.get(k, k) for k in cols)
        c.execute(f"INSERT INTO measurements ({', '.join(cols)}) SELECT {sel} FROM measurements WHERE valid = 1 "
                  "LIMIT 1")
    before = path.read_bytes()
    with Database(path, readonly=True) as ro:  # no record tables: empty, no error
        assert ro.schema_version == 1 and ro.plan_timings() == [] and ro.get_plan_timing("x", HW) is None
        assert len(ro) == n and len(ro.boundaries()) == 1 and ro.boundaries()[0].protocol == "m1"
        st = ro.stats()
        assert st["total"] == n and st["boundaries"] == 1 and st["plan_timings"] == 0
    assert path.read_bytes() == before
    with Database(path) as db:  # writable: 1 -> 2, then the boundary row moves; every candidate row kept
        assert db.schema_version == SCHEMA_VERSION and db.legacy_boundaries_moved == 1
        assert len(db) == n and len(db.boundaries()) == 1 and db.plan_timings() == []
    assert raw_count(path, "SELECT COUNT(*) FROM measurements") == n
    assert raw_count(path, "SELECT COUNT(*) FROM boundaries") == 1


def test_readonly_open_of_a_schema_2_file_without_the_tables(tmp_path):
    path = tmp_path / "m.db"
    with Database(path) as db:
        db.commit(candidate())
    with sqlite3.connect(path) as c:  # as written before these tables existed
        c.execute("DROP TABLE boundaries")
        c.execute("DROP TABLE plan_timings")
    with Database(path, readonly=True) as ro:
        assert ro.boundaries() == [] and ro.plan_timings() == [] and ro.get_boundary(KEY, HW) is None
        assert ro.record_counts() == {"boundaries": 0, "plan_timings": 0} and len(ro) == 1
    with Database(path) as db:  # a writable open adds them
        assert db.commit_boundary(boundary()) and db.commit_plan_timing(plan_timing()) == 1


# ----------------------------------------------------------------------------- merge


def test_merge_carries_both_tables_and_old_rows(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    other = BoundaryKey("torch", "2.13.0", "onnxruntime", "1.32.0", 4096, "float32[1,1024]")
    with Database(a) as db:
        db.commit_boundary(boundary())
        db.commit_plan_timing(plan_timing(runs=[(2e-3, 0, 100.0)]))
    with Database(b) as db:
        db.commit_boundary(boundary(other, median=5e-4))
        db.commit_boundary(boundary(median=7e-3))  # a's key: a's row stays
        db.commit_plan_timing(plan_timing(runs=[(1e-3, 1, 101.0)]))  # another run of a's plan
        db.commit_plan_timing(plan_timing("p9"))
    write_legacy(tmp_path / "c.db", [legacy_row(1024, median=1e-4)])
    assert raw_count(tmp_path / "c.db", "SELECT COUNT(*) FROM measurements") == 1  # c: an old row, unmoved
    with Database(a) as db:
        db.merge(b)
        assert db.last_merge == {"measurements": 0, "boundaries": 1, "plan_runs": 2, "calibrations": 0}
        db.merge(b)  # idempotent
        assert db.last_merge == {"measurements": 0, "boundaries": 0, "plan_runs": 0, "calibrations": 0}
        assert db.get_boundary(KEY, HW).median == pytest.approx(1.3e-3)
        assert db.get_boundary(other, HW).median == pytest.approx(5e-4)
        assert db.get_plan_timing("p0", HW).process_medians == [2e-3, 1e-3]
        assert {p.plan_hash for p in db.plan_timings()} == {"p0", "p9"}
        db.merge(tmp_path / "c.db")  # an old file's boundary rows arrive as boundaries
        assert db.last_merge["boundaries"] == 1 and len(db) == 0 and len(db.boundaries()) == 3


def test_ray_shard_merge_carries_both_tables(tmp_path):
    from collage_ml.collector.ray_fleet import _merge_shard, _shard_snapshot

    shard = tmp_path / "shard-0-of-2.db"
    with Database(shard) as db:
        db.commit(candidate())
        db.commit_boundary(boundary())
        db.commit_plan_timing(plan_timing())
    data, rows = _shard_snapshot(shard)
    with Database(tmp_path / "main.db") as main:
        _merge_shard(main, tmp_path / "copy.db", data, rows)
        assert len(main) == 1 and len(main.boundaries()) == 1 and len(main.plan_timings()) == 1


# ----------------------------------------------------------------------------- readers


def test_dataset_counts_each_kind(tmp_path):
    from collage_ml.ir.importers import from_onnx
    from collage_ml.models.dataset import Dataset

    g = from_onnx(chain_model(), name="chain")
    sg = g.subgraph([0, 1])
    path = tmp_path / "m.db"
    with Database(path) as db:
        db.register_hardware(HW, {"physical_cores": 2, "logical_cores": 2, "threads": 1, "gpus": []})
        db.commit(candidate(sg.hash, onnx_bytes=sg.to_onnx().SerializeToString()))
        db.commit(legacy_row())  # an old caller's boundary row
        db.commit_boundary(boundary(BoundaryKey("a", "1", "b", "1", 64, "float32[1,16]")))
        db.commit_plan_timing(plan_timing())
    ds = Dataset.from_db(path)
    assert len(ds) == 1 and ds.skipped == 0
    assert ds.kinds == {"candidates": 1, "boundaries": 2, "plans": 1}
    assert Dataset.from_db(path, protocols=["m1"]).kinds == {"candidates": 0, "boundaries": 0, "plans": 0}


def test_cli_db_stats_shows_the_kinds(tmp_path, capsys):
    from collage_ml.cli import main

    path = tmp_path / "m.db"
    with Database(path) as db:
        db.commit(candidate())
        db.commit_boundary(boundary())
        db.commit_plan_timing(plan_timing())
    assert main(["db", "stats", str(path), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["total"] == 1 and st["valid"] == 1 and st["boundaries"] == 1 and st["plan_timings"] == 1
    assert main(["db", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 boundary costs" in out and "1 valid (0 of them contended" in out


# ----------------------------------------------------------------------------- writers


def test_boundaries_measured_go_to_their_table(tmp_path):
    from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend
    from collage_ml.measure.boundary import measure_boundaries
    from collage_ml.measure.runner import Runner

    ort = OnnxRuntimeBackend()
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=FAST) as r:
        got = measure_boundaries(r, [ort], sizes=(256,))
        assert len(got) == 1 and got[0].valid, got[0].error_text
        assert len(db) == 0 and [b.key for b in db.boundaries()] == [got[0].key]
        assert got[0].key.tensor == "float32[1,256]" and got[0].key.nbytes == 1024
        assert measure_boundaries(r, [ort], sizes=(256,), cached_only=True)[0].median == got[0].median


def test_every_plan_judged_end_to_end_is_kept(tmp_path):
    from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend
    from collage_ml.ir.importers import from_onnx
    from collage_ml.measure.e2e import measure_plan
    from collage_ml.measure.runner import Runner
    from collage_ml.plan import Partition, Plan

    g = from_onnx(chain_model(), name="chain")
    ort = OnnxRuntimeBackend()
    ref = g.reference()
    whole = Plan.single(g, ort)
    split = Plan(g.name, [Partition(ort.name, [0, 1, 2], backend_spec=ort.spec()),
                          Partition(ort.name, [3, 4, 5], backend_spec=ort.spec())], graph_hash=g.whole().hash)
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=FAST) as r:
        r0 = measure_plan(r, g, whole, ref, process=0)
        r1 = measure_plan(r, g, whole, ref, process=1)
        measure_plan(r, g, split, ref)
        assert r0["valid"] and r1["valid"]
        ps = db.plan_timings()
        assert len(ps) == 2 and len(db) == 0
        w = db.get_plan_timing(plan_hash(g.whole().hash, [(ort.name, ort.version, list(range(6)))]), r.hardware)
        assert w is not None and [run["process"] for run in w.runs] == [0, 1]
        assert w.median == pytest.approx(min(r0["median"], r1["median"]))
        assert w.summary["partitions"] == 1 and w.model == "chain" and w.plan["partitions"][0]["backend"] == ort.name
        s = next(p for p in ps if p.plan_hash != w.plan_hash)
        assert s.summary["partitions"] == 2 and s.summary["executed_partitions"] == 1  # merged when compiled


def test_place_keeps_every_plan_it_judged(tmp_path, monkeypatch):
    """Every end-to-end run is kept, the head-to-head ones too, and the plan kept is the head-to-head's fastest."""
    import collage_ml
    from collage_ml.search import judging
    from collage_ml.search.evolutionary import EvoConfig

    monkeypatch.setattr(judging, "HEAD_TO_HEAD_MARGIN", 1e9)  # every plan is in the close contest, whatever the CPU
    db = tmp_path / "m.db"
    pm = collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", db=db, max_region_size=2, timing=FAST,
                          evo_config=EvoConfig(generations=1, measure_per_generation=2, random_seeds=1))
    rep = pm.report
    with Database(db, readonly=True) as d:
        ps = d.plan_timings(hardware=rep["hardware"])
    assert ps and sum(len(p.runs) for p in ps) == rep["e2e_measurements"]
    h2h = rep["head_to_head"]  # all-onnxruntime and all-torch are two plans at least
    assert h2h is not None and 2 <= h2h["timed"] <= judging.HEAD_TO_HEAD_MAX and not h2h.get("failed")
    runs = {run["median"] * 1e3 for p in ps for run in p.runs if run.get("method") == "head-to-head"}
    assert len(runs) == h2h["timed"]
    ms = {k: v["ms"] for k, v in h2h["plans"].items() if v["ms"] is not None}
    assert rep["chosen"] in ms and rep["plan_latency_ms"] == pytest.approx(ms[rep["chosen"]])
    assert rep["plan_latency_ms"] == pytest.approx(min(ms.values())) or len(pm.plan.partitions) == 1
    assert all(rep["plans_e2e_ms"][k] == pytest.approx(v) for k, v in ms.items())
    if ms.get("graph-level") is not None:  # the report's graph-level timing is the head-to-head's, as shown
        assert rep["graph_level_ms"] == pytest.approx(ms["graph-level"])


def test_db_merge_cli_counts_every_kind(tmp_path, capsys):
    """`collage-ml db merge` says what it added of each kind, not only measurements."""
    from collage_ml.cli import main

    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Database(b) as db:
        db.commit_boundary(boundary())
        db.commit_plan_timing(plan_timing(runs=[(1e-3, 0, 100.0), (1.1e-3, 1, 101.0)]))
    assert main(["db", "merge", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(": 0 new measurements, 1 boundary costs, 2 plan runs, 0 calibrations"), out
    assert main(["db", "merge", str(a), str(b)]) == 0  # idempotent
    assert capsys.readouterr().out.strip().endswith(": 0 new measurements, 0 boundary costs, 0 plan runs, 0 calibrations")
