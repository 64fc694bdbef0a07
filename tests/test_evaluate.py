"""Cost-model evaluation: metrics with known answers, decision groups, the protocols, and `collage-ml train/eval`."""

from __future__ import annotations

import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from collage_ml.backends import get_backend
from collage_ml.candidates import enumerate_candidates
from collage_ml.cli import main
from collage_ml.cost import CandidateKey, Measurement
from collage_ml.db import Database
from collage_ml.featurize.flat import FEATURES, flat_matrix
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import subgraph_info
from collage_ml.ir.importers import import_model
from collage_ml.models import base as base_mod
from collage_ml.models.base import CostModel
from collage_ml.models.dataset import Dataset, Sample
from collage_ml.models.evaluate import (
    METRICS,
    average_metrics,
    backend_groups,
    decision_groups,
    evaluate,
    few_shot,
    leave_one_family_out,
    metrics_from_predictions,
    ranking_metrics,
)

BACKENDS = ("onnxruntime", "openvino", "torch")
FP = "cpu-test-t2-000000000000"
HW2 = HardwareDesc(cores=2, threads=2, gpu=False)
HW1 = HardwareDesc(cores=2, threads=1, gpu=False)
_COL = {f: i for i, f in enumerate(FEATURES)}
_BACKEND_FACTOR = {"onnxruntime": 1.0, "openvino": 0.8, "torch": 1.3}


# ----------------------------------------------------------------------------- stand-in models
class StubModel(CostModel):
    """Least squares of log latency on [1, log FLOPs, log bytes, backend one-hot]; update() shifts the bias."""

    kind = "stub"
    _COLS = [_COL["log_flops"], _COL["log_bytes_read"], _COL["n_nodes"]] + [_COL[f"backend:{b}"] for b in BACKENDS]

    def __init__(self, **params):
        super().__init__(**params)
        self.coef: np.ndarray | None = None

    def _x(self, samples):
        m = flat_matrix([(s.info, s.backend, s.hw) for s in samples])[:, self._COLS].astype(np.float64)
        threads = np.array([np.log(s.hw.threads) for s in samples])
        return np.column_stack([np.ones(len(samples)), m, threads])

    def fit(self, data):
        self._record_fit(data)
        self.coef = np.linalg.lstsq(self._x(data.samples), data.y(), rcond=None)[0]
        return self

    def update(self, new):
        resid = new.y() - self._x(new.samples) @ self.coef
        self.coef = self.coef.copy()
        self.coef[0] += float(resid.mean())
        self._record_update(len(new))
        return {"mode": "bias", "n": len(new)}

    def predict_log(self, samples):
        return self._x(samples) @ self.coef, np.zeros(len(samples))

    def _save_payload(self, directory: Path):
        (directory / "coef.json").write_text(json.dumps(self.coef.tolist()))
        return {}

    def _load_payload(self, directory: Path, meta):
        self.coef = np.array(json.loads((directory / "coef.json").read_text()))


class Oracle:
    """Predicts ``f(true latency)``."""

    def __init__(self, f=lambda t: t):
        self.f = f

    def predict(self, samples):
        t = np.array([s.latency for s in samples])
        return self.f(t), np.zeros(len(t))


# ----------------------------------------------------------------------------- data
def _latency(sg, backend: str, threads: int = 2) -> float:
    """A made-up but structured latency: overhead + work, per-backend factor, a bit of hash noise."""
    info = subgraph_info(sg)
    flops = float(info.column("flops").sum())
    moved = float(info.column("bytes_read").sum() + info.column("bytes_written").sum())
    noise = 1.0 + 0.2 * ((zlib.crc32(f"{sg.hash}{backend}".encode()) % 1000) / 1000.0 - 0.5)
    return (4e-6 * len(sg) + flops / 2e10 + moved / 1e10) * _BACKEND_FACTOR[backend] * noise * (2.0 / threads) ** 0.7


def _candidates(model: str):
    g = import_model(model)
    return list(enumerate_candidates(g, [get_backend(b) for b in BACKENDS], 3))


def _samples(model: str, family: str, hw=HW2, fp=FP) -> list[Sample]:
    out, seen = [], set()
    for c in _candidates(model):
        k = (c.subgraph.hash, c.backend.name)
        if k in seen:
            continue
        seen.add(k)
        out.append(Sample(subgraph_info(c.subgraph), c.backend.name, hw, _latency(c.subgraph, c.backend.name, hw.threads),
                          family, family, c.key, fp, c.pattern))
    return out


@pytest.fixture(scope="module")
def tiny_ds() -> Dataset:
    """resnet50-tiny and dcgan-tiny candidates, sources resnet50 and dcgan (rebuilt from the -tiny models)."""
    return Dataset(_samples("resnet50-tiny", "resnet50") + _samples("dcgan-tiny", "dcgan"))


TINY_MODELS = {"resnet50": "resnet50-tiny", "dcgan": "dcgan-tiny"}


# ----------------------------------------------------------------------------- metrics with known answers
TRUE = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
GROUPS = [np.array([0, 1, 2]), np.array([3, 4, 5])]
BGROUPS = [np.array([0, 3]), np.array([1, 4])]


def test_perfect_predictor():
    m = metrics_from_predictions(TRUE, TRUE.copy(), GROUPS, BGROUPS)
    assert m["pairwise_accuracy"] == 1.0 and m["kendall_tau"] == 1.0 and m["top1_regret"] == 0.0
    assert m["pairwise_resolvable"] == 1.0
    assert m["mape"] == 0.0 and m["within_10pct"] == 1.0
    assert m["backend_pairwise_accuracy"] == 1.0 and m["backend_choice_regret"] == 0.0
    assert (m["n"], m["n_groups"], m["n_pairs"], m["n_backend_groups"]) == (6, 2, 6, 2)
    # a constant factor keeps every ranking but not the accuracy
    m = metrics_from_predictions(TRUE, 2 * TRUE, GROUPS, BGROUPS)
    assert m["pairwise_accuracy"] == 1.0 and m["top1_regret"] == 0.0
    assert m["mape"] == pytest.approx(1.0) and m["within_10pct"] == 0.0


def test_inverted_predictor():
    m = metrics_from_predictions(TRUE, 1.0 / TRUE, GROUPS, BGROUPS)
    assert m["pairwise_accuracy"] == 0.0 and m["kendall_tau"] == -1.0 and m["pairwise_resolvable"] == 0.0
    assert m["backend_pairwise_accuracy"] == 0.0
    # picks 3 instead of 1, and 6 instead of 4
    assert m["top1_regret"] == pytest.approx(((3 / 1 - 1) + (6 / 4 - 1)) / 2)
    assert m["backend_choice_regret"] == pytest.approx(((4 / 1 - 1) + (5 / 2 - 1)) / 2)


def test_one_swap_ties_and_mape():
    r = ranking_metrics(np.array([1.0, 2.0, 3.0]), np.array([2.0, 1.0, 3.0]), [np.arange(3)])
    assert r["pairwise_accuracy"] == pytest.approx(2 / 3)
    assert r["kendall_tau"] == pytest.approx(1 / 3)
    assert r["top1_regret"] == pytest.approx(1.0)  # picks the 2 s candidate over the 1 s one
    # a predicted tie is half right; a constant prediction has no tau
    r = ranking_metrics(np.array([1.0, 2.0]), np.array([5.0, 5.0]), [np.arange(2)])
    assert r["pairwise_accuracy"] == 0.5 and math.isnan(r["kendall_tau"])
    # pairs with equal true latency are not scored
    r = ranking_metrics(np.array([1.0, 1.0, 2.0]), np.array([3.0, 1.0, 2.0]), [np.arange(3)])
    assert r["pairs"] == 2 and r["pairwise_accuracy"] == 0.5
    # pairs whose labels are within 10% of each other are left out of pairwise_resolvable
    r = ranking_metrics(np.array([1.0, 1.05, 2.0]), np.array([2.0, 1.0, 3.0]), [np.arange(3)])
    assert r["pairwise_accuracy"] == pytest.approx(2 / 3)  # the 1.0/1.05 pair is swapped
    assert r["pairwise_resolvable"] == 1.0  # the two pairs 2x apart are right
    r = ranking_metrics(np.array([1.0, 1.05]), np.array([2.0, 1.0]), [np.arange(2)])
    assert r["pairwise_accuracy"] == 0.0 and math.isnan(r["pairwise_resolvable"])
    m = metrics_from_predictions(np.array([1.0, 2.0, 4.0]), np.array([1.05, 2.4, 2.0]))
    assert m["mape"] == pytest.approx((0.05 + 0.2 + 0.5) / 3)
    assert m["within_10pct"] == pytest.approx(1 / 3)
    assert math.isnan(m["pairwise_accuracy"]) and m["n_groups"] == 0


def test_average_metrics():
    avg = average_metrics({"a": {"n": 10, "mape": 0.2, "kendall_tau": math.nan, "n_groups": 3},
                           "b": {"n": 30, "mape": 0.4, "kendall_tau": 0.5, "n_groups": 2}})
    assert avg["families"] == 2 and avg["n"] == 40 and avg["n_groups"] == 5
    assert avg["mape"] == pytest.approx(0.3) and avg["kendall_tau"] == 0.5


# ----------------------------------------------------------------------------- decision and backend groups
def test_decision_groups_group_by_first_node(tiny_ds):
    cands = _candidates("resnet50-tiny")
    firsts: dict[tuple[str, str], set[int]] = {}
    for c in cands:
        m = c.subgraph.mask
        firsts.setdefault((c.subgraph.hash, c.backend.name), set()).add((m & -m).bit_length() - 1)
    ds = Dataset([s for s in tiny_ds if s.source == "resnet50"])
    extra = [
        Sample(ds[0].info, "onnxruntime", HW2, 1e-3, "random", "mystery", None, FP),  # a source no zoo family
        Sample(ds[1].info, "inductor", HW2, 1e-3, "random", "resnet50", None, FP),  # a key never enumerated
        Sample(ds[2].info, ds[2].backend, HW2, 9.0, "resnet50", "resnet50", None, FP),  # a duplicate key
    ]
    ds = Dataset(ds.samples + extra)
    g = decision_groups(ds, models=TINY_MODELS, backends=BACKENDS)
    assert len(g) >= 10 and g.n == len(ds)
    assert g.unrebuilt == {"mystery": 1}
    n = len(ds)
    assert all(n - 3 not in grp and n - 2 not in grp for grp in g.groups)
    assert all(n - 1 not in grp for grp in g.groups)  # one sample per key: the first
    for grp, (hw, fam, node) in zip(g.groups, g.labels):
        assert hw == FP and fam == "resnet50" and len(grp) >= 2
        keys = [(ds[i].info.hash, ds[i].backend) for i in grp]
        assert len(set(keys)) == len(keys)
        for k in keys:
            assert node in firsts[k]
    # the group of node 0 holds every candidate that starts there (op, region, whole model), on each backend
    at0 = {k for k, f in firsts.items() if 0 in f}
    grp0 = next(grp for grp, lab in zip(g.groups, g.labels) if lab[2] == 0)
    assert {(ds[i].info.hash, ds[i].backend) for i in grp0} == at0
    assert len({ds[i].backend for i in grp0}) == 3
    grouped = set(np.concatenate(g.groups).tolist())
    assert g.ungrouped == n - len(grouped) >= 3
    # cached: the second call does not enumerate again and gives the same groups
    g2 = decision_groups(ds, models=TINY_MODELS, backends=BACKENDS)
    assert [x.tolist() for x in g2.groups] == [x.tolist() for x in g.groups]


def test_groups_stay_within_one_hardware(tiny_ds):
    ds = Dataset(_samples("dcgan-tiny", "dcgan") + _samples("dcgan-tiny", "dcgan", hw=HW1, fp="other-hw"))
    g = decision_groups(ds, models=TINY_MODELS)
    assert {lab[0] for lab in g.labels} == {FP, "other-hw"}
    for grp, lab in zip(g.groups, g.labels):
        assert {ds[i].hardware for i in grp} == {lab[0]}
    bg = backend_groups(ds)
    assert bg and all(len({ds[i].hardware for i in grp}) == 1 for grp in bg)
    assert all(len({ds[i].backend for i in grp}) == len(grp) >= 2 for grp in bg)


def test_evaluate_with_oracles(tiny_ds):
    kw = dict(models=TINY_MODELS)
    perfect = evaluate(Oracle(), tiny_ds, **kw)
    assert perfect["pairwise_accuracy"] == 1.0 and perfect["top1_regret"] == 0.0 and perfect["mape"] == 0.0
    assert perfect["backend_pairwise_accuracy"] == 1.0 and perfect["backend_choice_regret"] == 0.0
    assert perfect["n"] == len(tiny_ds) and perfect["n_groups"] > 10 and perfect["n_backend_groups"] > 10
    inverted = evaluate(Oracle(lambda t: 1 / t), tiny_ds, decision_groups(tiny_ds, **kw))
    assert inverted["pairwise_accuracy"] == 0.0 and inverted["kendall_tau"] == -1.0
    assert inverted["backend_pairwise_accuracy"] == 0.0 and inverted["top1_regret"] > 0
    with pytest.raises(ValueError, match="index"):
        evaluate(Oracle(), tiny_ds[:5], decision_groups(tiny_ds, **kw))


# ----------------------------------------------------------------------------- protocols
@pytest.fixture
def stub_kind(monkeypatch):
    monkeypatch.setitem(base_mod.KINDS, "stub", f"{__name__}:StubModel")


def test_leave_one_family_out(tiny_ds):
    lines, preds = [], {}
    res = leave_one_family_out(StubModel, tiny_ds, progress=lines.append, predictions=preds, models=TINY_MODELS)
    assert set(res) == {"dcgan", "resnet50"} and len(lines) == 2
    for fam, m in res.items():
        test = [s for s in tiny_ds if s.source == fam]
        assert m["n"] == len(test) and m["n_train"] == len(tiny_ds) - len(test)
        assert set(METRICS) <= set(m) and 0 <= m["fit_seconds"] < 60, m["fit_seconds"]
        assert len(preds[fam]["pred"]) == len(test) == len(preds[fam]["backend"]) == len(preds[fam]["std"])
        assert np.all(np.asarray(preds[fam]["std"]) >= 0)
        assert m["pairwise_accuracy"] > 0.5  # the stub learns flops -> latency
    avg = average_metrics(res)
    assert avg["n"] == len(tiny_ds)
    with pytest.raises(ValueError, match="unknown families"):
        leave_one_family_out(StubModel, tiny_ds, families=["nope"])


def test_extra_training_rows_join_every_fold_less_the_held_out_family(tiny_ds):
    """``extra_train`` is trained on, never scored; its own rows of the held-out family stay out."""
    extra = Dataset([Sample(s.info, s.backend, s.hw, s.latency, s.family, "synthetic" if s.source == "dcgan" else s.source,
                            s.key, s.hardware, s.pattern) for s in tiny_ds])
    n_dcgan = sum(s.source == "dcgan" for s in tiny_ds)
    plain = leave_one_family_out(StubModel, tiny_ds, models=TINY_MODELS)
    res = leave_one_family_out(StubModel, tiny_ds, models=TINY_MODELS, extra_train=extra)
    assert {f: m["n"] for f, m in res.items()} == {f: m["n"] for f, m in plain.items()}  # the same test rows
    # the dcgan fold gains every extra row (none of them is dcgan); the resnet50 fold all but extra's resnet50 ones
    assert res["dcgan"]["n_train"] == plain["dcgan"]["n_train"] + len(extra)
    assert res["resnet50"]["n_train"] == plain["resnet50"]["n_train"] + n_dcgan


def test_few_shot_same_test_set_for_every_n(tiny_ds, stub_kind):
    source = StubModel().fit(tiny_ds)
    # the "other hardware": one thread, and everything 3x slower than the model expects
    target = Dataset([Sample(s.info, s.backend, s.hw, s.latency * 3.0, s.family, s.source, s.key, "t1", s.pattern)
                      for s in tiny_ds])
    res = few_shot(source, target, ns=(10, 50), seed=1, models=TINY_MODELS)
    assert sorted(res) == [0, 10, 50]
    assert len({res[n]["n"] for n in res}) == 1  # the same held-out rest
    assert res[0]["n"] <= len(target) - 50
    assert res[0]["n_update"] == 0 and res[10]["n_update"] == 10 and res[50]["update"] == {"mode": "bias", "n": 50}
    assert res[10]["mape"] < res[0]["mape"] / 2  # the bias shift fixes the 3x
    assert source.meta["updates"] == 0  # copies were updated, not the source model
    # a factory works too
    res2 = few_shot(lambda: StubModel().fit(tiny_ds), target, ns=(50, 10), seed=1, models=TINY_MODELS)
    assert res2[10]["mape"] == pytest.approx(res[10]["mape"])


# ----------------------------------------------------------------------------- CLI
def _build_db(path: Path, models=(("dcgan", "dcgan"), ("resnet50-tiny", "resnet50")), fp=FP, threads=2) -> int:
    n = 0
    with Database(path, create=True) as db:
        db.register_hardware(fp, {"physical_cores": 2, "logical_cores": 2, "threads": threads, "gpus": []})
        ms = []
        for model, family in models:
            for c in _candidates(model):
                sg = c.subgraph
                db.add_subgraph(sg.hash, sg.skeleton_onnx())
                lat = _latency(sg, c.backend.name, threads)
                ms.append(Measurement(CandidateKey(sg.hash, c.backend.name, "1.0"), fp, True, samples=[lat] * 3,
                                      median=lat, spread=0.0, threads=threads, family=family,
                                      extra={"pattern": c.pattern, "nodes": len(sg)}))
        n = db.commit_many(ms)
    return n


@pytest.fixture(scope="module")
def tiny_db(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("db") / "m.db"
    assert _build_db(p) > 100
    return p


@pytest.fixture(scope="module")
def artifact(tiny_db, tmp_path_factory) -> tuple[Path, dict]:
    """An xgb model trained on the tiny DB with dcgan held out."""
    out = tmp_path_factory.mktemp("art") / "xgb"
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(out), "--holdout-family", "dcgan",
                   "--param", "n_estimators=20", "--param", "n_members=2", "--param", "n_jobs=1", "--json"])
    assert rc == 0
    return out, json.loads(buf.getvalue())


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert err.startswith("collage-ml: error:") and "\n" not in err, err
    for n in needles:
        assert n in err, err
    return err


def test_cli_train_json_with_holdout(artifact):
    out, summary = artifact
    assert (out / "meta.json").exists()
    assert summary["kind"] == "xgb" and summary["sources"] == ["resnet50"]
    assert summary["n"] > 100 and summary["params"]["n_estimators"] == 20
    h = summary["holdout"]["dcgan"]
    assert h["n"] > 50 and h["n_groups"] > 0 and h["n_backend_groups"] > 0
    for k in METRICS:
        assert k in h
    meta = json.loads((out / "meta.json").read_text())
    assert meta["trained_on"]["sources"] == ["resnet50"]


def test_cli_train_text(tiny_db, tmp_path, capsys):
    rc = main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "a"), "--holdout-family", "dcgan",
               "--holdout-family", "resnet50", "--param", "n_estimators=5", "--param", "n_members=1", "--param", "n_jobs=1"])
    # everything held out: nothing to train on
    assert rc == 1
    _one_line_error(capsys, "nothing left to train on")
    rc = main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "a"), "--holdout-family", "dcgan",
               "--param", "n_estimators=5", "--param", "n_members=1", "--param", "n_jobs=1", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "trained xgb on" in out and "held out: dcgan" in out and "pairwise" in out and "saved" in out


def test_cli_trains_and_scores_a_blend(tiny_db, tmp_path, capsys):
    pytest.importorskip("torch_geometric")
    members = {"xgb": {"n_estimators": 20, "n_members": 2}, "gnn": {"hidden": 16, "layers": 2, "epochs": 3}}
    out = tmp_path / "blend"
    rc = main(["train", "--db", str(tiny_db), "--model", "blend", "-o", str(out), "--holdout-family", "dcgan",
               "--param", "member_params=" + json.dumps(members), "--no-progress", "--json"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == "blend" and summary["params"]["members"] == ["xgb", "gnn"]
    assert sorted(p.name for p in out.iterdir()) == ["member-0-xgb", "member-1-gnn", "meta.json"]
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(out), "--holdout-family", "dcgan", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["n"] == summary["holdout"]["dcgan"]["n"] and 0.5 < r["backend_pairwise_accuracy"] <= 1.0


def test_cli_eval_held_out_json(artifact, tiny_db, capsys):
    out, _ = artifact
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(out), "--holdout-family", "dcgan", "--json"]) == 0
    cap = capsys.readouterr()
    assert "warning" not in cap.err
    r = json.loads(cap.out)
    for k in ("pairwise_accuracy", "kendall_tau", "mape", "within_10pct", "top1_regret",
              "backend_pairwise_accuracy", "backend_choice_regret", "n"):
        assert k in r
    assert r["families"] == ["dcgan"] and r["overlaps_training"] == []
    assert 0.5 < r["backend_pairwise_accuracy"] <= 1.0 and r["n_groups"] > 0


def test_cli_eval_warns_on_training_sources(artifact, tiny_db, capsys):
    out, _ = artifact
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(out)]) == 0
    cap = capsys.readouterr()
    assert "warning" in cap.err and "resnet50" in cap.err and "not held out" in cap.err
    assert "dcgan" in cap.out and "resnet50" in cap.out and "all" in cap.out  # the table


def test_cli_errors(artifact, tiny_db, tmp_path, capsys):
    out, _ = artifact
    missing = tmp_path / "nope.db"
    assert main(["train", "--db", str(missing), "--model", "xgb", "-o", str(tmp_path / "x")]) == 1
    _one_line_error(capsys, str(missing))
    assert main(["eval", "--db", str(missing), "--artifact", str(out)]) == 1
    _one_line_error(capsys, str(missing))

    assert main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "x"),
                 "--holdout-family", "resnet"]) == 1
    _one_line_error(capsys, "'resnet'", "known families: dcgan, resnet50")
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(out), "--holdout-family", "bertt"]) == 1
    _one_line_error(capsys, "'bertt'", "dcgan, resnet50")

    assert main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "x"),
                 "--hardware", "cpu-elsewhere"]) == 1
    _one_line_error(capsys, "no valid measurements for hardware cpu-elsewhere", FP)

    assert main(["eval", "--db", str(tiny_db), "--artifact", str(tmp_path / "no-artifact")]) == 1
    _one_line_error(capsys, "no cost-model artifact", "no-artifact")

    # schema mismatch and corrupt meta
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    meta = json.loads((bad / "meta.json").read_text())
    meta["schema_version"] = 999
    (bad / "meta.json").write_text(json.dumps(meta))
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(bad)]) == 1
    _one_line_error(capsys, "feature schema 999", "collage-ml train")
    (bad / "meta.json").write_text("{not json")
    assert main(["eval", "--db", str(tiny_db), "--artifact", str(bad)]) == 1
    _one_line_error(capsys, "not readable JSON")

    # --param: malformed is a usage error (argparse), an unknown key is one line, exit 2
    with pytest.raises(SystemExit) as e:
        main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "x"), "--param", "oops"])
    assert e.value.code == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["train", "--db", str(tiny_db), "--model", "xgb", "-o", str(tmp_path / "x"),
                 "--param", "n_trees=3"]) == 2
    _one_line_error(capsys, "bad --param", "n_trees")


# ----------------------------------------------------------------------------- Python API
def test_api_train_and_evaluate(tiny_db, tmp_path):
    import warnings

    import collage_ml

    out = tmp_path / "xgb"
    params = {"n_estimators": 20, "n_members": 2, "n_jobs": 1}
    m = collage_ml.train(tiny_db, "xgb", out, holdout_families=["dcgan"], params=params)
    assert isinstance(m, CostModel) and m.kind == "xgb" and (out / "meta.json").exists()
    t = m.training
    assert t["sources"] == ["resnet50"] and t["holdout_families"] == ["dcgan"] and t["n"] > 100
    assert t["holdout"]["dcgan"]["n"] == t["n_holdout"] > 50
    mean, sd = m.predict([s for s in Dataset.from_db(tiny_db).samples[:5]])
    assert len(mean) == 5 and np.all(mean > 0)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dcgan was held out: no overlap warning
        r = collage_ml.evaluate(tiny_db, out, holdout_families=["dcgan"])
    for k in ("pairwise_accuracy", "kendall_tau", "mape", "within_10pct", "top1_regret",
              "backend_pairwise_accuracy", "backend_choice_regret", "n"):
        assert k in r
    assert r["families"] == ["dcgan"] and r["overlaps_training"] == [] and r["per_family"] == {}
    # the same numbers as `collage-ml eval --json`, and as the held-out metrics of train
    assert r["pairwise_accuracy"] == pytest.approx(t["holdout"]["dcgan"]["pairwise_accuracy"])
    # an in-memory model evaluates too; every family, with the overlap warned about
    with pytest.warns(UserWarning, match="resnet50.*not held out"):
        r2 = collage_ml.evaluate(tiny_db, m)
    assert set(r2["per_family"]) == {"dcgan", "resnet50"} and r2["overlaps_training"] == ["resnet50"]

    # no artifact written without out=; errors are CollageErrors or ValueErrors, as in the CLI
    m2 = collage_ml.train(tiny_db, params={"n_estimators": 5, "n_members": 1, "n_jobs": 1})
    assert m2.training["artifact"] is None and m2.training["holdout_families"] == []
    with pytest.raises(ValueError, match="n_trees"):
        collage_ml.train(tiny_db, params={"n_trees": 3})
    with pytest.raises(collage_ml.CollageError, match="known families: dcgan, resnet50"):
        collage_ml.evaluate(tiny_db, out, holdout_families=["bertt"])
    with pytest.raises(collage_ml.CollageError, match="no measurement database"):
        collage_ml.train(tmp_path / "nope.db")
    with pytest.raises(collage_ml.CollageError, match="in-memory database is not supported"):
        collage_ml.train(":memory:")  # not "make one with collect --db :memory:", which collect refuses


def test_training_on_two_databases_of_one_machine_pools_their_calibrations_when_asked(tiny_db, tmp_path, capsys):
    """Each database is calibrated in its own sitting; by default each keeps its own table, and with
    ``pool_probes`` the machine gets one, the median of the two (here: their mean)."""
    import shutil

    from collage_ml.db import Database
    from collage_ml.featurize.roofline import PROBE_NAMES
    from collage_ml.measure.probes import PROBE_SET_VERSION
    from collage_ml.models.training import load_dataset

    paths = []
    for name, scale in (("a.db", 1.0), ("b.db", 3.0)):
        p = tmp_path / name
        shutil.copy(tiny_db, p)
        with Database(p) as d:
            for fp in d.stats()["hardware"]:
                for i, probe in enumerate(PROBE_NAMES):
                    d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, scale * 1e-4 * (i + 1), "h")
        paths.append(p)
    apart = load_dataset(paths, sittings="each")  # the same candidates twice, one sample per database
    assert sorted({s.hw.probes_of("onnxruntime")[0] for s in apart}) == pytest.approx([1e-4, 3e-4])
    assert apart.pooled == {}
    both = load_dataset(paths, pool=True)
    hws = {s.hw for s in both}
    assert len(hws) == len(both.pooled) == 1 and list(both.pooled.values()) == [2]
    assert hws.pop().probes_of("onnxruntime") == pytest.approx([2e-4 * (i + 1) for i in range(len(PROBE_NAMES))])
    art = tmp_path / "art"
    assert main(["train", "--db", str(paths[0]), "--db", str(paths[1]), "--model", "xgb", "-o", str(art),
                 "--pool-probes", "--param", "n_estimators=5", "--param", "n_members=1", "--param", "n_jobs=1"]) == 0
    assert "one probe table per machine, the median of its databases' calibrations: " in capsys.readouterr().out
    # per node: the rows recorded none, so both databases' rows are one instance of the machine, pooled as above
    by_node = load_dataset(paths, pool="node")
    assert {s.hw for s in by_node} == {s.hw for s in both} and by_node.pooled == both.pooled
    with pytest.raises(SystemExit):
        main(["train", "--db", str(paths[0]), "--db", str(paths[1]), "-o", str(art), "--pool-probes", "vm"])
    assert "invalid choice: 'vm'" in capsys.readouterr().err


def test_each_row_is_read_against_the_calibration_of_its_own_sitting(tiny_db, tmp_path):
    """A database calibrated twice, two hours apart: rows collected near each calibration carry it."""
    import shutil

    from collage_ml.db import Database
    from collage_ml.featurize.roofline import PROBE_NAMES
    from collage_ml.measure.probes import PROBE_SET_VERSION
    from collage_ml.models.dataset import Dataset

    p = tmp_path / "two-sittings.db"
    shutil.copy(tiny_db, p)
    t0 = 1.8e9
    with Database(p) as d:
        fps = list(d.stats()["hardware"])
        for fp in fps:
            for i, probe in enumerate(PROBE_NAMES):
                d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, 1e-4 * (i + 1), "h")
                d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, 3e-4 * (i + 1), "h",
                               sitting=t0 + 7200)
        d._write(lambda c: (c.execute("UPDATE probes SET timestamp = ?", (t0,)),
                            c.execute("UPDATE recalibrations SET timestamp = ?", (t0 + 7230,)),
                            # odd rows in the second sitting, even ones in the first
                            c.execute("UPDATE measurements SET timestamp = ? + (id % 2) * 7300 + 60", (t0,))), "test")
        late = {m.key for m in d.measurements() if m.timestamp > t0 + 3600}
    ds = Dataset.from_db(p)
    assert late and len(late) < len(ds)
    for s in ds:
        assert s.hw.probes_of("onnxruntime")[0] == pytest.approx(3e-4 if s.key in late else 1e-4)


def test_rows_of_two_machines_of_one_kind_read_their_own_machines_calibration(tiny_db, tmp_path):
    """Two VMs of one kind (one fingerprint) collect at the same time (``collect --ray``), each calibrated;
    each row reads its own node's calibration, not the median of both."""
    import shutil

    from collage_ml.db import Database
    from collage_ml.featurize.roofline import PROBE_NAMES
    from collage_ml.measure.probes import PROBE_SET_VERSION
    from collage_ml.models.dataset import Dataset

    p = tmp_path / "two-nodes.db"
    shutil.copy(tiny_db, p)
    t0 = 1.8e9
    with Database(p) as d:
        for fp in d.stats()["hardware"]:
            for i, probe in enumerate(PROBE_NAMES):
                d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, 1e-4 * (i + 1), "h",
                               node="boot:a")
                d.commit_probe(fp, "onnxruntime", "1", "m5", PROBE_SET_VERSION, probe, 3e-4 * (i + 1), "h",
                               sitting=t0 + 5, node="boot:b")
        d._write(lambda c: (c.execute("UPDATE probes SET timestamp = ?", (t0,)),
                            c.execute("UPDATE recalibrations SET timestamp = ?", (t0 + 10,)),
                            c.execute("UPDATE probe_nodes SET timestamp = ? + (node = 'boot:b') * 10", (t0,)),
                            c.execute("UPDATE measurements SET timestamp = ? + 60, extra = json_set(extra, '$.node', "
                                      "CASE id % 2 WHEN 1 THEN 'boot:b' ELSE 'boot:a' END)", (t0,))), "test")
        on_b = {m.key for m in d.measurements() if m.extra["node"] == "boot:b"}
    ds = Dataset.from_db(p)
    assert on_b and len(on_b) < len(ds)
    for s in ds:
        assert s.hw.probes_of("onnxruntime")[0] == pytest.approx(3e-4 if s.key in on_b else 1e-4)
    assert {s.node for s in ds if s.key in on_b} == {"boot:b"} and {s.node for s in ds if s.key not in on_b} == {"boot:a"}
    with Database(p) as d:  # rows that name no node (collected before nodes were recorded): both, as one sitting
        d._write(lambda c: c.execute("UPDATE measurements SET extra = json_remove(extra, '$.node')"), "test")
    assert [s.hw.probes_of("onnxruntime")[0] for s in Dataset.from_db(p)] == pytest.approx([2e-4] * len(ds))
    assert {s.node for s in Dataset.from_db(p)} == {""}


def test_the_calibration_of_a_row_is_the_nearest_in_time_of_its_protocol_per_backend():
    from collage_ml.db.probes import Calibration
    from collage_ml.models.dataset import calibration_at

    h = 3600.0

    def cal(backend: str, t: float, protocol: str = "m5", value: float | None = None) -> Calibration:
        return Calibration(backend, "1", protocol, t, {"p": t if value is None else value, "q": None}, None)

    cals = [cal("ort", 0.0), cal("ort", 2 * h), cal("ort", 1.2 * h, "m3"), cal("tvm", 0.0, "m3")]
    assert [(c.backend, c.time) for c in calibration_at(cals, "m5", 0.9 * h)] == [("ort", 0.0), ("tvm", 0.0)]
    assert [(c.backend, c.time) for c in calibration_at(cals, "m5", 1.1 * h)] == [("ort", 2 * h), ("tvm", 0.0)]
    # another protocol's calibration only where the backend has none of the row's own
    assert [(c.backend, c.time) for c in calibration_at(cals, "m3", 0.0)] == [("ort", 1.2 * h), ("tvm", 0.0)]
    assert calibration_at([], "m5", 0.0) == []
    # three calibrations minutes apart read as their per-probe median, under the nearest one's time; a fourth
    # an hour later, and another protocol's, stay out
    sitting = [cal("ort", 0.0, value=1.0), cal("ort", 600.0, value=3.0), cal("ort", 1200.0, value=5.0),
               cal("ort", h + 1300.0, value=9.0), cal("ort", 300.0, "m3", value=9.0)]
    (got,) = calibration_at(sitting, "m5", 1000.0)
    assert got.time == 1200.0 and got.values == {"p": 3.0, "q": None}
    (alone,) = calibration_at(sitting, "m5", 1000.0, window=60.0)  # a narrower window: the nearest alone
    assert alone.values == {"p": 5.0, "q": None}
    # with nodes: the row's own machine's calibrations only, even where another's lie nearer; a node with no
    # calibration of the backend reads them all
    nodes = [sitting[0]._replace(node="a"), sitting[1]._replace(node="b"), sitting[2]._replace(node="b")]
    (own,) = calibration_at(nodes, "m5", 1000.0, node="a")
    assert own.time == 0.0 and own.values == {"p": 1.0, "q": None}
    (of_b,) = calibration_at(nodes, "m5", 1000.0, node="b")
    assert of_b.time == 1200.0 and of_b.values == {"p": 4.0, "q": None}
    assert calibration_at(nodes, "m5", 1000.0, node="c")[0].values == {"p": 3.0, "q": None}
