"""The blend cost model: the mean of its members' log predictions, saved as artifacts inside its own."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch_geometric")

from collage_ml.featurize import HardwareDesc, subgraph_info
from collage_ml.ir.graph import SubGraph
from collage_ml.ir.importers import import_model
from collage_ml.models.base import ArtifactError, create_model, load_model
from collage_ml.models.blend import BlendCostModel
from collage_ml.models.dataset import Dataset, Sample

from tests.helpers import random_convex_masks

HW = HardwareDesc(cores=2, threads=2, gpu=False)
#: backend -> (overhead seconds, FLOP/s): small subgraphs favour torch, big ones openvino
COST = {"onnxruntime": (20e-6, 4e9), "openvino": (60e-6, 12e9), "torch": (8e-6, 1.5e9)}
PARAMS = {"xgb": {"n_members": 2, "n_estimators": 60, "ranker": False},
          "gnn": {"hidden": 16, "layers": 2, "epochs": 8, "batch_size": 64, "mc_samples": 4}}


@pytest.fixture(scope="module")
def data():
    g = import_model("resnet50-tiny")
    infos = {}
    for m in random_convex_masks(g, 120, 5, seed=3):
        i = subgraph_info(SubGraph(g, m))
        infos[i.hash] = i
    out = []
    for h in sorted(infos):
        i = infos[h]
        flops = float(i.column("flops").sum())
        for b, (over, speed) in COST.items():
            out.append(Sample(i, b, HW, over + flops / speed, "resnet50", "resnet50"))
    return Dataset(out)


@pytest.fixture(scope="module")
def fitted(data):
    return create_model("blend", member_params=PARAMS).fit(data)


def test_the_blend_predicts_the_mean_of_its_members_log_predictions(fitted, data):
    mu, sd = fitted.predict_log(data.samples)
    (mx, sx), (mg, sg) = (m.predict_log(data.samples) for m in fitted.members)
    assert [m.kind for m in fitted.members] == ["xgb", "gnn"]
    np.testing.assert_allclose(mu, (mx + mg) / 2)
    # the mixture's spread: never below the members' disagreement, nor below their mean variance
    assert np.all(sd >= np.abs(mx - mg) / 2 - 1e-12)
    assert np.all(sd**2 >= (sx**2 + sg**2) / 2 - 1e-12)
    lat, _ = fitted.predict(data.samples)
    np.testing.assert_allclose(lat, np.exp(mu))


def test_a_saved_blend_loads_with_identical_predictions(fitted, data, tmp_path):
    d = fitted.save(tmp_path / "blend")
    assert sorted(p.name for p in d.iterdir()) == ["member-0-xgb", "member-1-gnn", "meta.json"]
    assert load_model(d / "member-0-xgb").kind == "xgb"  # each member is an artifact of its own
    again = load_model(d)
    assert again.kind == "blend"
    np.testing.assert_allclose(again.predict_log(data.samples)[0], fitted.predict_log(data.samples)[0], rtol=1e-6)
    fitted.save(d)  # a blend artifact may be saved over
    assert load_model(d).kind == "blend"


def test_a_blend_of_fitted_models_keeps_them(fitted, data):
    b = BlendCostModel.of(fitted.members)
    np.testing.assert_allclose(b.predict_log(data.samples)[0], fitted.predict_log(data.samples)[0])
    assert b.params["members"] == ["xgb", "gnn"]


@pytest.mark.parametrize("names, match", [
    (["../outside", "member-1-gnn"], "member 0 is '../outside'"),
    (["member-1-gnn", "member-0-xgb"], "member 0 is 'member-1-gnn'"),
    (["member-0-xgb"], "does not list its 2 members"),
])
def test_a_blend_artifact_naming_other_folders_is_refused(fitted, tmp_path, names, match):
    d = fitted.save(tmp_path / "blend")
    meta = json.loads((d / "meta.json").read_text())
    meta["member_dirs"] = names
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=match):
        load_model(d)


def test_members_must_be_registered_kinds_and_not_blends(fitted, tmp_path):
    with pytest.raises(ValueError, match="members must be of the kinds"):
        create_model("blend", members=["xgb", "blend"])
    with pytest.raises(ValueError, match="two or more"):
        create_model("blend", members=["xgb"])
    # an unknown parameter is named, as for every kind (models.base.check_params)
    with pytest.raises(ValueError, match="unknown BlendCostModel parameter.*memebrs.*known: members"):
        create_model("blend", memebrs=["xgb", "gnn"])
    d = fitted.save(tmp_path / "blend")
    meta = json.loads((d / "meta.json").read_text())
    meta["params"]["members"] = ["xgb", "os:system"]  # a file names a module: refused, never imported
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="does not accept.*os:system"):
        load_model(d)


def test_an_update_updates_every_member(data):
    b = create_model("blend", member_params=PARAMS).fit(data.filter(lambda s: s.backend != "torch"))
    before = b.predict_log(data.samples)[0]
    info = b.update(data.filter(lambda s: s.backend == "torch"))
    assert info["mode"] == "blend" and len(info["members"]) == 2
    assert [m.meta["updates"] for m in b.members] == [1, 1] and b.meta["updates"] == 1
    assert not np.allclose(b.predict_log(data.samples)[0], before)


def test_the_default_is_xgb_and_the_blend_is_chosen_by_kind(monkeypatch, tmp_path):
    from collage_ml.measure import hardware
    from collage_ml.models import base

    arts = [(tmp_path / k, {"kind": k, "hw": {"gpu": False}, "trained_on": {"hardware": ["cpu-known-t2"]}})
            for k in ("gnn", "blend", "xgb")]
    monkeypatch.setattr(base, "shipped_artifacts", lambda: list(arts))
    monkeypatch.setattr(base.HardwareDesc, "current", classmethod(lambda cls, t=None: HW))
    for fp in ("cpu-known-t2", "cpu-never-seen-t2"):
        monkeypatch.setattr(hardware, "fingerprint", lambda t=None, fp=fp: fp)
        assert base.default_artifact().name == "xgb"
        assert base.default_artifact(kind="blend").name == "blend"
    monkeypatch.setattr(base, "shipped_artifacts", lambda: [a for a in arts if a[1]["kind"] != "xgb"])
    assert base.default_artifact().name == "blend"  # before the gnn when no xgb is shipped


def test_default_colon_kind_names_the_shipped_model_of_that_kind(tmp_path):
    from collage_ml.models.feedback import resolve_cost_model

    assert load_model("default:blend").kind == "blend"
    assert load_model("default:xgb").kind == "xgb"
    model, source, save_to = resolve_cost_model("default:blend", tmp_path / "m.db", "cpu-some-t2")
    assert model.kind == "blend" and source == "shipped default (blend)"
    assert save_to == tmp_path / "cost-models" / "cpu-some-t2-blend"
    with pytest.raises(ArtifactError, match="unknown cost-model kind 'forest' in 'default:forest'"):
        load_model("default:forest")


def test_cli_place_refuses_an_unknown_default_kind_in_one_line(capsys, tmp_path):
    from collage_ml.cli import main

    rc = main(["place", "resnet50-tiny", "--mode", "guided", "--cost-model", "default:forest", "--backends",
               "onnxruntime", "--no-graph-level", "--no-progress", "--db", str(tmp_path / "m.db")])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's one-line summary
    assert rc == 1 and last.startswith("collage-ml: error: unknown cost-model kind 'forest'"), last
