"""The probe set: deterministic, measured once per (machine, backend, protocol), stored, reused."""

from __future__ import annotations

import json

import pytest

from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend
from collage_ml.db import Database
from collage_ml.measure import probes
from collage_ml.measure.runner import Runner
from collage_ml.measure.timing import LEGACY


def test_probe_set_is_deterministic_and_covers_the_kernel_kinds():
    a = [(n, g.whole().hash) for n, g in probes.probe_graphs()]
    b = [(n, g.whole().hash) for n, g in probes.probe_graphs()]
    assert a == b and [n for n, _ in a] == probes.probe_names()
    assert 20 <= len(a) <= 50 and len({h for _, h in a}) == len(a)
    ops = {n.op_type for _, g in probes.probe_graphs() for n in g.nodes}
    assert {"Conv", "ConvTranspose", "MatMul", "LayerNormalization", "Softmax", "ReduceMean", "MaxPool"} <= ops
    groups = {n.attributes.get("group", 1) for _, g in probes.probe_graphs() for n in g.nodes if n.op_type == "Conv"}
    assert any(gr > 1 for gr in groups)  # a depthwise convolution


def checked(measured: int, names) -> bool:
    """A calibration of one backend: a pass over its probes and a second over every CHECK_EVERY-th of them,
    or three whole passes where the two disagreed."""
    sample = len(range(0, len(names), probes.CHECK_EVERY))
    return measured in (len(names) + sample, 3 * len(names))


@pytest.fixture
def two_probes(monkeypatch):
    chosen = probes.PROBES[10:12]  # layernorm and maxpool: fast
    monkeypatch.setattr(probes, "PROBES", chosen)
    return [f"{p.name}@b{b}" for p in chosen for b in probes.BATCHES]


def test_probes_are_measured_once_per_machine_and_backend(tmp_path, two_probes):
    ort = OnnxRuntimeBackend()
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            said = []
            first = probes.ensure_probes(r, [ort], say=said.append)
            assert checked(r.measured, two_probes) and said  # a machine the database has not seen: measured
        assert set(first["onnxruntime"]) == set(two_probes)
        assert all(v is not None and v > 0 for v in first["onnxruntime"].values())
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            said = []
            again = probes.ensure_probes(r, [ort], say=said.append)
            assert again == first and r.measured == 0 and not said  # reused, not measured
        with Runner(db=db, threads=2, timing=LEGACY) as r:  # another fingerprint (thread count): measured once
            other = probes.ensure_probes(r, [ort])
            assert checked(r.measured, two_probes) and set(other["onnxruntime"]) == set(two_probes)
        stored = db.probes(r.hardware, ort.name, ort.version, LEGACY.name, probes.PROBE_SET_VERSION)
        assert stored == other["onnxruntime"]
        assert db.probes(r.hardware, ort.name, ort.version, "m9", probes.PROBE_SET_VERSION) == {}


def test_calibrate_command_prints_json(tmp_path, two_probes, capsys, monkeypatch):
    from collage_ml import cli

    monkeypatch.setenv("COLLAGE_ML_THREADS", "1")
    assert cli.main(["calibrate", "--backends", "onnxruntime", "--db", str(tmp_path / "m.db"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"onnxruntime"} and set(out["onnxruntime"]) == set(two_probes)
    # the in-context costs were measured and stored with the probes, once per size
    from collage_ml.db import Database
    from collage_ml.measure.context import CONTEXT_SIZES, OUTPUT_SIZES, is_context

    stored = [b for b in Database(tmp_path / "m.db").boundaries(valid=None) if is_context(b.key)]
    assert sorted(b.key.nbytes for b in stored) == sorted(CONTEXT_SIZES + OUTPUT_SIZES)
    assert {b.key.first for b in stored} == {"onnxruntime"}


def test_calibrate_no_progress_turns_the_bar_off(monkeypatch, capsys):
    from collage_ml import api, cli

    seen = []

    def fake_calibrate(backends, **kw):
        seen.append(kw["progress"])
        return {"onnxruntime": {"conv@b1": 1e-5}}

    monkeypatch.setattr(api, "calibrate", fake_calibrate)
    assert cli.main(["calibrate", "--no-progress"]) == 0
    assert cli.main(["calibrate"]) == 0
    assert seen == [False, True]
    assert "10.0" in capsys.readouterr().out  # the table still prints, in microseconds


def test_calibrate_check_says_how_far_the_machine_moved_and_stores_nothing(tmp_path, two_probes, capsys, monkeypatch):
    import sqlite3

    from collage_ml import cli

    monkeypatch.setenv("COLLAGE_ML_THREADS", "1")
    db = tmp_path / "m.db"
    assert cli.main(["calibrate", "--backends", "onnxruntime", "--db", str(db), "--json"]) == 0
    capsys.readouterr()
    with sqlite3.connect(db) as c:  # as if the machine had run twice as slow when it was calibrated
        c.execute("UPDATE probes SET median = median * 2")
        before = [c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("probes", "measurements")]
    assert cli.main(["calibrate", "--check", "--backends", "onnxruntime", "--db", str(db), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    ort = res["backends"]["onnxruntime"]
    assert ort["probes"] == len(two_probes) and ort["calibrated_at"] is not None
    assert 0.3 < res["ratio"] < 0.8, res  # about half: the stored table reads twice the latencies of now
    with sqlite3.connect(db) as c:
        assert [c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("probes", "measurements")] == before
    assert cli.main(["calibrate", "--check", "--backends", "onnxruntime", "--db", str(db), "--no-progress"]) == 0
    assert "faster than when the database was calibrated" in capsys.readouterr().out


def test_calibrate_check_without_a_calibration_names_the_fix(tmp_path, capsys):
    from collage_ml import cli

    db = tmp_path / "m.db"
    Database(db).close()
    assert cli.main(["calibrate", "--check", "--backends", "onnxruntime", "--db", str(db)]) != 0
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no probe results of this machine" in err and "collage-ml calibrate --db" in err
    assert cli.main(["calibrate", "--check", "--db", str(tmp_path / "none.db")]) != 0
    assert "no measurement database at" in capsys.readouterr().err


def test_a_stale_calibration_is_measured_again_as_a_sitting_of_its_own(tmp_path, two_probes):
    ort = OnnxRuntimeBackend()
    key = lambda r: (r.hardware, ort.name, ort.version, LEGACY.name, probes.PROBE_SET_VERSION)  # noqa: E731
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            assert probes.recalibrate(r, [ort], 3600.0) == {"onnxruntime": "first"}
            rows = len(list(db.measurements()))
            first_cost = r.measured
            assert probes.recalibrate(r, [ort], 3600.0) == {} and checked(first_cost, two_probes)  # fresh: kept
            assert probes.recalibrate(r, [ort], None) == {}  # None: never again
            said = []
            assert probes.recalibrate(r, [ort], 0.0, say=said.append) == {"onnxruntime": "again"}
            assert checked(r.measured - first_cost, two_probes)  # measured again, past the measurement cache
            said = [line for line in said if "second pass" not in line]  # the passes' check, said too
            assert len(said) == 1 and "onnxruntime again" in said[0] and "h old" in said[0]
        first, later = db.calibrations(r.hardware, probes.PROBE_SET_VERSION)
        assert first.sitting is None and later.sitting is not None and first.time <= later.sitting <= later.time
        assert set(first.values) == set(later.values) == set(two_probes) and first.values != later.values
        assert db.probes(*key(r)) == later.values and db.probe_time(*key(r)) == later.time  # the newest
        assert db.probe_table(r.hardware, probes.PROBE_SET_VERSION) == {"onnxruntime": later.values}
        counts = db.stats()["calibrations"]
        assert list(counts) == [r.hardware] and counts[r.hardware]["sittings"] == 2
        assert counts[r.hardware]["newest"] == later.time and counts[r.hardware]["checked"] == 2
        assert counts[r.hardware]["third_pass"] in (0, 1, 2)  # a noisy pass on this machine may want a third
        assert db.stats(hardware="cpu-other-t4-0")["calibrations"] == {}
        assert len(list(db.measurements())) == rows  # the probes' own rows stay the first sitting's
    with Runner(db=None, threads=1, timing=LEGACY) as r, pytest.raises(ValueError, match="needs a runner with a database"):
        probes.recalibrate(r, [ort], 0.0)


def test_merge_keeps_every_sittings_calibration(tmp_path):
    def calibrated(name: str, value: float) -> str:
        with Database(tmp_path / name) as db:
            db.commit_probe("hw", "onnxruntime", "1", "m5", 1, "p@b1", value, "h")
            db.commit_probe("hw", "onnxruntime", "1", "m5", 1, "p@b16", 2 * value, "h")
        return str(tmp_path / name)

    a, b = calibrated("a.db", 1e-3), calibrated("b.db", 2e-3)  # one machine, calibrated in two sittings

    def sittings(path) -> list[tuple[bool, float]]:
        with Database(path, readonly=True) as db:
            return [(c.sitting is None, c.values["p@b1"]) for c in db.calibrations("hw", 1)]

    with Database(a) as db:
        db.merge(b)
        assert db.last_merge["calibrations"] == 1
        db.merge(b)  # idempotent
        assert db.last_merge["calibrations"] == 0
    assert sittings(a) == [(True, 1e-3), (False, 2e-3)]  # b's first calibration is a later sitting here
    with Database(b) as db:
        db.merge(a)  # a's first comes across; b's own, come back through a, is not copied twice
        assert db.last_merge["calibrations"] == 1
    assert sittings(b) == [(False, 1e-3), (True, 2e-3)]  # oldest first: a's sitting came before b's
    with Database(tmp_path / "c.db") as db:  # a new file takes a's first as its first, and the sitting after it
        db.merge(a)
        assert db.last_merge["calibrations"] == 2
    assert sittings(tmp_path / "c.db") == [(True, 1e-3), (False, 2e-3)]


def test_calibrate_measures_again_only_past_max_age(tmp_path, two_probes, monkeypatch, capsys):
    from collage_ml import api, cli

    monkeypatch.setenv("COLLAGE_ML_THREADS", "1")
    db = tmp_path / "m.db"
    first = api.calibrate("onnxruntime", db=db)
    assert api.calibrate("onnxruntime", db=db) == first  # younger than an hour: read back
    assert cli.main(["calibrate", "--backends", "onnxruntime", "--db", str(db), "--max-age", "0", "--json"]) == 0
    with Database(db, readonly=True) as d:
        cals = d.calibrations(next(iter(d.stats()["hardware"])), probes.PROBE_SET_VERSION)
    assert [c.sitting is None for c in cals] == [True, False] and cals[0].values == first["onnxruntime"]
    assert api.calibrate("onnxruntime", db=db) == {"onnxruntime": cals[1].values}  # the newest
    capsys.readouterr()
    assert cli.main(["db", "stats", str(db)]) == 0
    out = capsys.readouterr().out
    assert ": calibrated 2 times, the newest 20" in out and "2 backend calibrations checked by a second pass" in out
    with pytest.raises(ValueError, match="max_age_hours must be >= 0"):
        api.calibrate("onnxruntime", db=db, max_age_hours=-1)


def test_an_interrupted_recalibration_stores_nothing(tmp_path, two_probes, monkeypatch):
    ort = OnnxRuntimeBackend()
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=LEGACY) as r:
        probes.ensure_probes(r, [ort])
        measure = Runner.measure

        def interrupted(self, cands, reference, family=None, on_result=None):
            measure(self, cands[:1], reference, family, on_result)  # one probe, then Ctrl-C
            raise KeyboardInterrupt

        monkeypatch.setattr(Runner, "measure", interrupted)
        with pytest.raises(KeyboardInterrupt):
            probes.recalibrate(r, [ort], 0.0)
        assert len(db.calibrations(r.hardware, probes.PROBE_SET_VERSION)) == 1  # the first one only


def test_each_calibration_names_the_machine_that_measured_it_through_a_merge_and_in_an_older_file(tmp_path):
    """Machines of one kind share a fingerprint: each probe result records its node (one boot of one VM), a
    merge keeps it, and a file from before the node table reads as it did, every node unknown."""
    import sqlite3

    def calibrated(name: str, value: float, node: str | None) -> str:
        with Database(tmp_path / name) as db:
            db.commit_probe("hw", "onnxruntime", "1", "m5", 1, "p@b1", value, "h", node=node)
            db.commit_probe("hw", "onnxruntime", "1", "m5", 1, "p@b16", 2 * value, "h", node=node)
        return str(tmp_path / name)

    a, b = calibrated("a.db", 1e-3, "boot:a"), calibrated("b.db", 2e-3, "boot:b")

    def nodes(path) -> list[tuple[float, str | None]]:
        with Database(path, readonly=True) as db:
            return [(c.values["p@b1"], c.node) for c in db.calibrations("hw", 1)]

    assert nodes(a) == [(1e-3, "boot:a")]
    with Database(a) as db:
        db.merge(b)  # b's first calibration is a later sitting here, still b's node's
    assert nodes(a) == [(1e-3, "boot:a"), (2e-3, "boot:b")]
    c = calibrated("c.db", 3e-3, None)  # a caller that names no node
    assert nodes(c) == [(3e-3, None)]
    old = sqlite3.connect(a)
    old.execute("DROP TABLE probe_nodes")  # a file from before the table
    old.commit()
    old.close()
    assert nodes(a) == [(1e-3, None), (2e-3, None)]
    with Database(a) as db:  # opened to write, it gains the table; the results keep their values
        db.commit_probe("hw", "onnxruntime", "1", "m5", 1, "p@b1", 9e-3, "h", sitting=1.0, node="boot:c")
    assert [v for v, _ in nodes(a)][:2] == [1e-3, 2e-3]


def test_measurements_and_calibrations_carry_this_machines_node(tmp_path, monkeypatch):
    from collage_ml.measure.hardware import node_id

    monkeypatch.setattr(probes, "PROBES", probes.PROBES[10:11])  # one fast probe
    ort = OnnxRuntimeBackend()
    with Database(tmp_path / "n.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            probes.ensure_probes(r, [ort])
        (cal,) = db.calibrations(r.hardware, probes.PROBE_SET_VERSION)
        assert cal.node == node_id() and node_id().startswith(("boot:", "host:"))
        rows = list(db.measurements())
        assert rows and all(m.extra["node"] == node_id() for m in rows)


def test_a_database_calibrated_on_another_machine_of_this_kind_is_calibrated_again_here(tmp_path, two_probes):
    """A fresh calibration that names another node (another VM of this kind, or before a reboot) is not this
    machine's: with a max age, ``recalibrate`` measures a sitting of this node's own, once."""
    from collage_ml.measure.hardware import node_id

    ort = OnnxRuntimeBackend()
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            for name in two_probes:  # a whole first calibration, measured just now elsewhere
                db.commit_probe(r.hardware, ort.name, ort.version, LEGACY.name, probes.PROBE_SET_VERSION, name, 1e-3,
                                "h", node="boot:another-vm")
            assert probes.recalibrate(r, [ort], None) == {}  # no max age: any calibration will do
            said = []
            assert probes.recalibrate(r, [ort], 3600.0, say=said.append) == {"onnxruntime": "again"}
            said = [line for line in said if "second pass" not in line]  # the passes' check, said too
            assert len(said) == 1 and "another machine of this kind" in said[0]
            assert probes.recalibrate(r, [ort], 3600.0) == {}  # now it has one of its own, fresh
        elsewhere, here = db.calibrations(r.hardware, probes.PROBE_SET_VERSION)
        assert (elsewhere.node, here.node) == ("boot:another-vm", node_id()) and here.sitting is not None


def test_once_one_backend_is_due_every_backend_is_calibrated_again_in_the_same_sitting(tmp_path, two_probes):
    """A first calibration ends a few seconds apart per backend, so one falls due a source before the next;
    a sitting measures them all together, as the first time, under one sitting."""
    from collage_ml.backends.openvino_backend import OpenVinoBackend

    ort, ov = OnnxRuntimeBackend(), OpenVinoBackend()
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            assert probes.recalibrate(r, [ort, ov], 3600.0) == {"onnxruntime": "first", "openvino": "first"}
            db._write(lambda c: c.execute("UPDATE probes SET timestamp = timestamp - 7200 WHERE backend = ?",
                                          (ort.name,)), "test")  # only ONNX Runtime's calibration is old
            said = []
            assert probes.recalibrate(r, [ort, ov], 3600.0, say=said.append) == {"onnxruntime": "again",
                                                                                   "openvino": "again"}
            assert any("openvino with them" in line for line in said)
        later = [c for c in db.calibrations(r.hardware, probes.PROBE_SET_VERSION) if c.sitting is not None]
        assert sorted(c.backend for c in later) == ["onnxruntime", "openvino"] and len({c.sitting for c in later}) == 1


def test_passes_combine_as_a_geometric_mean_of_two_or_a_median_of_three():
    assert probes.combined([1e-3, 4e-3]) == pytest.approx(2e-3)
    assert probes.combined([1e-3, 9e-3, 2e-3]) == 2e-3
    assert probes.combined([None, 3e-3]) == 3e-3 and probes.combined([None, None]) is None
    first = {("a", "p1"): 1.0, ("a", "p2"): 2.0, ("b", "p1"): 1.0, ("b", "p2"): None}
    second = {("a", "p1"): 1.5, ("a", "p2"): 3.0, ("b", "p1"): 0.5, ("b", "p2"): 1.0}
    assert probes.pass_ratios(first, second) == {"a": 1.5, "b": 0.5}


def test_a_calibration_measures_a_backend_whose_two_passes_disagree_a_third_time(tmp_path, two_probes, monkeypatch):
    """A slow phase of one backend in one pass (seen on the Zen 4: OpenVINO's probes 1.6x slow, flagged by
    nothing) is out-voted: that backend is measured a third time and each probe keeps the median of three;
    a backend whose passes agree keeps the geometric mean of its two. Only the first pass of a first
    calibration reads (and fills) the measurement cache."""
    from types import SimpleNamespace

    from tests.fake_backends import FakeCostBackend

    a, b = FakeCostBackend("fake-a"), FakeCostBackend("fake-b")
    base = {n: 1e-4 * (i + 1) for i, n in enumerate(two_probes)}
    # per call: the first pass, the second over every other probe (CHECK_EVERY 2 here), the rest of the second
    # for the backend it flagged, and that backend's third pass
    slow = {0: {"fake-a": 1.05, "fake-b": 1.0}, 1: {"fake-a": 1.0, "fake-b": 1.6}, 2: {"fake-b": 1.6},
            3: {"fake-b": 1.02}}
    calls: list[tuple] = []

    def fake_measure(self, cands, reference, family=None, on_result=None):
        k = len(calls)
        calls.append((sorted({c.backend.name for c in cands}), self.db is not None, family, len(cands)))
        for c in cands:
            on_result(c, SimpleNamespace(valid=True, median=base[c.pattern.split(":", 1)[1]] * slow[k][c.backend.name]),
                      False)

    monkeypatch.setattr(Runner, "measure", fake_measure)
    monkeypatch.setattr(probes, "CHECK_EVERY", 2)
    checked_probes = two_probes[::2]
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=LEGACY) as r:
        said: list[str] = []
        got = probes.ensure_probes(r, [a, b], say=said.append)
        assert calls == [(["fake-a", "fake-b"], True, "probe", 8), (["fake-a", "fake-b"], False, "probe", 4),
                         (["fake-b"], False, "probe", 2), (["fake-b"], False, "probe", 4)]
        check = [line for line in said if "second pass" in line]
        assert len(check) == 1 and "fake-a 0.95, fake-b 1.60; fake-b off by over 10%" in check[0]
        assert "every 2nd probe" in check[0] and "measuring it a third time" in check[0]
        for n, v in base.items():  # fake-a: the two passes' geometric mean where the second measured the probe
            assert got["fake-a"][n] == pytest.approx(v * (1.05**0.5 if n in checked_probes else 1.05))
            assert got["fake-b"][n] == pytest.approx(v * 1.02)  # the median of three whole passes
        assert db.probes(r.hardware, "fake-b", b.version, LEGACY.name, probes.PROBE_SET_VERSION) == got["fake-b"]
        calls.clear()
        slow.update({0: {"fake-a": 1.0, "fake-b": 1.0}, 1: {"fake-a": 1.0, "fake-b": 1.0}})
        assert probes.recalibrate(r, [a, b], 0.0) == {"fake-a": "again", "fake-b": "again"}
        assert [c[1] for c in calls] == [False, False]  # a later sitting: every pass measured now, none a third
        assert [c[3] for c in calls] == [8, 4]
        checks = [(c["backend"], c["passes"], round(c["ratio"], 3)) for c in db.probe_checks(r.hardware)]
        assert checks == [("fake-a", 2, 0.952), ("fake-b", 3, 1.6), ("fake-a", 2, 1.0), ("fake-b", 2, 1.0)]
    with Database(tmp_path / "other.db") as other:  # the checks travel with the calibrations
        other.merge(str(tmp_path / "m.db"))
        assert len(other.probe_checks()) == 4 and other.probe_checks("cpu-none") == []
