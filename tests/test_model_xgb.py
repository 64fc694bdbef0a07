"""XGBCostModel on synthetic samples with a known cost formula (no measurement database needed)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from scipy.stats import kendalltau

from collage_ml.featurize import SCHEMA_VERSION, HardwareDesc, SchemaError, subgraph_info
from collage_ml.featurize.schema import OP_INDEX
from collage_ml.ir.graph import SubGraph
from collage_ml.ir.importers import import_model
from collage_ml.models import ArtifactError, Dataset, Sample, load_model
from collage_ml.models.xgb import XGBCostModel
from tests.helpers import random_convex_masks

HW = HardwareDesc(cores=2, threads=2, gpu=False)
BACKENDS = ("onnxruntime", "openvino", "torch")
# the synthetic machine: launch overhead + per-node overhead + flops / speed per op class + bytes / bandwidth
OVERHEAD = {"onnxruntime": 5e-6, "openvino": 30e-6, "torch": 15e-6}
PER_NODE = {"onnxruntime": 2e-6, "openvino": 1e-6, "torch": 8e-6}
SPEED = {  # flop/s for (conv, matmul, other) nodes
    "onnxruntime": (20e9, 30e9, 2e9),
    "openvino": (40e9, 6e9, 3e9),
    "torch": (10e9, 25e9, 1e9),
}
BW = {"onnxruntime": 10e9, "openvino": 15e9, "torch": 5e9}
CONV = [OP_INDEX["Conv"], OP_INDEX["ConvTranspose"]]
MATMUL = [OP_INDEX["MatMul"], OP_INDEX["Gemm"], OP_INDEX["Einsum"]]

# small and fast for tests
PARAMS = dict(n_members=3, n_estimators=150, max_depth=4, learning_rate=0.1, update_rounds=60)


def true_latency(info, backend: str) -> float:
    v = info.node_values
    flops, moved = v[:, 0], v[:, 1] + v[:, 2]
    conv, mm = np.isin(info.ops, CONV), np.isin(info.ops, MATMUL)
    sc, sm, so = SPEED[backend]
    compute = flops[conv].sum() / sc + flops[mm].sum() / sm + flops[~(conv | mm)].sum() / so
    return float(OVERHEAD[backend] + PER_NODE[backend] * info.n_nodes + compute + moved.sum() / BW[backend])


def samples_of(models: list[tuple[str, int]], family: str, per_model: int = 300) -> Dataset:
    infos = {}
    for k, (name, batch) in enumerate(models):
        g = import_model(name, batch=batch)
        for mask in random_convex_masks(g, per_model, 10, seed=k):
            info = subgraph_info(SubGraph(g, mask))
            infos[info.hash] = info
    return Dataset(
        [
            Sample(info, b, HW, true_latency(info, b), family=family, source=family)
            for info in infos.values()
            for b in BACKENDS
        ]
    )


@pytest.fixture(scope="module")
def convnets() -> Dataset:
    return samples_of([("resnet50-tiny", 1), ("resnet50-tiny", 4), ("mobilenetv2-tiny", 2), ("nasnet-tiny", 1)], "conv")


@pytest.fixture(scope="module")
def transformers() -> Dataset:
    return samples_of([("bert-tiny", 1), ("bert-tiny", 4)], "bert")


@pytest.fixture(scope="module")
def fitted(convnets):
    train, test = convnets.random_split(0.3, seed=0)
    return XGBCostModel(**PARAMS).fit(train), train, test


def log_rmse(model, data: Dataset) -> float:
    mu, _ = model.predict_log(data.samples)
    return float(np.sqrt(np.mean((mu - data.y()) ** 2)))


def test_ranks_held_out_subgraphs(fitted):
    model, train, test = fitted
    assert len(train) > 1000 and len(test) > 400
    mu, sd = model.predict_log(test.samples)
    tau = kendalltau(mu, test.y())[0]
    assert tau > 0.8, tau
    # predict() goes through the base class: latency in seconds
    lat, unc = model.predict(test.samples[:50])
    np.testing.assert_allclose(lat, np.exp(mu[:50]), rtol=1e-12)
    np.testing.assert_array_equal(unc, sd[:50])
    assert model.meta["trained_on"]["n"] == len(train)
    assert model.meta["trained_on"]["backends"] == sorted(BACKENDS)


def test_save_load_round_trip(fitted, tmp_path):
    model, _, test = fitted
    d = model.save(tmp_path / "m")
    meta = json.loads((d / "meta.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION
    assert meta["kind"] == "xgb"
    assert meta["members"] == PARAMS["n_members"]
    assert meta["params"]["n_estimators"] == PARAMS["n_estimators"]
    files = {p.name for p in d.iterdir()}
    assert files == {"meta.json", "ranker.json"} | {f"member-{i}.json" for i in range(PARAMS["n_members"])}
    assert meta["ranker"] is True
    for i in range(PARAMS["n_members"]):
        assert "learner" in json.loads((d / f"member-{i}.json").read_text())  # XGBoost's JSON model

    loaded = load_model(d)
    assert isinstance(loaded, XGBCostModel)
    assert loaded.params == model.params
    assert loaded.hw == HW
    a, b = model.predict_log(test.samples), loaded.predict_log(test.samples)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_refuses_other_schema_version(fitted, tmp_path):
    model, _, _ = fitted
    src = model.save(tmp_path / "m")
    d = shutil.copytree(src, tmp_path / "other")
    meta = json.loads((d / "meta.json").read_text())
    meta["schema_version"] = SCHEMA_VERSION + 41
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError) as e:
        load_model(d)
    msg = str(e.value)
    assert re.search(rf"schema {SCHEMA_VERSION + 41}\b", msg) and re.search(rf"schema {SCHEMA_VERSION}\b", msg), msg
    load_model(src)  # the untouched original still loads


def test_refuses_damaged_artifacts(fitted, tmp_path):
    model, _, _ = fitted
    src = model.save(tmp_path / "m")

    d = shutil.copytree(src, tmp_path / "cols")
    meta = json.loads((d / "meta.json").read_text())
    meta["feature_names"] = meta["feature_names"][:-1]
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="feature"):
        load_model(d)

    d = shutil.copytree(src, tmp_path / "missing")
    (d / "member-1.json").unlink()
    with pytest.raises(ArtifactError, match="member-1.json"):
        load_model(d)

    d = shutil.copytree(src, tmp_path / "no-ranker")
    (d / "ranker.json").unlink()
    with pytest.raises(ArtifactError, match="ranker.json"):
        load_model(d)


def _backend_order_accuracy(pred: np.ndarray, data: Dataset) -> float:
    """Share of backend pairs of one subgraph that ``pred`` orders as the true latency does."""
    by: dict[str, list[int]] = {}
    for i, s in enumerate(data.samples):
        by.setdefault(s.info.hash, []).append(i)
    y, good, total = data.y(), 0, 0
    for idx in by.values():
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                i, j = idx[a], idx[b]
                total += 1
                good += (pred[i] < pred[j]) == (y[i] < y[j])
    return good / total


def test_ranker_reorders_backends_and_keeps_the_levels(fitted):
    """Within one subgraph the ranker only permutes the regressors' values: the DP's sums keep their level,
    and the order is the ranker's, which knows the synthetic machine's backend order."""
    model, _, test = fitted
    assert model.ranker is not None
    with_ranker = model.predict_members(test.samples)
    ranker, model.ranker = model.ranker, None
    try:
        plain = model.predict_members(test.samples)
    finally:
        model.ranker = ranker
    by: dict[str, list[int]] = {}
    for i, s in enumerate(test.samples):
        by.setdefault(s.info.hash, []).append(i)
    groups = [np.array(v) for v in by.values() if len(v) == len(BACKENDS)]
    assert len(groups) > 100
    X, _ = model._features(test.samples)
    score = ranker.inplace_predict(X)
    w = model.params["ranker_weight"]
    moved = 0
    for idx in groups:
        np.testing.assert_array_equal(np.sort(with_ranker[:, idx], axis=1), np.sort(plain[:, idx], axis=1))
        for m in range(plain.shape[0]):
            fastest = idx[np.argmin(plain[m, idx] - w * score[idx])]
            assert with_ranker[m, fastest] == with_ranker[m, idx].min()
        moved += not np.array_equal(with_ranker[:, idx], plain[:, idx])
    assert moved > 0  # the ranker changed some order: the test would notice it doing nothing
    assert _backend_order_accuracy(score * -1.0, test) > 0.85
    # a lone sample has no group: the regressors' value stands
    np.testing.assert_array_equal(model.predict_members(test.samples[:1]), plain[:, :1])


def test_ranker_off_and_updated(convnets):
    train, _ = convnets.random_split(0.3, seed=2)
    off = XGBCostModel(**PARAMS, ranker=False).fit(train)
    assert off.ranker is None
    on = XGBCostModel(**PARAMS, retrain_fraction=10.0).fit(train)
    rounds = on.ranker.num_boosted_rounds()
    on.update(Dataset(train.samples[:90]))  # 30 subgraphs on every backend: groups to learn from
    assert on.ranker.num_boosted_rounds() == rounds + PARAMS["update_rounds"]


def test_update_learns_a_new_family(convnets, transformers):
    train, held = convnets.random_split(0.3, seed=1)
    seen, unseen = transformers.random_split(0.6, seed=0)  # update with 40% of the new family's subgraphs
    model = XGBCostModel(**PARAMS, retrain_fraction=10.0).fit(train)
    before_new, before_old = log_rmse(model, unseen), log_rmse(model, held)
    assert before_new > 2 * before_old  # the new family really is new to the model

    info = model.update(seen)
    assert info["mode"] == "continue" and info["n"] == len(seen) and info["replay"] == len(seen)
    assert model.meta["updates"] == 1 and model.meta["update_samples"] == len(seen)
    after_new, after_old = log_rmse(model, unseen), log_rmse(model, held)
    assert after_new < 0.6 * before_new, (before_new, after_new)
    assert after_old < 1.5 * before_old + 0.02, (before_old, after_old)  # the replay keeps it from forgetting


def test_update_policy(convnets, tmp_path):
    small = dict(n_members=2, n_estimators=20, max_depth=3, update_rounds=5, retrain_fraction=0.25)
    data = convnets.sample(800, seed=0)
    base, extra = data[:400], data[400:]
    model = XGBCostModel(**small).fit(base)
    trees = len(model.members[0].get_dump())
    assert model.update(extra[:60])["mode"] == "continue"  # 60 < 0.25 * 400
    assert len(model.members[0].get_dump()) == trees + 5
    r = model.update(extra[60:110])  # 110 added since the fit >= 100
    assert r["mode"] == "retrain" and r["trained_on"] == 510
    assert len(model.members[0].get_dump()) == trees
    assert model.meta["trained_on"]["n"] == 510 and model.meta["updates"] == 2
    assert model.update(extra[110:150])["mode"] == "continue"  # 40 < 0.25 * 510

    # a loaded model keeps no training data: it continues on the new samples alone, however many
    loaded = load_model(model.save(tmp_path / "m"))
    r = loaded.update(extra[150:300])
    assert r["mode"] == "continue" and r["replay"] == 0 and r["n"] == 150
    # later ones replay what came since the load, and never refit from that alone
    r = loaded.update(extra[300:])
    assert r["mode"] == "continue" and r["replay"] == 100
    assert loaded.meta["updates"] == 5

    fresh = XGBCostModel(**small)
    assert fresh.update(Dataset())["mode"] == "none"
    assert fresh.update(base)["mode"] == "retrain" and fresh.members


def test_uncertainty(fitted, transformers):
    model, train, test = fitted
    noise = model.meta["noise_std"]
    assert noise > 0

    def parts(data):
        mu, sd = model.predict_log(data.samples)
        spread = model.predict_members(data.samples).std(axis=0, ddof=1)
        np.testing.assert_allclose(sd, np.sqrt(spread**2 + noise**2))
        assert (sd > 0).all()
        return float(np.median(sd)), float(np.median(spread))

    sd_train, spread_train = parts(train)
    sd_in, spread_in = parts(test)  # unseen subgraphs of the training models
    sd_out, spread_out = parts(transformers)  # an unseen op mix (MatMul-heavy transformer blocks)
    # the members disagree more the further from the training data; the noise floor (the members' out-of-bag
    # error, the same for every sample) damps that in the reported std but keeps the order
    assert spread_train < spread_in and spread_out > 1.3 * spread_in, (spread_train, spread_in, spread_out)
    assert sd_train < sd_in < sd_out


def test_rejects_unknown_params():
    with pytest.raises(ValueError, match="unknown XGBCostModel parameter.*max_dpeth.*known: "):
        XGBCostModel(max_dpeth=3)


def test_feedback_holds_fewer_samples_than_an_update_can_learn_from(convnets, tmp_path):
    """Two samples 4x slower than predicted would move every prediction of a loaded model by their mean error
    (no replay, no split); the feedback holds them until ``min_update`` samples are at hand, then learns."""
    from dataclasses import replace

    from collage_ml.models.feedback import Feedback

    small = dict(n_members=2, n_estimators=40, max_depth=4, update_rounds=50)
    data = convnets.sample(600, seed=0)
    base, probe = data[:400], data[400:]
    loaded = load_model(XGBCostModel(**small).fit(base).save(tmp_path / "m"))
    before = loaded.predict_log(list(probe))[0]

    def slow(samples, factor=4.0):  # the same subgraphs, measured 4x slower than the model thinks
        return Dataset([replace(s, latency=s.latency * factor) for s in samples])

    fb = Feedback(loaded, tmp_path / "saved", HardwareDesc.current(1))
    fb.held = list(slow(base[:2]))
    assert fb.flush() is None and len(fb.held) == 2 and fb.updates == 0
    assert np.array_equal(loaded.predict_log(list(probe))[0], before)  # nothing moved
    assert not (tmp_path / "saved").exists()
    # the contrast: the same two samples learnt from directly move every prediction by about their error
    shifted = load_model(tmp_path / "m")
    shifted.update(slow(base[:2]))
    move = shifted.predict_log(list(probe))[0] - before
    assert np.median(move) > 0.5 * np.log(4.0), np.median(move)
    # with enough at hand, the held ones join the update
    fb.held += list(slow(base[2:XGBCostModel.min_update]))
    info = fb.flush()
    assert info is not None and info["n"] == XGBCostModel.min_update and fb.held == [] and fb.updates == 1
    assert (tmp_path / "saved" / "meta.json").exists()


def test_machine_balance_weighs_each_machine_the_same():
    """``balance="machine"``: a machine with nine times the rows no longer sets the prediction by itself. Two
    machines that the features cannot tell apart disagree by 4x on every subgraph; unbalanced, the model lands
    near the big machine's latencies, balanced near the geometric middle (2x the big one's)."""
    import dataclasses

    from collage_ml.models.xgb import machine_weights

    base = samples_of([("bert-tiny", 1)], "bert", per_model=60)
    infos = list({s.info.hash: s for s in base if s.backend == "onnxruntime"}.values())
    big = [dataclasses.replace(s, hardware="cpu-big") for s in infos for _ in range(9)]
    small = [dataclasses.replace(s, hardware="cpu-small", latency=4 * s.latency) for s in infos]
    w = machine_weights(big + small)
    assert w[: len(big)].sum() == pytest.approx(w[len(big):].sum()) and w.mean() == pytest.approx(1.0)
    ratios = {}
    for balance in ("none", "machine"):
        m = XGBCostModel(**{**PARAMS, "n_members": 1, "ranker": False, "target": "log"}, balance=balance)
        m.fit(Dataset(big + small))
        pred = m.predict(infos)[0]
        ratios[balance] = float(np.exp(np.median(np.log(pred / np.array([s.latency for s in infos])))))
    assert ratios["none"] < 1.5 and 1.7 < ratios["machine"] < 2.3, ratios
    with pytest.raises(ValueError, match="unknown balance 'fleet'"):
        XGBCostModel(balance="fleet")


def test_a_configuration_that_changes_the_graph_is_predicted_as_that_graph(transformers):
    """A machine on which ONNX Runtime's fused Add + LayerNorm kernel is 3x slower than the pair (as on the
    Zen 3): trained on plain backends only, the model predicts ``onnxruntime[skipln=off]`` as ORT running the
    unfused graph, which it has seen in the subgraphs whose pairs ORT does not fuse."""
    from collage_ml.featurize.flat import residual_add_ln

    def machine(info, backend):
        base = true_latency(info, "onnxruntime" if backend.startswith("onnxruntime") else backend)
        n, nbytes = residual_add_ln(info)
        fused = n if backend == "onnxruntime" else 0
        return base + fused * 2 * nbytes / BW["onnxruntime"] * 40

    data = Dataset([Sample(s.info, s.backend, HW, machine(s.info, s.backend), family="bert", source="bert")
                    for s in transformers if s.backend != "torch"])
    fused = [s for s in data if s.backend == "onnxruntime" and residual_add_ln(s.info)[0] > 0]
    assert len(fused) > 30
    held = {s.info.hash for s in fused[::3]}
    model = XGBCostModel(**PARAMS).fit(data.filter(lambda s: s.info.hash not in held))
    infos = list({s.info.hash: s.info for s in fused if s.info.hash in held}.values())
    plain, off = (np.array(model.predict([Sample(i, b, HW) for i in infos])[0])
                  for b in ("onnxruntime", "onnxruntime[skipln=off]"))
    truth_plain = np.array([machine(i, "onnxruntime") for i in infos])
    truth_off = np.array([machine(i, "onnxruntime[skipln=off]") for i in infos])
    assert np.median(truth_off / truth_plain) < 0.6  # the premise: the fusion costs a lot here
    assert np.mean(off < plain) > 0.9
    # and by about the right amount
    assert abs(np.median(np.log(off / plain)) - np.median(np.log(truth_off / truth_plain))) < 0.35
