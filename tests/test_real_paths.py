"""Placement through the real paths (``collage_ml.place`` and the ``collage-ml place`` CLI), with a fixture
backend whose numbers are slightly wrong, and guided mode with the shipped cost model."""

from __future__ import annotations

import json
import shutil
import sqlite3

import onnx
import pytest

import collage_ml
from collage_ml.backends import base
from collage_ml.cli import main
from tests import bad_corpus
from tests.fake_backends import SlightlyWrongFixture

WRONG = SlightlyWrongFixture.name


@pytest.fixture
def slightly_wrong(monkeypatch):
    """Registers the fixture backend for this test only (workers rebuild it from its spec)."""
    base.registered()
    monkeypatch.setitem(base._FACTORIES, WRONG, SlightlyWrongFixture)
    yield WRONG
    for k in [k for k in base._INSTANCES if k.startswith(WRONG)]:
        del base._INSTANCES[k]


def _rows(db, backend):
    with sqlite3.connect(db) as c:
        return c.execute("SELECT valid, error_text FROM measurements WHERE backend = ?", (backend,)).fetchall()


def test_slightly_wrong_backend_is_avoided_and_alone_fails(tmp_path, slightly_wrong, capsys):
    model = tmp_path / "good.onnx"
    onnx.save(bad_corpus.good_model(), str(model))
    db = tmp_path / "m.db"
    pm = collage_ml.place(str(model), backends=f"onnxruntime,{WRONG}", db=str(db), max_region_size=1,
                          graph_level=False)
    rows = _rows(db, WRONG)
    assert len(rows) >= 3 and all(v == 0 and "wrong numbers" in (t or "") for v, t in rows), rows
    assert {p.backend for p in pm.plan.partitions} == {"onnxruntime"}
    assert pm.report["outputs_match"] and pm.report["baselines_ms"][WRONG] is None
    assert _rows(db, "onnxruntime") and all(v == 1 for v, _ in _rows(db, "onnxruntime"))

    # the CLI, same database (cache hits), placed model saved and loaded back
    out, rep = tmp_path / "placed", tmp_path / "report.json"
    assert main(["place", str(model), "--backends", f"onnxruntime,{WRONG}", "--db", str(db), "--max-region-size",
                 "1", "--no-graph-level", "--no-progress", "--out", str(out), "--report", str(rep)]) == 0
    r = json.loads(rep.read_text())
    assert r["outputs_match"] and {p["backend"] for p in r["partitions"]} == {"onnxruntime"}
    assert r["cache_hits"] >= len(rows) and r["measurements"] == 0
    assert [p.backend for p in collage_ml.load(out).plan.partitions] == ["onnxruntime"]

    # that backend alone: nothing valid covers the model, exit 1 with one line
    capsys.readouterr()
    assert main(["place", str(model), "--backends", WRONG, "--db", str(db), "--max-region-size", "1",
                 "--no-graph-level", "--no-progress"]) == 1
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("collage-ml: error:")]
    assert "Traceback" not in err and len(errors) == 1, err
    assert WRONG in errors[0] and "no plan" in errors[0] and "wrong numbers" in errors[0], errors[0]


def test_guided_with_the_shipped_model_survives_a_damaged_updated_model(tmp_path, monkeypatch, capsys):
    """``place --mode guided`` on a -tiny zoo model with the shipped cost model, where an earlier run left a
    damaged updated model next to the database: one warning, the shipped model, exit 0, and the next save
    replaces the damaged one."""
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.models import base as models_base
    from collage_ml.models import load_model
    from collage_ml.models.feedback import updated_path

    shipped = next(p for p, m in models_base.shipped_artifacts() if m.get("kind") == "xgb")
    # "default" is the shipped model that fits this machine; pin it so the test runs on any CPU
    monkeypatch.setattr(models_base, "default_artifact", lambda *a, **k: shipped)
    # a guided run of this tiny model measures fewer candidates than XGBoost's min_update, which the feedback
    # would hold (tests/test_model_xgb.py): here every one is learnt from, so that the update heals the folder
    from collage_ml.models.xgb import XGBCostModel

    monkeypatch.setattr(XGBCostModel, "min_update", 1)
    db = tmp_path / "m.db"
    damaged = updated_path(db, fingerprint(2), "xgb")
    shutil.copytree(shipped, damaged)
    (damaged / "member-0.json").write_text("{ truncated by a kill")
    rep = tmp_path / "r.json"
    capsys.readouterr()
    assert main(["place", "dcgan-tiny", "--mode", "guided", "--backends", "onnxruntime,openvino", "--threads", "2",
                 "--max-region-size", "1", "--no-graph-level", "--no-progress", "--db", str(db),
                 "--report", str(rep)]) == 0
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if "warning" in ln and str(damaged) in ln]
    assert len(warnings) == 1 and "does not load" in warnings[0], err
    r = json.loads(rep.read_text())
    assert r["mode"] == "guided" and r["cost_model"] == "shipped default", r["cost_model"]
    assert r["outputs_match"] and r["predicted_candidates"] > 0 and r["pruned"] > 0
    # an empty database: the probe set ran first (it counts in "measurements"), and the chosen plan was measured
    assert r["probe_measurements"] > 0
    assert 1 <= r["measurements"] - r["probe_measurements"] < r["candidates"]
    assert r["model_updates"] >= 1
    assert load_model(damaged).meta.get("updates", 0) >= 1  # healed: the update was saved over the damaged folder
