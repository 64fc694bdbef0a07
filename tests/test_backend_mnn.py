"""The MNN backend (opt-in): the correctness gate across the zoo's op set, what it refuses,
its Winograd configuration, distinct measurement keys, errors and a quiet stdout.

Tolerance: ``collage_ml.measure.timing.compare`` (the fp32 gate: rtol 1e-3, atol 1e-4
scaled by the output's magnitude).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_ml.backends.base import get_backend, to_numpy
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError
from collage_ml.ir.importers import from_onnx, import_model
from collage_ml.measure.timing import compare
from tests.helpers import assert_compiled_matches_reference

_B = get_backend("mnn")
pytestmark = pytest.mark.skipif(not _B.available(), reason=f"mnn unavailable: {_B.unavailable_reason()}")

ZOO_TINY = ["resnet50-tiny", "bert-tiny", "mobilenetv2-tiny", "nasrnn-tiny", "dcgan-tiny", "nasnet-tiny",
            "resnext50-tiny", "resnet3d50-tiny"]


def _graph(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]))


def _conv3x3(channels=64, size=28, seed=0):
    rs = np.random.default_rng(seed)
    w = numpy_helper.from_array((rs.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32), "w")
    return _graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])


def test_correctness_gate_across_the_zoo_op_set():
    """Every zoo op MNN claims runs within the gate: each distinct single node, plus 3-node regions."""
    b = _B
    covered, claimed = set(), set()
    for model in ZOO_TINY:
        g = import_model(model)
        ref = g.reference()
        seen_ops = set()
        for i, node in enumerate(g.nodes):
            if not b.supports(g, node):
                continue
            claimed.add(node.op_type)
            if node.op_type in seen_ops:
                continue
            seen_ops.add(node.op_type)
            assert_compiled_matches_reference(b, g, ref, 1 << i, 2, f"mnn {model} {node.op_type}")
            covered.add(node.op_type)
        masks = list(RegionPattern("r", max_size=3, max_regions=60).matches(g, lambda n: b.supports(g, n)))
        for mask in masks[1::max(1, len(masks) // 3)][:3]:
            assert_compiled_matches_reference(b, g, ref, mask, 2, f"mnn {model}")
    assert covered == claimed
    # the zoo's ops that MNN is not given, and why (see the module docstring)
    zoo_ops = {n.op_type for m in ZOO_TINY for n in import_model(m).nodes}
    assert zoo_ops - covered == {"Gelu", "Gather"}, zoo_ops - covered


def test_refuses_what_it_gets_wrong_or_cannot_load():
    b = _B
    bert = import_model("bert-tiny")
    assert not any(b.supports(bert, n) for n in bert.nodes if n.op_type == "Gelu")  # tanh approximation
    r3d = import_model("resnet3d50-tiny")
    assert not any(b.supports(r3d, n) for n in r3d.nodes if n.op_type == "Conv")  # 3-D convolution
    shape = numpy_helper.from_array(np.array([2, 6], dtype=np.int64), "shape")
    g = _graph([helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Shape", ["r"], ["s"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
               [helper.make_tensor_value_info("s", TensorProto.INT64, None)], [shape])
    assert b.supports(g, g.nodes[0])  # constant int64 shape: folded by the converter
    assert not b.supports(g, g.nodes[1])  # int64 output: MNN would return int32
    g2 = _graph([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                 helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert not b.supports(g2, g2.nodes[0])  # a shape that is a graph input


def test_winograd_high_fails_the_gate_where_low_passes():
    """MNN's default (large Winograd tiles) misses the fp32 gate on a 3x3 convolution; the
    backend's default keeps to small tiles. This is why ``mnn[winograd=high]`` is measured but
    its 3x3 convolutions come back as wrong numbers."""
    g = _conv3x3()
    ref = g.reference()
    sg = g.whole()
    feeds, expected = sg.reference_io(ref)
    errors = {}
    for name in ("mnn", "mnn[winograd=high]"):
        exe = get_backend(name).compile(sg, threads=2)
        cmp = compare([to_numpy(o) for o in exe(*[feeds[n] for n in exe.input_names])], expected, ["y"])
        errors[name] = (cmp.ok, cmp.max_abs)
    assert errors["mnn"][0], errors
    assert not errors["mnn[winograd=high]"][0], errors
    assert errors["mnn[winograd=high]"][1] > 10 * errors["mnn"][1]


def test_configurations_have_distinct_names_and_keys():
    low, high = get_backend("mnn"), get_backend("mnn[winograd=high]")
    assert get_backend("mnn[winograd=low]") is low
    assert high.name == "mnn[winograd=high]" and high.base_name() == "mnn"
    assert low.version != high.version  # the version is part of every measurement key
    with pytest.raises(BackendError, match="winograd=huge is not in the declared grid"):
        get_backend("mnn[winograd=huge]")


def test_converter_rejection_is_a_backend_error(monkeypatch):
    import _tools

    monkeypatch.setattr(_tools, "mnnconvert", lambda argv: False)
    g = _conv3x3(channels=4, size=8)
    with pytest.raises(BackendError, match="mnn could not compile .*converter rejected"):
        _B.compile(g.whole(), threads=1)


def test_compile_and_run_print_nothing(capfd):
    g = _conv3x3(channels=4, size=8)
    capfd.readouterr()
    exe = _B.compile(g.whole(), threads=1)
    exe(np.ones((1, 4, 8, 8), np.float32))
    out = capfd.readouterr().out
    assert out == "", out
