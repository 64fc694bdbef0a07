"""The hardware embedding: probes describe a machine, reach the features, and let a model rank a machine it never saw."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collage_ml.backends import get_backend
from collage_ml.candidates import enumerate_candidates
from collage_ml.featurize import roofline
from collage_ml.featurize.flat import FEATURES, flat_matrix, machine_log_estimates
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import subgraph_info
from collage_ml.ir.importers import import_model
from collage_ml.featurize.roofline import PROBE_NAMES
from collage_ml.models.dataset import Dataset, Sample
from collage_ml.models.xgb import XGBCostModel

from .fake_hardware import BASE_RATES, fake_probes

BASE = HardwareDesc(cores=2, threads=2, gpu=False, isa=("avx2",))


@pytest.mark.parametrize("fit, tol", [("two-point", 1e-6), ("joint", 5e-3)])
def test_rates_recover_a_synthetic_machine(fit, tol):
    r = roofline.rates(tuple(fake_probes(overhead=2e-5, scale=3.0)[n] for n in PROBE_NAMES), fit)
    assert r is not None
    assert r.overhead == pytest.approx(2e-5, rel=tol)
    for cls, rate in BASE_RATES.items():
        assert getattr(r, cls) == pytest.approx(3.0 * rate, rel=tol)
    # too few probes: no rates, and the probe columns are missing rather than made up
    assert roofline.rates(tuple([None] * len(PROBE_NAMES)), fit) is None
    with pytest.raises(ValueError, match="unknown roofline fit 'three-point'"):
        roofline.rates(tuple(fake_probes()[n] for n in PROBE_NAMES), "three-point")


def test_the_joint_fit_keeps_one_kernels_noise_out_of_the_overhead():
    """Noise on one kernel's batch-1 probe moves the two-point fit's overhead through a difference of two
    latencies; the joint fit rests every number on all the probes and moves less (issue #16's noted
    amplification). 5% noise per probe, 200 draws."""
    clean = fake_probes(overhead=2e-5)
    rng = np.random.default_rng(0)
    spread = {}
    for fit in ("two-point", "joint"):
        o = [roofline.rates(tuple(clean[n] * math.exp(rng.normal(0, 0.05)) for n in PROBE_NAMES), fit).overhead
             for _ in range(200)]
        spread[fit] = float(np.std(np.log(o)))
    assert spread["joint"] < spread["two-point"], spread


def test_descriptor_round_trips_and_picks_the_backend_probes():
    hw = BASE.with_probes({"onnxruntime": fake_probes(), "openvino": fake_probes(scale=2.0)})
    assert HardwareDesc.from_json(hw.to_json()) == hw and hash(HardwareDesc.from_json(hw.to_json())) == hash(hw)
    assert hw.probes_of("onnxruntime[spin=on]") == hw.probes_of("onnxruntime")  # a configuration: its base's
    assert hw.probes_of("torch") is None
    with pytest.raises(ValueError, match="hardware descriptor"):
        HardwareDesc.from_json({"cores": 2})
    info = subgraph_info(next(iter(enumerate_candidates(import_model("resnet50-tiny"), [get_backend("onnxruntime")], 1))).subgraph)
    rows = flat_matrix([(info, "onnxruntime", hw), (info, "openvino", hw), (info, "torch", hw)])
    est = FEATURES.index("roof_log_est")
    # twice the speed: a lower estimate; no probes: missing (NaN), not zero
    assert rows[1, est] < rows[0, est] and math.isnan(rows[2, est])
    assert rows[0, FEATURES.index("hw_isa_avx2")] == 1 and rows[0, FEATURES.index("hw_isa_avx512f")] == 0


def _synthetic_latency(info, backend: str, speed: float) -> float:
    """A fake backend pair: "onnxruntime"'s compute runs ``speed`` times faster on the machine, "openvino"'s
    does not. Not the roofline formula the features use (other weights, a per-node cost)."""
    v = info.node_values
    flops, moved = float(v[:, 0].sum()), float(v[:, 1].sum() + v[:, 2].sum())
    rate = 3e7 * speed if backend == "onnxruntime" else 4.5e7
    return 8e-6 + 1.5e-6 * info.n_nodes + flops / rate + 1.3 * moved / 2e8


def _machine(speed: float) -> HardwareDesc:
    """The probe results of the machine with that ``speed`` (what calibrate would measure there)."""

    def backend(compute: float) -> dict[str, float]:
        return fake_probes(overhead=8e-6, rates={"conv": compute, "dw": compute, "mm": compute, "mem": 2e8 / 1.3})

    return BASE.with_probes({"onnxruntime": backend(3e7 * speed), "openvino": backend(4.5e7)})


def _compute_bound_infos() -> list:
    infos = {}
    for name in ("resnet50-tiny", "mobilenetv2-tiny", "bert-tiny"):
        for c in enumerate_candidates(import_model(name), [get_backend("onnxruntime")], 2):
            infos.setdefault(c.subgraph.hash, subgraph_info(c.subgraph))

    def intensity(i) -> float:
        v = i.node_values
        return float(v[:, 0].sum()) / max(float(v[:, 1].sum() + v[:, 2].sum()), 1.0)

    out = [i for i in infos.values() if intensity(i) > 1.0]
    assert len(out) >= 40
    return out


def test_probes_rank_a_machine_the_model_never_saw():
    """On a held-out machine where the slower-on-average backend wins, only the model with probes ranks it right.

    The held-out machine lies between two training machines on the same side of the crossover (speed 1.5). One
    inside the gap between 1.0 and 3.0 has no answer a tree can know: XGBoost puts an unseen value in the bin of
    the training value above it, so which neighbour it joins depends on the sign of the column a tree splits on
    (with schema 3's relative columns, a machine at 1.2 joined the 3.0 side)."""
    infos = _compute_bound_infos()

    def data(speed: float, probes: bool) -> Dataset:
        hw = _machine(speed) if probes else BASE
        return Dataset([Sample(i, b, hw, _synthetic_latency(i, b, speed), "f", "f", hardware=f"m{speed}")
                        for i in infos for b in ("onnxruntime", "openvino")])

    train_speeds, held_out = (0.8, 1.0, 3.0, 4.0), 0.9  # at 0.9 "openvino" is faster (rate 4.5e7 > 2.7e7)
    truth = data(held_out, True)
    onnx_faster = [truth[2 * k].latency < truth[2 * k + 1].latency for k in range(len(infos))]
    assert not any(onnx_faster)
    for probes, want in ((True, 1.0), (False, 0.0)):
        train = Dataset([s for sp in train_speeds for s in data(sp, probes)])
        m = XGBCostModel(n_members=1, n_estimators=200, seed=0).fit(train)
        pred, _ = m.predict(list(data(held_out, probes)))
        right = np.mean([(pred[2 * k] < pred[2 * k + 1]) == onnx_faster[k] for k in range(len(infos))])
        if probes:
            assert right >= 0.9, right
        else:  # the machines look the same without probes: the average over training machines wins
            assert right <= 0.1, right


def _errors_beyond_training(data, targets) -> dict[str, float]:
    """Per target: trained on ``data`` at speeds 2, 3 and 4, the median log(measured / predicted) of the rows at
    speed 0.25 that are slower than every training row (> 0: predicted too fast)."""
    train = Dataset([s for sp in (2.0, 3.0, 4.0) for s in data(sp)])
    top = max(s.latency for s in train)
    held = [s for s in data(0.25) if s.latency > top]
    assert len(held) >= 3, len(held)
    truth = np.log([s.latency for s in held])
    err = {}
    for target in targets:
        m = XGBCostModel(n_members=1, n_estimators=200, seed=0, target=target).fit(train)
        err[target] = float(np.median(truth - np.log(m.predict(held)[0])))
    return err


def test_the_roofline_target_carries_the_scale_to_a_machine_slower_than_any_in_training():
    """Trees do not extrapolate: trained on machines 8-16x as fast, a ``log`` model predicts the slowest subgraphs
    of a machine at 0.25x as if they took no longer than the slowest rows it was trained on (too fast). The
    ``roofline`` target scales the prediction with the held-out machine's probes and lands close.
    Scored on the held-out rows whose latency lies beyond every training row's."""
    infos = _compute_bound_infos()

    def data(speed: float) -> Dataset:
        return Dataset([Sample(i, "onnxruntime", _machine(speed), _synthetic_latency(i, "onnxruntime", speed), "f",
                               "f", hardware=f"m{speed}") for i in infos])

    err = _errors_beyond_training(data, ("log", "roofline"))
    assert err["log"] > 0.3, err  # capped near the slowest training row: too fast
    assert abs(err["roofline"]) < 0.2, err


def test_the_machine_estimate_is_one_scale_for_every_backend_of_a_candidate():
    """``roofline-mean``'s margin: the mean of the probed backends' log estimates, the same whichever backend
    runs the candidate; configured variants are left out where their plain backend is probed; NaN without
    probes."""
    info = subgraph_info(next(iter(enumerate_candidates(import_model("resnet50-tiny"), [get_backend("onnxruntime")], 1))).subgraph)
    hw = BASE.with_probes({"onnxruntime": fake_probes(), "openvino": fake_probes(scale=2.0),
                           "onnxruntime[spin=on]": fake_probes(scale=8.0)})
    est = FEATURES.index("roof_log_est")
    rows = flat_matrix([(info, "onnxruntime", hw), (info, "openvino", hw)])
    got = machine_log_estimates([(info, hw), (info, hw), (info, BASE)])
    assert got[0] == got[1] == pytest.approx((rows[0, est] + rows[1, est]) / 2, abs=1e-5)
    assert rows[1, est] < got[0] < rows[0, est]  # between the two backends' own estimates
    assert math.isnan(got[2])
    only_variant = BASE.with_probes({"onnxruntime[spin=on]": fake_probes(scale=8.0)})
    assert math.isfinite(machine_log_estimates([(info, only_variant)])[0])


def test_relative_columns_say_which_backend_the_machine_favours_whatever_its_speed():
    """Each backend against the machine's mean: the same on a machine uniformly 3x slower (where the absolute
    probe columns all move), opposite in sign for two backends, NaN without probes."""
    info = subgraph_info(next(iter(enumerate_candidates(import_model("resnet50-tiny"), [get_backend("onnxruntime")], 1))).subgraph)
    rel = [FEATURES.index(n) for n in roofline.RELATIVE_NAMES]
    absolute = [FEATURES.index(n) for n in ("roof_log_est", "hw_log_rate_conv", f"probe:{PROBE_NAMES[0]}")]

    def machine(scale: float) -> HardwareDesc:
        return BASE.with_probes({"onnxruntime": fake_probes(overhead=1e-5 / scale, scale=scale),
                                 "openvino": fake_probes(overhead=1e-5 / scale, scale=2.0 * scale,
                                                         rates={"mem": BASE_RATES["mem"] / 2})})

    fast, slow = machine(1.0), machine(1 / 3)
    rows = flat_matrix([(info, b, hw) for hw in (fast, slow) for b in ("onnxruntime", "openvino")] + [(info, "torch", fast)])
    np.testing.assert_allclose(rows[0, rel], rows[2, rel], atol=1e-5)  # onnxruntime, fast and slow machine
    np.testing.assert_allclose(rows[0, rel], -rows[1, rel], atol=1e-5)  # two backends: opposite sides of the mean
    assert np.all(np.abs(rows[0, absolute] - rows[2, absolute]) > 0.5)  # the absolute columns do move
    i = FEATURES.index("rel_log_rate_conv")
    assert rows[1, i] == pytest.approx(np.log(2.0) / 2, abs=1e-5)  # openvino's convolutions: twice as fast
    assert rows[1, FEATURES.index("rel_log_rate_mem")] == pytest.approx(0.0, abs=1e-5)  # 2x, then halved
    assert np.all(np.isnan(rows[4, rel]))  # torch was not calibrated


def test_the_mean_target_carries_the_scale_of_a_whole_machine_slower_than_any_in_training():
    """Where a whole machine is slower (every backend's rates scale together, as between the Zen 4 and the Zen 5),
    ``roofline-mean`` carries the held-out machine's scale as ``roofline`` does; ``log`` cannot."""
    infos = _compute_bound_infos()

    def latency(info, backend: str, speed: float) -> float:
        v = info.node_values
        flops, moved = float(v[:, 0].sum()), float(v[:, 1].sum() + v[:, 2].sum())
        rate = (3e7 if backend == "onnxruntime" else 4.5e7) * speed
        return 8e-6 + 1.5e-6 * info.n_nodes + flops / rate + 1.3 * moved / (2e8 * speed)

    def machine(speed: float) -> HardwareDesc:
        def backend(c: float) -> dict[str, float]:
            return fake_probes(overhead=8e-6, rates={"conv": c, "dw": c, "mm": c, "mem": 2e8 * speed / 1.3})

        return BASE.with_probes({"onnxruntime": backend(3e7 * speed), "openvino": backend(4.5e7 * speed)})

    def data(speed: float) -> Dataset:
        hw = machine(speed)
        return Dataset([Sample(i, b, hw, latency(i, b, speed), "f", "f", hardware=f"m{speed}")
                        for i in infos for b in ("onnxruntime", "openvino")])

    err = _errors_beyond_training(data, ("log", "roofline-mean"))
    assert XGBCostModel().params["target"] == "roofline-mean"  # the default
    assert err["log"] > 0.3, err
    assert abs(err["roofline-mean"]) < 0.2, err


def test_an_artifact_from_before_the_hardware_features_is_refused(tmp_path, capsys):
    """Schema 1 (cores, threads and GPU only, the old GNN featurization): refused with one clear line, in the CLI too."""
    import json

    from collage_ml import cli
    from collage_ml.featurize.schema import SCHEMA_VERSION, SchemaError
    from collage_ml.models.base import load_model

    infos = [subgraph_info(c.subgraph) for c in enumerate_candidates(import_model("dcgan-tiny"), [get_backend("onnxruntime")], 1)]
    d = XGBCostModel(n_members=1, n_estimators=5).fit(Dataset([Sample(i, "onnxruntime", BASE, 1e-4) for i in infos]))
    art = d.save(tmp_path / "old")
    meta = json.loads((art / "meta.json").read_text())
    meta["schema_version"] = 1
    meta["hw"] = {"cores": 2, "threads": 2, "gpu": False}  # the schema-1 descriptor
    (art / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match=f"feature schema 1, but this collage-ml uses schema {SCHEMA_VERSION}"):
        load_model(art)
    meta["schema_version"] = 2  # the probe columns without the relative ones (before 2026-12-03)
    (art / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="feature schema 2"):
        load_model(art)
    from pathlib import Path

    db = Path(__file__).resolve().parents[1] / "datasets" / "cpu-2core-zen4-t1" / "measurements.db"
    assert cli.main(["eval", "--db", str(db), "--artifact", str(art)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "feature schema 2" in err[0] and "Traceback" not in err[0], err


@pytest.mark.parametrize("target", ["log", "roofline", "roofline-mean"])
def test_each_target_survives_save_and_load_and_updates(target, tmp_path):
    """The margin is recomputed from the samples after a load, so a loaded artifact predicts exactly as the model
    it was saved from, and a continued update keeps its target."""
    from collage_ml.models import load_model

    infos = _compute_bound_infos()[:40]
    data = Dataset([Sample(i, b, _machine(sp), _synthetic_latency(i, b, sp), "f", "f", hardware=f"m{sp}")
                    for sp in (1.0, 2.0) for i in infos for b in ("onnxruntime", "openvino")])
    m = XGBCostModel(n_members=2, n_estimators=40, seed=0, target=target).fit(data)
    loaded = load_model(m.save(tmp_path / "m"))
    assert loaded.params["target"] == target
    np.testing.assert_array_equal(m.predict_log(data.samples)[0], loaded.predict_log(data.samples)[0])
    assert loaded.update(Dataset(data.samples[:20]))["mode"] == "continue"
    assert np.all(np.isfinite(loaded.predict_log(data.samples)[0]))


def test_an_unknown_target_is_named():
    with pytest.raises(ValueError, match="roofline-mean"):
        XGBCostModel(target="roofline-median")


def _gemm_then_add(a_is_constant: bool):
    """y = Gemm(A, W) + x, with A an initializer (a model's initial state) or a graph input."""
    from onnx import TensorProto, helper, numpy_helper

    from collage_ml.ir.importers import from_onnx

    rng = np.random.default_rng(0)
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [8, 64])  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "W")]
    inputs = [vi("x")]
    if a_is_constant:
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 64)).astype(np.float32), "A"))
    else:
        inputs.append(vi("A"))
    nodes = [helper.make_node("Gemm", ["A", "W"], ["h"]), helper.make_node("Add", ["h", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [vi("y")], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    return from_onnx(model, name=f"gemm-add-{a_is_constant}")


def test_a_node_that_reads_only_constants_costs_no_compute_in_the_estimate():
    """ONNX Runtime and OpenVINO fold a Gemm of constants when they compile it (nasrnn's initial state: 3.5 µs at
    0.5 and 4.2 MFLOP alike); the estimate gives it no FLOPs, and only the output it writes, where a Gemm fed by
    an input keeps its compute. The Add after it reads an input, so it is not constant either way."""
    r = roofline.Rates(overhead=5e-6, conv=1e10, dw=1e9, mm=1e8, mem=1e10)
    const_g, fed_g = _gemm_then_add(True), _gemm_then_add(False)
    const_info, fed_info = subgraph_info(const_g.whole()), subgraph_info(fed_g.whole())
    gemm = roofline.OP_INDEX["Gemm"]
    assert roofline.constant_nodes(const_info).tolist() == (const_info.ops == gemm).tolist()
    assert not roofline.constant_nodes(fed_info).any()
    gemm_seconds = 2 * 8 * 64 * 64 / r.mm  # 82 µs at this rate
    est_const, est_fed = roofline.estimate(const_info, r)[0], roofline.estimate(fed_info, r)[0]
    assert est_fed - est_const == pytest.approx(gemm_seconds, rel=0.05)
    # the constant Gemm alone: the fixed cost and writing its output (an output of this subgraph)
    alone = subgraph_info(const_g.subgraph([int(np.flatnonzero(const_info.ops == gemm)[0])]))
    assert roofline.estimate(alone, r)[0] == pytest.approx(r.overhead + 8 * 64 * 4 / r.mem)


def test_live_candidates_without_hw_warn_once_naming_the_training_machine(recwarn):
    """A Candidate has no machine of its own: predicted without ``hw=``, it gets the machine most training rows
    came from, which the caller is told once; a Sample, an explicit ``hw`` or an assigned ``model.hw`` is silent."""
    cands = list(enumerate_candidates(import_model("dcgan-tiny"), [get_backend("onnxruntime")], 1))[:5]
    infos = [subgraph_info(c.subgraph) for c in cands]
    slow, fast = _machine(0.5), _machine(2.0)
    rows = [Sample(i, "onnxruntime", hw, 1e-4 * k, "f", "f", hardware=fp)
            for k, i in enumerate(infos, 1) for hw, fp in ((slow, "slow"), (slow, "slow"), (fast, "fast"))]
    m = XGBCostModel(n_members=1, n_estimators=5, seed=0).fit(Dataset(rows))
    assert m.hw == slow  # two of every three rows

    m.predict(rows)  # Samples: each carries its machine
    m.predict(cands, hw=fast)
    assert not [w for w in recwarn if "predicting candidates for" in str(w.message)]
    default, _ = m.predict(cands)
    m.predict(cands)
    said = [str(w.message) for w in recwarn if "predicting candidates for" in str(w.message)]
    assert said == [f"xgb cost model: predicting candidates for {slow.describe()}, the machine most of its "
                    "training rows came from; pass hw= for the machine to predict for"]
    assert np.allclose(default, m.predict(cands, hw=slow)[0])

    m2 = XGBCostModel(n_members=1, n_estimators=5, seed=0).fit(Dataset(rows))
    m2.hw = fast  # what collect's focus sampler does: this machine, chosen by the caller
    m2.predict(cands)
    assert len([w for w in recwarn if "predicting candidates for" in str(w.message)]) == 1


def test_pooling_gives_one_machine_the_median_of_its_calibrations_and_leaves_others_alone():
    from collage_ml.models.dataset import pool_probes

    info = _compute_bound_infos()[0]

    def part(fp: str, threads: int, *scales: float, protocol: str = "m5") -> Dataset:
        hw = HardwareDesc(cores=2, threads=threads, gpu=False).with_probes(
            {"onnxruntime": fake_probes(scale=scales[0]), **({"openvino": fake_probes(scale=scales[1])} if len(scales) > 1 else {})})
        return Dataset([Sample(info, "onnxruntime", hw, 1e-3, hardware=fp, protocol=protocol) for _ in range(2)])

    # three sittings of one machine: the third calibration is an outlier (half speed)
    a, b, c = part("m1", 2, 1.0, 2.0), part("m1", 2, 1.1, 2.2), part("m1", 2, 0.5)
    # another machine, another thread count, another protocol (which times kernels its own way)
    other, one_thread, old = part("m2", 2, 3.0), part("m1", 1, 0.7), part("m1", 2, 0.9, protocol="m3")
    before = (other.samples[0].hw, one_thread.samples[0].hw, old.samples[0].hw)
    bc = b + c
    assert pool_probes([a, bc, other, one_thread, old]) == {"m1": 3}
    hws = {s.hw for d in (a, bc) for s in d}
    assert len(hws) == 1
    hw = hws.pop()
    # per probe the median of three; openvino, calibrated twice, the middle of two
    assert hw.probes_of("onnxruntime") == pytest.approx([fake_probes(scale=1.0)[n] for n in PROBE_NAMES])
    assert hw.probes_of("openvino") == pytest.approx(
        [(fake_probes(scale=2.0)[n] + fake_probes(scale=2.2)[n]) / 2 for n in PROBE_NAMES])
    assert (other.samples[0].hw, one_thread.samples[0].hw, old.samples[0].hw) == before
    assert pool_probes([other]) == {}


def test_pooling_by_node_gives_each_instance_of_a_machine_its_own_median():
    """Two VMs of one fingerprint (nodes), each calibrated in several sittings: ``by="node"`` pools each VM's
    sittings apart; by machine, all of them pool into one table."""
    from collage_ml.models.dataset import pool_probes

    info = _compute_bound_infos()[0]

    def part(node: str, scale: float) -> Dataset:
        hw = HardwareDesc(cores=2, threads=2, gpu=False).with_probes({"onnxruntime": fake_probes(scale=scale)})
        return Dataset([Sample(info, "onnxruntime", hw, 1e-3, hardware="m1", protocol="m5", node=node)] * 2)

    def vms():  # VM a: sittings at 1.0, 1.2, 1.4; VM b: 3.0 and 3.4; rows that recorded no node: 0.5
        return [part("boot:a", 1.0), part("boot:a", 1.2), part("boot:a", 1.4), part("boot:b", 3.0),
                part("boot:b", 3.4), part("", 0.5)]

    def first_probe(d: Dataset) -> float:
        (hw,) = {s.hw for s in d}
        return hw.probes_of("onnxruntime")[0]

    def lat(scale: float) -> float:
        return fake_probes(scale=scale)[PROBE_NAMES[0]]

    parts = vms()
    assert pool_probes(parts, by="node") == {"m1": 5}  # the lone unrecorded table has nothing to pool with
    vm_b = (lat(3.0) + lat(3.4)) / 2
    assert [first_probe(d) for d in parts] == pytest.approx([lat(1.2)] * 3 + [vm_b] * 2 + [lat(0.5)])
    assert {s.node for d in parts for s in d} == {"boot:a", "boot:b", ""}  # pooling leaves the node alone
    parts = vms()
    assert pool_probes(parts) == {"m1": 6}
    assert [first_probe(d) for d in parts] == pytest.approx([(lat(1.2) + lat(1.4)) / 2] * 6)  # median of six
    with pytest.raises(ValueError, match="by='vm' is not one of machine, node"):
        pool_probes(vms(), by="vm")

