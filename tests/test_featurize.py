"""Featurizers: stored ONNX gives the live numbers, flat row layout, op histograms, graph data, schema checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from collage_ml.backends import get_backend
from collage_ml.candidates import enumerate_candidates
from collage_ml.featurize import flat as flat_mod
from collage_ml.featurize import info as info_mod
from collage_ml.featurize.flat import FEATURES, N_FEATURES, SUBGRAPH_FEATURES, flat_matrix, flat_row
from collage_ml.featurize.graph import GLOBAL_FEATURES, HW_VECTOR, NODE_FEATURES, EncodedSamples, graph_data
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import compute_info, info_from_onnx, subgraph_info
from collage_ml.featurize.schema import BACKENDS, OPS, SCHEMA_VERSION, SchemaError, check_schema
from collage_ml.ir.importers import import_model

from .fake_hardware import fake_probes

from .helpers import chain_model, ort_optimized_ops, residual_layernorm_model

HW = HardwareDesc(cores=4, threads=2, gpu=False)
COL = {f: i for i, f in enumerate(FEATURES)}


@pytest.fixture(scope="module")
def tiny_subgraphs():
    g = import_model("resnet50-tiny")
    bs = [get_backend(n) for n in ("onnxruntime", "openvino", "torch")]
    sgs = {}
    for c in enumerate_candidates(g, bs, 3):
        sgs.setdefault(c.subgraph.hash, c.subgraph)
    return list(sgs.values())


def _edge_set(e: np.ndarray) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in e.T}


def test_stored_onnx_gives_the_live_info(tiny_subgraphs):
    assert len(tiny_subgraphs) > 30
    sizes = set()
    for sg in tiny_subgraphs:
        live = compute_info(sg)
        stored = info_from_onnx(sg.skeleton_onnx())
        sizes.add(len(sg))
        assert stored.hash == live.hash == sg.hash
        np.testing.assert_array_equal(stored.ops, live.ops)
        np.testing.assert_array_equal(stored.node_values, live.node_values)
        np.testing.assert_array_equal(stored.is_input_fed, live.is_input_fed)
        np.testing.assert_array_equal(stored.is_output, live.is_output)
        # the same edges; their order follows set iteration over predecessors and may differ
        assert _edge_set(stored.edges) == _edge_set(live.edges)
        assert (stored.depth, stored.in_bytes, stored.out_bytes) == (live.depth, live.in_bytes, live.out_bytes)
        # hence the same flat row
        np.testing.assert_array_equal(flat_mod._compute(stored), flat_mod._compute(live))
    assert {1, 2, 3} <= sizes and max(sizes) > 3  # ops, regions, and the whole-model region


def test_stored_info_takes_the_db_key_as_hash(tiny_subgraphs):
    sg = tiny_subgraphs[0]
    assert info_from_onnx(sg.skeleton_onnx(), "db-key").hash == "db-key"


def test_flat_row_backend_slots():
    g = import_model(chain_model())
    info = subgraph_info(g.whole())
    b0 = len(SUBGRAPH_FEATURES)
    onehots = {}
    for name in ("onnxruntime", "openvino", "tvm-cuda", "onnxruntime[spin=on]", "my-new-backend"):
        row = flat_row(info, name, HW)
        assert row.shape == (N_FEATURES,) and row.dtype == np.float32
        hot = np.flatnonzero(row[b0 : b0 + len(BACKENDS) + 1])
        assert len(hot) == 1
        onehots[name] = FEATURES[b0 + hot[0]]
    assert onehots == {
        "onnxruntime": "backend:onnxruntime",
        "openvino": "backend:openvino",
        "tvm-cuda": "backend:tvm-cuda",
        "onnxruntime[spin=on]": "backend:onnxruntime",
        "my-new-backend": "backend:other",
    }
    row = flat_row(info, "torch", HW)
    assert (row[COL["hw_cores"]], row[COL["hw_threads"]], row[COL["hw_gpu"]]) == (4, 2, 0)
    assert row[COL["log_flops_per_thread"]] == pytest.approx(row[COL["log_flops"]] - np.log(2), abs=1e-5)
    # the subgraph part does not depend on the backend
    np.testing.assert_array_equal(flat_row(info, "torch", HW)[:b0], flat_row(info, "openvino", HW)[:b0])


def test_flat_matrix_equals_rows(tiny_subgraphs):
    items = [(subgraph_info(sg), b, HardwareDesc(2, t, False)) for sg in tiny_subgraphs[:20]
             for b, t in (("onnxruntime", 1), ("torch", 2), ("xyz", 2))]
    m = flat_matrix(items)
    assert m.shape == (len(items), N_FEATURES) and m.dtype == np.float32
    for i, it in enumerate(items):
        np.testing.assert_array_equal(m[i], flat_row(*it))


def test_op_histogram_counts():
    g = import_model(chain_model())  # MatMul, Relu, Add, Sigmoid, Tanh, Mul
    row = flat_row(subgraph_info(g.whole()), "onnxruntime", HW)
    for op in ("MatMul", "Relu", "Add", "Sigmoid", "Tanh", "Mul"):
        assert row[COL[f"op:{op}"]] == 1
    assert row[: len(OPS) + 1].sum() == 6 and row[COL["op:other"]] == 0
    assert row[COL["n_nodes"]] == 6 and row[COL["n_edges"]] == 6  # mm>r>a, a>s, a>t, s>y, t>y

    # ops outside the vocabulary land in "other"; repeated ops count
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    nodes = [
        helper.make_node("Sin", ["x"], ["a"], name="n0"),
        helper.make_node("Relu", ["a"], ["b"], name="n1"),
        helper.make_node("Cos", ["b"], ["c"], name="n2"),
        helper.make_node("Relu", ["c"], ["y"], name="n3"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    row = flat_row(subgraph_info(import_model(m).whole()), "onnxruntime", HW)
    assert row[COL["op:other"]] == 2 and row[COL["op:Relu"]] == 2
    assert row[COL["depth"]] == 4 and row[COL["n_inputs"]] == 1 and row[COL["n_outputs"]] == 1


def test_graph_data_matches_the_subgraph(tiny_subgraphs):
    torch = pytest.importorskip("torch")
    big = max(tiny_subgraphs, key=len)
    for sg in (big, *tiny_subgraphs[:10]):
        info = subgraph_info(sg)
        d = graph_data(info, "openvino", HW, y=-7.5)
        n = len(sg)
        assert tuple(d.x.shape) == (n, NODE_FEATURES) and d.x.dtype == torch.float32
        assert tuple(d.u.shape) == (1, GLOBAL_FEATURES) and tuple(d.hw.shape) == (1, HW_VECTOR)
        assert d.backend.tolist() == [BACKENDS.index("openvino")]
        assert d.y.tolist() == [-7.5]
        assert d.edge_index.dtype == torch.long and d.edge_index.shape[0] == 2
        # edges: exactly the internal producer -> consumer pairs, in local (topological) indices, both ways
        local = {gi: li for li, gi in enumerate(sg.node_indices)}
        expected = {(local[p], local[c]) for c in sg.node_indices for p in sg.graph.preds[c] if p in local}
        assert _edge_set(d.edge_index.numpy()) == expected | {(b, a) for a, b in expected}
        assert d.edge_index.shape[1] == 2 * len(expected)
        assert all(a < b for a, b in expected)
        # op one-hot: one per node, at the node's op slot
        np.testing.assert_array_equal(d.x[:, : len(OPS) + 1].sum(1).numpy(), np.ones(n))
        ops = [OPS.index(nd.op_type) if nd.op_type in OPS else len(OPS) for nd in sg.nodes]
        assert d.x[:, : len(OPS) + 1].argmax(1).tolist() == ops
        # boundary flags
        assert d.x[:, -2].sum() >= 1 and d.x[:, -1].sum() >= 1
    assert graph_data(subgraph_info(big), "onnxruntime", HW).y is None


def test_the_gnn_batches_read_the_same_features_as_graph_data(tiny_subgraphs):
    """One graph featurizer: the GNN's mini-batches hold exactly graph_data's tensors."""
    torch = pytest.importorskip("torch")
    from collage_ml.models.dataset import Sample

    hw = HW.with_probes({"openvino": fake_probes()})
    samples = [Sample(subgraph_info(sg), b, hw, 1e-4) for sg in tiny_subgraphs[:6] for b in ("openvino", "torch")]
    b = EncodedSamples(samples).batch(torch.arange(len(samples)), per_sample=True)
    ptr = 0
    for i, s in enumerate(samples):
        d = graph_data(s.info, s.backend, s.hw)
        n = d.x.shape[0]
        torch.testing.assert_close(b["x"][ptr : ptr + n], d.x)
        torch.testing.assert_close(b["u"][i : i + 1], d.u)
        torch.testing.assert_close(b["hw"][i : i + 1], d.hw, equal_nan=True)
        assert int(b["backend"][i]) == int(d.backend)
        ptr += n
    # the probe columns are there for the calibrated backend, missing (NaN) for the other
    assert torch.isfinite(b["hw"][0]).all() and torch.isnan(b["hw"][1]).any()


def test_caches_can_be_cleared(tiny_subgraphs):
    sg = tiny_subgraphs[0]
    a = flat_row(subgraph_info(sg), "onnxruntime", HW)
    info_mod._CACHE.clear()
    flat_mod._CACHE.clear()
    np.testing.assert_array_equal(flat_row(subgraph_info(sg), "onnxruntime", HW), a)


def test_schema_mismatch_message(tmp_path):
    check_schema(SCHEMA_VERSION, "x")  # fine
    with pytest.raises(SchemaError) as e:
        check_schema(SCHEMA_VERSION + 1, "cost model here")
    msg = str(e.value)
    assert "cost model here" in msg and f"schema {SCHEMA_VERSION + 1}" in msg and "collage-ml train" in msg
    assert "\n" not in msg

    from collage_ml.models.base import ARTIFACT_FORMAT, load_model

    (tmp_path / "meta.json").write_text(
        json.dumps({"format": ARTIFACT_FORMAT, "format_version": 1, "kind": "xgb", "schema_version": 0})
    )
    with pytest.raises(SchemaError, match="feature schema 0"):
        load_model(tmp_path)


@pytest.mark.parametrize("variant", ["residual", "bias-first", "bias-last", "sum-out"])
def test_residual_add_ln_counts_what_onnxruntime_fuses(variant, tmp_path):
    """The feature counts the pairs that onnxruntime 1.32 turns into SkipLayerNormalization (its optimised
    graph is the oracle), from the live subgraph and from the stored skeleton alike."""
    model = residual_layernorm_model(variant)
    fused = ort_optimized_ops(model, tmp_path).count("SkipLayerNormalization")
    assert fused == (1 if variant in ("residual", "bias-first") else 0)
    sg = import_model(model).whole()
    for info in (compute_info(sg), info_from_onnx(sg.skeleton_onnx())):
        n, nbytes = flat_mod.residual_add_ln(info)
        assert n == fused, variant
        assert nbytes == (2 * 8 * 64 * 4 if fused else 0.0)
    row = flat_row(compute_info(sg), "onnxruntime", HW)
    assert row[COL["n_residual_add_ln"]] == fused


def test_residual_add_ln_counts_every_pair_of_bert():
    info = subgraph_info(import_model("bert").whole())
    assert flat_mod.residual_add_ln(info)[0] == 16  # 8 layers, two residual Add + LayerNorm each


def test_a_configured_backend_reads_the_graph_it_runs():
    """``onnxruntime[skipln=off]`` fuses no Add + LayerNorm pair: its rows count none, in the flat row and the
    GNN's global row alike; other configurations and other backends see the pairs."""
    from collage_ml.featurize.graph import EncodedSamples, global_vector

    info = compute_info(import_model(residual_layernorm_model("residual")).whole())
    n = COL["n_residual_add_ln"]
    got = {b: flat_row(info, b, HW)[n] for b in ("onnxruntime", "openvino", "onnxruntime[spin=on]",
                                                 "onnxruntime[skipln=off]", "onnxruntime[skipln=false, spin=on]")}
    assert got == {"onnxruntime": 1, "openvino": 1, "onnxruntime[spin=on]": 1, "onnxruntime[skipln=off]": 0,
                   "onnxruntime[skipln=false, spin=on]": 0}
    assert flat_row(info, "onnxruntime[skipln=off]", HW)[COL["log_residual_add_ln_bytes"]] == 0
    # everything else in the row is the plain backend's
    a, b = flat_row(info, "onnxruntime", HW), flat_row(info, "onnxruntime[skipln=off]", HW)
    assert np.flatnonzero(~((a == b) | np.isnan(a) & np.isnan(b))).tolist() == [n, COL["log_residual_add_ln_bytes"]]

    class S:
        def __init__(self, backend):
            self.info, self.backend, self.hw, self.log_latency = info, backend, HW, 0.0

    enc = EncodedSamples([S("onnxruntime"), S("openvino"), S("onnxruntime[skipln=off]")])
    gid = enc.gid.tolist()
    assert gid[0] == gid[1] != gid[2]  # one graph row per subgraph, one more for the configuration
    u = enc.graphs.tensors()[-1]
    assert u[gid[0], n] > 0 and u[gid[2], n] == 0
    np.testing.assert_array_equal(u[gid[2]].numpy(), global_vector(info, "onnxruntime[skipln=off]"))


@pytest.mark.parametrize("name", ["onnxruntime", "onnxruntime[opt=extended]", "onnxruntime[opt=basic]",
                                  "onnxruntime[opt=none]", "onnxruntime[skipln=off]",
                                  "onnxruntime[opt=basic,skipln=off]", "onnxruntime[spin=on]"])
def test_configured_fused_pairs_match_what_onnxruntime_runs(name, tmp_path):
    """For each ORT configuration, the row's fused-pair count is the number of SkipLayerNormalization nodes
    in the graph ORT optimises under that configuration (ORT is the oracle)."""
    b = get_backend(name)
    model = residual_layernorm_model("residual")
    fused = ort_optimized_ops(model, tmp_path, b.opt_level, b.skipln).count("SkipLayerNormalization")
    info = compute_info(import_model(model).whole())
    assert flat_row(info, b.name, HW)[COL["n_residual_add_ln"]] == fused
