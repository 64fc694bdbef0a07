"""Guided placement end to end: real backends and database, a fixture cost model, the feedback loop."""

import pytest

import collage_ml
from collage_ml.db import Database
from collage_ml.models import base as models_base
from collage_ml.search.evolutionary import EvoConfig
from tests.fake_cost_models import FlopsFixtureModel
from tests.test_place import FAST

EVO = EvoConfig(generations=1, measure_per_generation=2, random_seeds=1)


@pytest.fixture
def fixture_kind(monkeypatch):
    monkeypatch.setitem(models_base.KINDS, "fixture", "tests.fake_cost_models:FlopsFixtureModel")


def test_guided_place_prunes_feeds_back_and_matches(tmp_path, fixture_kind):
    db = tmp_path / "m.db"
    model = FlopsFixtureModel()
    pm = collage_ml.place("resnet50-tiny", backends="onnxruntime,openvino", mode="guided", db=db,
                          cost_model=model, max_region_size=2, timing=FAST, evo_config=EVO)
    rep = pm.report
    assert rep["mode"] == "guided" and rep["outputs_match"], rep.get("mismatch")
    assert rep["predicted_candidates"] >= rep["distinct_candidates"]
    assert rep["pruned"] > 0 and rep["measurements"] > 0
    assert rep["measurements"] + rep["pruned"] <= rep["distinct_candidates"]
    # every measurement went to the database and to the model, and the model was saved next to the DB
    with Database(db) as d:
        stored = d.count(valid=None) - sum(1 for m in d.measurements() if m.key.subgraph_hash.startswith("boundary"))
    assert rep["model_updates"] == 1
    assert len(model.seen) > 0
    assert len(model.seen) <= rep["measurements"]
    saved = tmp_path / "cost-models"
    arts = list(saved.iterdir())
    assert len(arts) == 1 and arts[0].name.endswith("-fixture") and rep["model_saved_to"] == str(arts[0])
    assert stored >= rep["measurements"]
    # the chosen plan is the fastest measured end to end, and every partition of it was measured
    e2e = {k: v for k, v in rep["plans_e2e_ms"].items() if v is not None}
    if rep["head_to_head"] is not None:  # several plans were close: the head-to-head timings decide
        e2e = {k: v["ms"] for k, v in rep["head_to_head"]["plans"].items() if v["ms"] is not None}
    assert rep["plan_latency_ms"] == pytest.approx(min(e2e.values()))

    # the next run with cost_model="default" picks up the updated model next to the DB, and hits the cache
    again = collage_ml.place("resnet50-tiny", backends="onnxruntime,openvino", mode="guided", db=db,
                             max_region_size=2, timing=FAST, evo_config=EVO)
    assert again.report["cost_model"] == str(arts[0])
    assert again.report["measurements"] == 0 and again.report["cache_hits"] > 0
    assert again.report["outputs_match"]


def test_guided_with_an_inverted_model_still_matches(tmp_path, fixture_kind):
    pm = collage_ml.place("dcgan-tiny", backends="onnxruntime,torch", mode="guided", db=tmp_path / "m.db",
                          cost_model=FlopsFixtureModel(invert=True, sd=0.05), max_region_size=2, timing=FAST,
                          evo_config=EVO)
    assert pm.report["outputs_match"]
    assert pm.report["measurements"] > 0


def test_guided_errors(tmp_path):
    with pytest.raises(collage_ml.errors.CollageError, match="no cost-model artifact"):
        collage_ml.place("dcgan-tiny", backends="onnxruntime", mode="guided", db=tmp_path / "m.db",
                         cost_model=tmp_path / "nope", timing=FAST)
    with pytest.raises(collage_ml.errors.CollageError, match="unknown mode"):
        collage_ml.place("dcgan-tiny", backends="onnxruntime", mode="fast", db=tmp_path / "m.db")


def test_collect_focus_shares_the_feedback_loop(tmp_path, fixture_kind):
    model = FlopsFixtureModel()
    s = collage_ml.collect(models="dcgan-tiny", backends="onnxruntime", sampler="focus", cost_model=model,
                           db=tmp_path / "c.db", max_candidates=4, batch_sizes="1", progress=False,
                           timing=FAST, recalibrate_hours=None)
    assert s.measured == 4 and s.model_updates >= 1
    assert 0 < len(model.seen) <= 4
    saved = list((tmp_path / "cost-models").iterdir())
    assert len(saved) == 1 and saved[0].name.endswith("-fixture")


class _ProbingFixtureModel(FlopsFixtureModel):
    uses_probes = True  # as the real models: the machine is read from its probes


def test_collect_focus_calibrates_a_new_machine_before_it_plans(tmp_path, fixture_kind, monkeypatch):
    """The focus sampler weighs every candidate up front: on a database that never saw this machine it must do
    so with the machine's probes, so the calibration comes before planning, not with the first source."""
    from collage_ml.measure import probes
    from collage_ml.measure.runner import Runner

    monkeypatch.setattr(probes, "PROBES", probes.PROBES[10:12])  # layernorm and maxpool: fast
    runners, init = [], Runner.__init__
    monkeypatch.setattr(Runner, "__init__", lambda self, *a, **k: (runners.append(self), init(self, *a, **k))[1])
    model = _ProbingFixtureModel()
    predicted = []
    orig = model.predict_log
    model.predict_log = lambda samples: (predicted.extend(samples), orig(samples))[1]
    db = tmp_path / "c.db"
    s = collage_ml.collect(models="dcgan-tiny", backends="onnxruntime", sampler="focus", cost_model=model, db=db,
                           max_candidates=2, batch_sizes="1", progress=False, timing=FAST, recalibrate_hours=1.0)
    assert predicted and all(p.hw.probes_of("onnxruntime") is not None for p in predicted)
    assert s.calibrations == 1 and 0 < s.calibrate_s <= s.measure_s and s.measured == 2
    assert len(runners) == 1  # the calibration's runner measures too: its workers start once
    with Database(db, readonly=True) as d:
        assert len(d.calibrations(s.hardware, probes.PROBE_SET_VERSION)) == 1  # once: the first source found it fresh


def test_guided_place_runs_the_probe_set_once_per_machine(tmp_path, fixture_kind, monkeypatch, capsys):
    from collage_ml.measure import probes

    monkeypatch.setattr(probes, "PROBES", probes.PROBES[10:12])  # layernorm and maxpool: fast
    db = tmp_path / "m.db"
    runs = []
    for _ in range(2):
        model = _ProbingFixtureModel()
        predicted = []
        orig = model.predict_log
        model.predict_log = lambda samples, orig=orig: (predicted.extend(samples), orig(samples))[1]
        pm = collage_ml.place("dcgan-tiny", backends="onnxruntime,openvino", mode="guided", db=db, cost_model=model,
                              max_region_size=2, timing=FAST, evo_config=EVO)
        assert pm.report["outputs_match"]
        with Database(db, readonly=True) as d:
            runs.append(sorted((m.key.backend, m.timestamp) for m in d.measurements() if m.family == "probe"))
        # every prediction saw this machine's probes, for the candidate's own backend
        assert predicted and all(s.hw.probes_of(s.backend) is not None for s in predicted)
    first, second = runs
    assert len(first) == 2 * 4 and {b for b, _ in first} == {"onnxruntime", "openvino"}  # 2 probes x 2 batches
    assert second == first  # the second placement reused them: nothing re-measured
