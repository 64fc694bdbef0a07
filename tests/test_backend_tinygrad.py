"""The tinygrad backend (opt-in): regions of the zoo's tiny models against the reference,
support checks, compile errors as BackendError, and availability without clang.

Tolerance: ``collage_ml.measure.timing.compare`` (the fp32 gate, rtol 1e-3, atol 1e-4
scaled by the output's magnitude). Measured worst absolute error on the zoo's tiny
models is about 1.4e-6 (whole bert-tiny).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_ml.backends.base import get_backend
from collage_ml.backends.patterns import RegionPattern
from collage_ml.errors import BackendError
from collage_ml.ir.importers import from_onnx, import_model
from tests.helpers import assert_compiled_matches_reference

_B = get_backend("tinygrad")
pytestmark = pytest.mark.skipif(not _B.available(), reason=f"tinygrad unavailable: {_B.unavailable_reason()}")


@pytest.fixture(scope="module")
def backend():
    return _B


@pytest.mark.parametrize("model", ["resnet50-tiny", "bert-tiny", "mobilenetv2-tiny"])
def test_regions_match_reference(backend, model):
    g = import_model(model)
    ref = g.reference()
    masks = list(RegionPattern("r", max_size=3, max_regions=40).matches(g, lambda n: backend.supports(g, n)))
    assert masks, f"no tinygrad region in {model}"
    # about four regions: the first, the largest, one in the middle and the last
    picks = {masks[0], max(masks, key=lambda m: bin(m).count("1")), masks[len(masks) // 2], masks[-1]}
    for mask in sorted(picks):
        assert_compiled_matches_reference(backend, g, ref, mask, 1, model)


def test_lone_reshape_runs_unjitted(backend):
    """A region without kernels (a view of its input) cannot be captured by TinyJit; it still runs."""
    shape = numpy_helper.from_array(np.array([2, 6], dtype=np.int64), "shape")
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])], initializer=[shape]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = from_onnx(m, name="reshape")
    assert backend.supports(g, g.nodes[0])
    exe = backend.compile(g.whole(), threads=1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for k in range(2):
        np.testing.assert_array_equal(exe(x + k)[0], (x + k).reshape(2, 6))


def test_unsupported_ops_and_dtypes(backend):
    shape = numpy_helper.from_array(np.array([6], dtype=np.int64), "shape")
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Add", ["i", "i"], ["ii"]),  # supported op, int64 output
             helper.make_node("Reshape", ["r", "shape"], ["rs"]),  # int64 constant at index 1: fine
             helper.make_node("Reshape", ["r", "i"], ["rd"])], "bad",  # int64 input not a constant
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
             helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("nz", TensorProto.INT64, [2, None]),
             helper.make_tensor_value_info("ii", TensorProto.INT64, [2]),
             helper.make_tensor_value_info("rs", TensorProto.FLOAT, [6]),
             helper.make_tensor_value_info("rd", TensorProto.FLOAT, [2, 3])], initializer=[shape]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = from_onnx(m, name="bad")
    got = {n.outputs[0]: backend.supports(g, n) for n in g.nodes}
    assert got == {"nz": False, "r": True, "ii": False, "rs": True, "rd": False}


def test_compile_error_is_backend_error(backend, monkeypatch):
    import tinygrad.nn.onnx

    def boom(*a, **k):
        raise RuntimeError("no runner today\nsecond line")

    monkeypatch.setattr(tinygrad.nn.onnx, "OnnxRunner", boom)
    g = import_model("resnet50-tiny")
    with pytest.raises(BackendError, match="tinygrad could not compile .*no runner today$"):
        backend.compile(g.subgraph(1), threads=1)


def test_missing_clang_makes_it_unavailable(monkeypatch):
    import shutil

    from collage_ml.backends.tinygrad_backend import TinygradBackend

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    b = TinygradBackend()
    assert not b.available()
    assert "clang" in b.unavailable_reason() and b.install_hint in b.unavailable_reason()
    assert b.version == "unavailable"
    with pytest.raises(BackendError, match="unavailable"):
        b.compile(import_model("resnet50-tiny").subgraph(1), threads=1)
