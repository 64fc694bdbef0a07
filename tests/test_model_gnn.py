"""The GNN cost model on synthetic data: fit quality, artifacts, updates, uncertainty."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from scipy.stats import kendalltau

from collage_ml.featurize import HardwareDesc, SchemaError, subgraph_info
from collage_ml.featurize.schema import SCHEMA_VERSION
from collage_ml.ir.graph import SubGraph
from collage_ml.ir.importers import import_model
from collage_ml.models.base import ArtifactError, load_model
from collage_ml.models.dataset import Dataset, Sample
from collage_ml.models.gnn import GNNCostModel

from tests.helpers import random_convex_masks

HW = HardwareDesc(cores=2, threads=2, gpu=False)
#: backend -> (overhead seconds, FLOP/s, bytes/s): small subgraphs favour low overhead, big ones fast compute
COST = {
    "onnxruntime": (20e-6, 4e9, 8e9),
    "openvino": (60e-6, 12e9, 10e9),
    "torch": (8e-6, 1.5e9, 4e9),
}
NEW_BACKEND = ("inductor", (150e-6, 30e9, 20e9))
FAST = dict(hidden=32, layers=2, epochs=40, batch_size=64, mc_samples=8, dropout=0.1, seed=0)


def latency(info, backend: str) -> float:
    over, speed, bw = dict([NEW_BACKEND], **COST)[backend]
    flops = float(info.column("flops").sum())
    moved = float(info.column("bytes_read").sum() + info.column("bytes_written").sum())
    return over + flops / speed + moved / bw


@pytest.fixture(scope="module")
def infos():
    g = import_model("resnet50-tiny")
    out = {}
    for m in random_convex_masks(g, 400, 6, seed=0):
        i = subgraph_info(SubGraph(g, m))
        out[i.hash] = i
    assert len(out) > 100
    return [out[h] for h in sorted(out)]


def samples_for(infos, backends, source="resnet50") -> Dataset:
    return Dataset([Sample(i, b, HW, latency(i, b), source, source) for i in infos for b in backends])


@pytest.fixture(scope="module")
def split(infos):
    data = samples_for(infos, COST)
    return data.random_split(0.25, seed=1)


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    return GNNCostModel(**FAST).fit(train)


def test_fits_synthetic_costs_on_held_out_samples(fitted, split):
    _, test = split
    mu, sd = fitted.predict_log(list(test))
    tau = kendalltau(mu, test.y()).statistic
    assert tau > 0.8, tau
    # predictions are latencies in seconds through the shared predict()
    lat, _ = fitted.predict(list(test), HW)
    np.testing.assert_allclose(np.log(lat), mu, rtol=1e-6)
    assert fitted.meta["trained_on"]["n"] == len(split[0])


def test_untrained_architecture_does_not_rank(split):
    """The tau threshold above is not free: a model trained for zero epochs fails it."""
    train, test = split
    m = GNNCostModel(**{**FAST, "epochs": 0}).fit(train)
    mu, _ = m.predict_log(list(test))
    assert not kendalltau(mu, test.y()).statistic > 0.8


def test_save_load_round_trip_gives_identical_predictions(fitted, split, tmp_path):
    _, test = split
    items = list(test)
    mu, sd = fitted.predict_log(items)
    mu2, sd2 = fitted.predict_log(items)
    np.testing.assert_array_equal(mu, mu2)  # deterministic mean (and seeded MC spread)
    np.testing.assert_array_equal(sd, sd2)
    fitted.save(tmp_path / "gnn")
    assert (tmp_path / "gnn" / "state_dict.pt").exists()
    meta = json.loads((tmp_path / "gnn" / "meta.json").read_text())
    assert meta["kind"] == "gnn" and meta["params"]["hidden"] == FAST["hidden"]
    loaded = load_model(tmp_path / "gnn")
    assert isinstance(loaded, GNNCostModel) and loaded.params == fitted.params
    assert loaded.hw == HW
    lmu, lsd = loaded.predict_log(items)
    np.testing.assert_array_equal(lmu, mu)
    np.testing.assert_allclose(lsd, sd, rtol=1e-6)
    # the normalisers travelled with the weights (not the defaults of a fresh module)
    assert not torch.allclose(loaded.net.u_std, torch.ones_like(loaded.net.u_std))
    torch.testing.assert_close(loaded.net.x_mean, fitted.net.x_mean)


def test_schema_mismatch_is_refused(fitted, tmp_path):
    d = fitted.save(tmp_path / "gnn")
    meta = json.loads((d / "meta.json").read_text())
    meta["schema_version"] = SCHEMA_VERSION + 41
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError) as e:
        load_model(d)
    assert str(SCHEMA_VERSION + 41) in str(e.value) and str(SCHEMA_VERSION) in str(e.value)


def test_mismatched_feature_sizes_and_missing_weights_are_refused(fitted, tmp_path):
    d = fitted.save(tmp_path / "gnn")
    meta = json.loads((d / "meta.json").read_text())
    meta["node_features"] += 1
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="node_features"):
        load_model(d)
    d2 = fitted.save(tmp_path / "gnn2")
    (d2 / "state_dict.pt").unlink()
    with pytest.raises(ArtifactError, match="state_dict.pt"):
        load_model(d2)


def test_update_finetunes_on_a_newly_seen_group(split, infos):
    train, _ = split
    m = GNNCostModel(**{**FAST, "finetune_epochs": 30}).fit(train)
    new = samples_for(infos, [NEW_BACKEND[0]], source="new")
    seen, unseen = new.random_split(0.5, seed=2)

    def err(ds):
        mu, _ = m.predict_log(list(ds))
        return float(np.mean(np.abs(mu - ds.y())))

    before_seen, before_unseen = err(seen), err(unseen)
    old_err = err(split[1])
    out = m.update(seen)
    assert out["mode"] == "finetune" and out["n"] == len(seen)
    assert m.meta["updates"] == 1 and m.meta["update_samples"] == len(seen)
    after_seen, after_unseen = err(seen), err(unseen)
    assert after_seen < 0.5 * before_seen, (before_seen, after_seen)
    # it generalises to the new backend's other subgraphs, and replay keeps the old ones good
    assert after_unseen < 0.5 * before_unseen, (before_unseen, after_unseen)
    assert err(split[1]) < max(2 * old_err, 0.3), (old_err, err(split[1]))


def test_uncertainty_is_positive_and_finite(fitted, split):
    _, test = split
    _, sd = fitted.predict_log(list(test))
    assert np.all(np.isfinite(sd)) and np.all(sd > 0)
    no_mc = GNNCostModel(**{**FAST, "epochs": 1, "dropout": 0.0}).fit(split[0])
    assert np.all(no_mc.predict_log(list(test))[1] == 0)  # the spread comes from MC dropout


def test_unknown_parameters_are_rejected():
    with pytest.raises(ValueError, match="conv"):
        GNNCostModel(conv="gcn")
    with pytest.raises(ValueError, match="unknown GNNCostModel parameter.*hiden.*known: "):
        GNNCostModel(hiden=3)


def test_fit_is_seeded_and_leaves_the_global_rng_alone(split):
    train, test = split
    params = {**FAST, "epochs": 3}
    torch.manual_seed(123)
    expect = torch.rand(3)
    torch.manual_seed(123)
    a = GNNCostModel(**params).fit(train).predict_log(list(test))[0]
    assert torch.equal(torch.rand(3), expect)
    b = GNNCostModel(**params).fit(train).predict_log(list(test))[0]
    c = GNNCostModel(**{**params, "seed": 7}).fit(train).predict_log(list(test))[0]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


@pytest.mark.parametrize("conv", ["sage", "gin"])
def test_other_convolutions_fit_and_round_trip(conv, split, tmp_path):
    train, test = split
    m = GNNCostModel(**{**FAST, "conv": conv, "epochs": 2}).fit(train)
    mu, _ = m.predict_log(list(test))
    assert np.all(np.isfinite(mu))
    loaded = load_model(m.save(tmp_path / conv))
    assert loaded.params["conv"] == conv
    np.testing.assert_array_equal(loaded.predict_log(list(test))[0], mu)


def test_update_after_load_finetunes_without_replay(fitted, infos, tmp_path):
    loaded = load_model(fitted.save(tmp_path / "gnn"))
    new = samples_for(infos[:40], [NEW_BACKEND[0]], source="new")
    before = np.mean(np.abs(loaded.predict_log(list(new))[0] - new.y()))
    out = loaded.update(new)
    assert out == {"mode": "finetune", "n": len(new), "replay": 0}
    assert np.mean(np.abs(loaded.predict_log(list(new))[0] - new.y())) < before
