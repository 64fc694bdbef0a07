"""Tests of the ONNX->torch mapping and the ``torch`` and ``inductor`` backends.

Reference values come from onnxruntime (``Graph.reference`` / ``run_onnx``, CPU
provider, optimisations off). Tolerances: ``rtol=1e-3, atol=1e-4`` for
everything, loosened to ``atol=1e-3`` where a convolution or GEMM is involved
(oneDNN/MKL sum in a different order than onnxruntime's MLAS, and the zoo's
deeper convolution chains accumulate that difference) and for whole models.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from collage_ml.backends import base
from collage_ml.backends.inductor_backend import InductorBackend
from collage_ml.backends.onnx_to_torch import OPS, SPECS, TorchProgram, supported, unsupported_reason
from collage_ml.backends.patterns import RegionPattern
from collage_ml.backends.torch_backend import TorchBackend
from collage_ml.errors import BackendError
from collage_ml.ir import from_onnx
from collage_ml.ir.graph import Graph
from collage_ml.ir.reference import run_onnx

try:
    from collage_ml.ir import zoo

    TINY = [n for n in zoo.names() if n.endswith("-tiny")]
except Exception:  # the zoo is not importable (yet)
    TINY = []


RTOL, ATOL = 1e-3, 1e-4
ATOL_CONV = 1e-3
_MATH_HEAVY = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum"}


def _tol(ops) -> dict:
    return dict(rtol=RTOL, atol=ATOL_CONV if set(ops) & _MATH_HEAVY else ATOL)


@functools.lru_cache(maxsize=None)
def _zoo_graph(name: str) -> Graph:
    if not TINY:
        pytest.skip("the model zoo is not importable")
    from collage_ml.ir import import_model

    try:
        return import_model(name)
    except Exception as e:  # pragma: no cover - zoo still being written
        pytest.skip(f"{name} does not import: {e}")


@pytest.fixture(scope="module")
def torch_backend() -> TorchBackend:
    b = TorchBackend()
    assert b.available(), b.unavailable_reason()
    return b


@pytest.fixture(scope="module")
def inductor_backend() -> InductorBackend:
    b = InductorBackend()
    assert b.available(), b.unavailable_reason()
    return b


def _check_subgraph(backend, graph: Graph, mask: int, **tol) -> None:
    sg = graph.subgraph(mask)
    feeds, expected = sg.reference_io(graph.reference())
    ex = backend.compile(sg, threads=1)
    assert ex.input_names == sg.inputs and ex.output_names == sg.outputs
    outs = ex(*[feeds[t] for t in sg.inputs])
    assert len(outs) == len(sg.outputs)
    tol = tol or _tol(n.op_type for n in sg.nodes)
    for name, out in zip(sg.outputs, outs):
        assert isinstance(out, torch.Tensor) and out.is_contiguous()
        np.testing.assert_allclose(
            base.to_numpy(out), expected[name], **tol, err_msg=f"{sg!r} output {name!r}"
        )


# -- the backends' surface ------------------------------------------------------------------------
def test_backend_attributes(torch_backend, inductor_backend):
    assert torch_backend.name == "torch" and torch_backend.device == "cpu"
    assert torch_backend.install_hint == "pip install torch==2.13.0"
    assert torch_backend.version == torch.__version__
    assert torch_backend.packages == ("torch",)
    assert {p.kind for p in torch_backend.patterns} == {"op"}
    names = {p.name for p in torch_backend.patterns}
    assert {"torch-conv", "torch-matmul", "torch-gemm", "torch-relu", "torch-softmax"} <= names
    # every mapped op type starts some pattern, so the backend can cover every node it supports
    starts = {op for p in torch_backend.patterns for op in p.steps[0].ops}
    assert starts == set(SPECS)
    assert inductor_backend.name == "inductor" and inductor_backend.device == "cpu"
    assert inductor_backend.version.startswith(torch.__version__) and "inductor" in inductor_backend.version
    [region] = inductor_backend.patterns
    assert isinstance(region, RegionPattern) and region.kind == "region" and region.max_size == 16
    # worker processes rebuild backends from their spec
    for b in (torch_backend, inductor_backend):
        module, qualname, config = b.spec()
        rebuilt = getattr(__import__(module, fromlist=[qualname]), qualname)(**config)
        assert type(rebuilt) is type(b) and rebuilt.version == b.version
    assert InductorBackend(max_region_size=4).patterns[0].max_size == 4
    # both registered under their names
    assert base._FACTORIES["torch"] is TorchBackend and base._FACTORIES["inductor"] is InductorBackend


# -- hand-built single-op graphs vs onnxruntime -------------------------------------------------------
class In:
    """A graph input of a given shape and element type."""

    def __init__(self, shape, elem_type=TensorProto.FLOAT):
        self.shape, self.elem_type = tuple(shape), elem_type


def single_op_model(op, inputs, attrs=None, opset=17, outputs=1, out_types=None) -> onnx.ModelProto:
    """One ``op`` node. ``inputs``: a shape tuple or :class:`In` (graph input), an array (initializer) or "" (omitted)."""
    graph_inputs, inits, names = [], [], []
    for i, v in enumerate(inputs):
        name = f"i{i}"
        if isinstance(v, str) and v == "":
            names.append("")
            continue
        names.append(name)
        if isinstance(v, tuple):
            v = In(v)
        if isinstance(v, In):
            graph_inputs.append(helper.make_tensor_value_info(name, v.elem_type, list(v.shape)))
        else:
            inits.append(numpy_helper.from_array(np.asarray(v), name))
    out_types = out_types or [TensorProto.FLOAT] * outputs
    outs = [f"y{k}" for k in range(outputs)]
    node = helper.make_node(op, names, outs, name=f"{op}_node", **(attrs or {}))
    g = helper.make_graph(
        [node], "single", graph_inputs, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _f(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i64(*v):
    return np.array(v, dtype=np.int64)


INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min
B, I64 = TensorProto.BOOL, TensorProto.INT64

# (id, op, inputs, attrs, opset, outputs, out_types)
CASES = [
    ("conv-asym-pads", "Conv", [(1, 2, 7, 6), _f(3, 2, 3, 3), _f(3)], dict(pads=[0, 1, 2, 1], strides=[2, 1]), 17, 1, None),
    ("conv-same-upper", "Conv", [(1, 2, 7, 7), _f(4, 2, 3, 3)], dict(auto_pad="SAME_UPPER", strides=[2, 2]), 17, 1, None),
    ("conv-same-lower", "Conv", [(1, 2, 6, 6), _f(2, 2, 4, 4)], dict(auto_pad="SAME_LOWER", strides=[2, 2]), 17, 1, None),
    ("conv-valid", "Conv", [(1, 2, 6, 6), _f(2, 2, 3, 3)], dict(auto_pad="VALID"), 17, 1, None),
    ("conv1d-groups-dil", "Conv", [(1, 4, 9), _f(4, 2, 3), _f(4)], dict(group=2, dilations=[2], pads=[2, 2]), 17, 1, None),
    ("conv3d-asym", "Conv", [(1, 2, 3, 4, 4), _f(2, 2, 2, 2, 2)], dict(pads=[1, 0, 1, 0, 1, 0], strides=[1, 2, 1]), 17, 1, None),
    ("conv-depthwise", "Conv", [(1, 4, 5, 5), _f(4, 1, 3, 3), _f(4)], dict(group=4, pads=[1, 1, 1, 1]), 17, 1, None),
    ("convT-asym-outpad", "ConvTranspose", [(1, 2, 3, 3), _f(2, 3, 3, 3), _f(3)],
     dict(strides=[2, 2], pads=[0, 1, 1, 0], output_padding=[1, 1]), 17, 1, None),
    ("convT-same-upper", "ConvTranspose", [(1, 2, 3, 3), _f(2, 2, 3, 3)], dict(strides=[2, 2], auto_pad="SAME_UPPER"), 17, 1, None),
    ("convT-output-shape", "ConvTranspose", [(1, 2, 3, 3), _f(2, 2, 3, 3)], dict(strides=[2, 2], output_shape=[6, 7]), 17, 1, None),
    ("convT3d-groups", "ConvTranspose", [(1, 4, 2, 3, 3), _f(4, 1, 2, 2, 2)], dict(group=2, strides=[2, 2, 2]), 17, 1, None),
    ("gemm-transB", "Gemm", [(3, 4), _f(5, 4), _f(5)], dict(transB=1, alpha=0.5, beta=2.0), 17, 1, None),
    ("gemm-linear", "Gemm", [(3, 4), _f(5, 4), _f(5)], dict(transB=1), 17, 1, None),
    ("gemm-transA-bcast", "Gemm", [(4, 3), (4, 5), _f(1, 5)], dict(transA=1), 17, 1, None),
    ("gemm-noC", "Gemm", [(2, 3), _f(3, 4)], dict(alpha=2.0), 17, 1, None),
    ("matmul-batched", "MatMul", [(2, 3, 4), _f(4, 5)], {}, 17, 1, None),
    ("matmul-1d", "MatMul", [(4,), (2, 4, 3)], {}, 17, 1, None),
    ("einsum", "Einsum", [(2, 3, 4), (2, 4, 5)], dict(equation="bij,bjk->bik"), 17, 1, None),
    ("split-input", "Split", [(2, 7), _i64(3, 4)], dict(axis=1), 13, 2, None),
    ("split-num-outputs", "Split", [(2, 7)], dict(axis=1, num_outputs=3), 18, 3, None),
    ("split-equal", "Split", [(6, 2)], dict(axis=0), 13, 3, None),
    ("slice-steps", "Slice", [(5, 6, 7), _i64(4, 1), _i64(-7, 6), _i64(0, -1), _i64(-2, 3)], {}, 13, 1, None),
    ("slice-reverse", "Slice", [(5, 4), _i64(INT64_MAX), _i64(INT64_MIN), _i64(1), _i64(-1)], {}, 13, 1, None),
    ("slice-plain", "Slice", [(5, 4), _i64(1), _i64(3)], {}, 13, 1, None),
    ("slice-clamped", "Slice", [(5, 4), _i64(-100, 2), _i64(100, INT64_MAX), _i64(0, 1), _i64(2, 1)], {}, 13, 1, None),
    ("softmax-axis1", "Softmax", [(2, 3, 4)], dict(axis=1), 13, 1, None),
    ("softmax-opset11-coerced", "Softmax", [(2, 3, 4)], dict(axis=1), 11, 1, None),
    ("logsoftmax-axis-2", "LogSoftmax", [(2, 3, 4)], dict(axis=-2), 13, 1, None),
    ("maxpool-asym", "MaxPool", [(1, 2, 6, 7)], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0]), 17, 1, None),
    ("maxpool-ceil", "MaxPool", [(1, 1, 6, 6)], dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), 17, 1, None),
    ("maxpool-dilated", "MaxPool", [(1, 1, 7, 7)], dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1]), 17, 1, None),
    ("maxpool-same", "MaxPool", [(1, 1, 5, 5)], dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"), 17, 1, None),
    ("avgpool-asym-excl", "AveragePool", [(1, 2, 6, 7)],
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], count_include_pad=0), 17, 1, None),
    ("avgpool-asym-incl", "AveragePool", [(1, 2, 6, 7)],
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], count_include_pad=1), 17, 1, None),
    ("avgpool-sym-excl", "AveragePool", [(1, 2, 5, 5)], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), 17, 1, None),
    ("avgpool-ceil", "AveragePool", [(1, 1, 5, 5)], dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), 17, 1, None),
    ("avgpool-1d", "AveragePool", [(1, 2, 9)], dict(kernel_shape=[3], strides=[2]), 17, 1, None),
    ("globalavgpool", "GlobalAveragePool", [(1, 3, 4, 5)], {}, 17, 1, None),
    ("globalmaxpool", "GlobalMaxPool", [(1, 3, 4, 5)], {}, 17, 1, None),
    ("reducemean-attr", "ReduceMean", [(2, 3, 4)], dict(axes=[1, -1], keepdims=0), 13, 1, None),
    ("reducemean-input", "ReduceMean", [(2, 3, 4), _i64(-1, -2)], {}, 18, 1, None),
    ("reducemean-noop", "ReduceMean", [(2, 3, 4)], dict(noop_with_empty_axes=1), 18, 1, None),
    ("reducesum-input", "ReduceSum", [(2, 3, 4), _i64(0)], dict(keepdims=1), 13, 1, None),
    ("reducesum-all", "ReduceSum", [(2, 3, 4)], dict(keepdims=0), 13, 1, None),
    ("reducemax-input", "ReduceMax", [(2, 3, 4), _i64(-1)], dict(keepdims=0), 18, 1, None),
    ("reducel2", "ReduceL2", [(2, 3, 4)], dict(axes=[2]), 13, 1, None),
    ("argmax", "ArgMax", [(2, 3, 4)], dict(axis=1, keepdims=0), 13, 1, [I64]),
    ("reshape-0-minus1", "Reshape", [(2, 3, 4), _i64(0, -1)], {}, 14, 1, None),
    ("reshape-allowzero", "Reshape", [(2, 3, 4), _i64(4, 6)], dict(allowzero=1), 14, 1, None),
    ("flatten", "Flatten", [(2, 3, 4, 5)], dict(axis=2), 13, 1, None),
    ("squeeze", "Squeeze", [(1, 3, 1, 4), _i64(0, 2)], {}, 13, 1, None),
    ("unsqueeze", "Unsqueeze", [(3, 4), _i64(0, -1)], {}, 13, 1, None),
    ("transpose-default", "Transpose", [(2, 3, 4)], {}, 13, 1, None),
    ("transpose-perm", "Transpose", [(2, 3, 4)], dict(perm=[1, 0, 2]), 13, 1, None),
    ("concat", "Concat", [(2, 3), (2, 1), _f(2, 2)], dict(axis=-1), 13, 1, None),
    ("gather-2d-neg", "Gather", [(3, 4, 5), _i64(0, -1, 2, 1).reshape(2, 2)], dict(axis=1), 13, 1, None),
    ("gather-scalar", "Gather", [(3, 4), np.array(-1, np.int64)], dict(axis=0), 13, 1, None),
    ("gather-runtime", "Gather", [(12, 3), In((2, 2), I64)], dict(axis=0), 13, 1, None),
    ("expand", "Expand", [(3, 1), _i64(2, 1, 4)], {}, 13, 1, None),
    ("tile", "Tile", [(2, 3), _i64(2, 2)], {}, 13, 1, None),
    ("cast-int64", "Cast", [(2, 3)], dict(to=TensorProto.INT64), 13, 1, [I64]),
    ("cast-bool", "Cast", [(2, 3)], dict(to=TensorProto.BOOL), 13, 1, [B]),
    ("shape", "Shape", [(2, 3, 4)], dict(start=1), 15, 1, [I64]),
    ("where", "Where", [In((2, 3), B), (2, 3), (1, 3)], {}, 13, 1, None),
    ("equal-int", "Equal", [In((4, 3), I64), In((4, 3), I64)], {}, 13, 1, [B]),
    ("less", "Less", [(2, 3), (3,)], {}, 13, 1, [B]),
    ("pad-constant", "Pad", [(1, 2, 3, 4), _i64(0, 0, 1, 2, 0, 0, 2, 1), np.array(1.5, np.float32)], {}, 13, 1, None),
    ("pad-negative", "Pad", [(1, 2, 3, 4), _i64(0, 0, -1, 1, 0, 0, 1, -1)], {}, 13, 1, None),
    ("pad-reflect", "Pad", [(1, 2, 3, 4), _i64(0, 0, 1, 2, 0, 0, 2, 1)], dict(mode="reflect"), 13, 1, None),
    ("pad-edge", "Pad", [(1, 2, 3, 4), _i64(0, 0, 1, 2, 0, 0, 2, 1)], dict(mode="edge"), 13, 1, None),
    ("pad-edge-last-axis", "Pad", [(2, 2, 3, 4), _i64(0, 0, 0, 2, 0, 0, 0, 1)], dict(mode="edge"), 13, 1, None),
    ("pad-reflect-3d", "Pad", [(2, 3, 4), _i64(0, 1, 2, 0, 2, 1)], dict(mode="reflect"), 13, 1, None),
    ("pad-axes", "Pad", [(2, 3, 4), _i64(1, 2), "", _i64(-1)], {}, 18, 1, None),
    ("clip-min-only", "Clip", [(2, 3), np.array(0.1, np.float32)], {}, 13, 1, None),
    ("clip-both", "Clip", [(2, 3), np.array(-0.5, np.float32), np.array(0.5, np.float32)], {}, 13, 1, None),
    ("clip-opset6", "Clip", [(2, 3)], dict(min=-0.5, max=0.5), 6, 1, None),
    ("layernorm-axis1", "LayerNormalization", [(2, 3, 4), _f(3, 4), _f(3, 4)], dict(axis=1), 17, 1, None),
    ("layernorm-last", "LayerNormalization", [(2, 3, 4), _f(4)], dict(epsilon=1e-3), 17, 1, None),
    ("batchnorm", "BatchNormalization", [(2, 3, 4, 4), _f(3), _f(3), _f(3), np.abs(_f(3)) + 0.5], {}, 15, 1, None),
    ("instancenorm", "InstanceNormalization", [(2, 3, 5), _f(3), _f(3)], {}, 13, 1, None),
    ("add-bcast", "Add", [(2, 3, 4), _f(4)], {}, 13, 1, None),
    ("sub", "Sub", [(2, 3), (2, 3)], {}, 13, 1, None),
    ("mul-scalar", "Mul", [(2, 3), np.array(0.25, np.float32)], {}, 13, 1, None),
    ("div", "Div", [(2, 3), np.abs(_f(3)) + 0.5], {}, 13, 1, None),
    ("pow", "Pow", [(2, 3), np.array(2.0, np.float32)], {}, 13, 1, None),
    ("sqrt", "Sqrt", [(2, 3)], {}, 13, 1, None),
    ("reciprocal", "Reciprocal", [(2, 3)], {}, 13, 1, None),
    ("neg", "Neg", [(2, 3)], {}, 13, 1, None),
    ("abs", "Abs", [(2, 3)], {}, 13, 1, None),
    ("exp", "Exp", [(2, 3)], {}, 13, 1, None),
    ("log", "Log", [(2, 3)], {}, 13, 1, None),
    ("erf", "Erf", [(2, 3)], {}, 13, 1, None),
    ("relu", "Relu", [(2, 3)], {}, 13, 1, None),
    ("leakyrelu", "LeakyRelu", [(2, 3)], dict(alpha=0.1), 13, 1, None),
    ("sigmoid", "Sigmoid", [(2, 3)], {}, 13, 1, None),
    ("tanh", "Tanh", [(2, 3)], {}, 13, 1, None),
    ("hardsigmoid", "HardSigmoid", [(2, 3)], dict(alpha=0.3, beta=0.4), 13, 1, None),
    ("hardswish", "HardSwish", [(2, 3)], {}, 14, 1, None),
    ("gelu", "Gelu", [(2, 3)], {}, 20, 1, None),
    ("gelu-tanh", "Gelu", [(2, 3)], dict(approximate="tanh"), 20, 1, None),
    ("elu", "Elu", [(2, 3)], dict(alpha=0.5), 13, 1, None),
    ("softplus", "Softplus", [(2, 3)], {}, 13, 1, None),
    ("prelu", "PRelu", [(2, 3), _f(3)], {}, 13, 1, None),
    ("max-variadic", "Max", [(2, 3), (3,), (2, 1)], {}, 13, 1, None),
    ("sum-variadic", "Sum", [(2, 3), (3,), (2, 1)], {}, 13, 1, None),
    ("dropout", "Dropout", [(2, 3)], {}, 13, 1, None),
    ("identity", "Identity", [(2, 3)], {}, 13, 1, None),
    ("resize-nearest", "Resize", [(1, 2, 3, 4), "", np.array([1, 1, 2, 3], np.float32)],
     dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), 13, 1, None),
    ("resize-linear", "Resize", [(1, 2, 3, 4), "", "", _i64(1, 2, 5, 7)], dict(mode="linear"), 13, 1, None),
    ("constantofshape", "ConstantOfShape", [_i64(2, 3)],
     dict(value=numpy_helper.from_array(np.array([1.5], np.float32))), 13, 1, None),
    ("range", "Range", [np.array(1.0, np.float32), np.array(4.0, np.float32), np.array(0.5, np.float32)], {}, 13, 1, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_vs_onnxruntime(case):
    _, op, inputs, attrs, opset, n_out, out_types = case
    model = single_op_model(op, inputs, attrs, opset, n_out, out_types)
    g = from_onnx(model)
    [node] = g.nodes
    assert unsupported_reason(g, node) is None
    feeds = g.example_inputs(seed=3)
    expected = run_onnx(g.model, feeds)
    program = TorchProgram(g.whole())
    with torch.inference_mode():
        outs = program(*[torch.from_numpy(feeds[t]) for t in program.input_names])
    for name, out in zip(program.output_names, outs):
        exp = expected[name]
        assert tuple(out.shape) == exp.shape, name
        assert out.numpy().dtype == exp.dtype, name
        np.testing.assert_allclose(out.numpy(), exp, **_tol([op]), err_msg=name)


@pytest.mark.parametrize("case_id", ["shape", "constantofshape", "range", "avgpool-asym-excl", "dropout"])
def test_program_device(case_id):
    """Weights go to the program's device, and kernels that create tensors put them next to their inputs."""
    _, op, inputs, attrs, opset, n_out, out_types = next(c for c in CASES if c[0] == case_id)
    g = from_onnx(single_op_model(op, inputs, attrs, opset, n_out, out_types))
    program = TorchProgram(g.whole(), device="meta")
    assert all(t.device.type == "meta" for t in program.constants.values())
    xs = program.example_inputs()
    assert all(x.device.type == "meta" for x in xs)
    for name, y in zip(program.output_names, program(*xs)):
        assert y.device.type == "meta" and tuple(y.shape) == g.tensors[name].shape


def test_ops_table_entries_are_callable():
    """``OPS[op](node, graph, inputs)`` is the mapping's public form."""
    model = single_op_model("Gemm", [(3, 4), _f(5, 4), _f(5)], dict(transB=1, alpha=0.5))
    g = from_onnx(model)
    [node] = g.nodes
    x = _f(3, 4, seed=7)
    w, b = _f(5, 4), _f(5)
    [y] = OPS["Gemm"](node, g, [torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)])
    np.testing.assert_allclose(y.numpy(), 0.5 * x @ w.T + b, rtol=RTOL, atol=ATOL_CONV)
    assert set(OPS) == set(SPECS)


# -- unsupported nodes ------------------------------------------------------------------------------
def _two_node_graph(second_op: str, attrs=None) -> Graph:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node(second_op, ["r"], ["y"], name="second", **(attrs or {})),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_unsupported_op(torch_backend, inductor_backend):
    g = _two_node_graph("LRN", dict(size=3))
    relu, lrn = g.nodes
    assert "LRN" not in OPS
    assert torch_backend.supports(g, relu) and not torch_backend.supports(g, lrn)
    assert not inductor_backend.supports(g, lrn)
    assert "not mapped" in unsupported_reason(g, lrn)
    # no pattern matches the unsupported node
    for p in torch_backend.patterns:
        for mask in p.matches(g, lambda n: torch_backend.supports(g, n)):
            assert not mask >> lrn.index & 1
    with pytest.raises(BackendError, match="LRN"):
        torch_backend.compile(g.whole())
    with pytest.raises(BackendError, match="LRN"):
        inductor_backend.compile(g.whole())
    _check_subgraph(torch_backend, g, 1 << relu.index)


def test_unsupported_non_constant_shape_input():
    # Slice starts that are computed at run time: the node is unsupported
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
        helper.make_node("Slice", ["x", "s", "e"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(_i64(5), "e")],
    )
    graph = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    shape_node, slice_node = graph.nodes
    assert supported(graph, shape_node)
    assert not supported(graph, slice_node)
    assert "constant" in unsupported_reason(graph, slice_node)


def test_unsupported_dtype():
    model = single_op_model("Relu", [In((2, 3), TensorProto.DOUBLE)], out_types=[TensorProto.DOUBLE])
    g = from_onnx(model)
    assert not supported(g, g.nodes[0])
    assert "double" in unsupported_reason(g, g.nodes[0])


# -- executables ----------------------------------------------------------------------------------------
def test_executable_accepts_numpy_and_dlpack(torch_backend):
    from tests.helpers import chain_model

    g = from_onnx(chain_model())
    sg = g.whole()
    feeds, expected = sg.reference_io(g.reference())
    ex = torch_backend.compile(sg, threads=1)
    x = feeds["x"]
    for arg in (x, torch.from_numpy(x), np.asfortranarray(x), torch.from_numpy(x.copy()).requires_grad_(False)):
        [y] = ex(arg)
        assert isinstance(y, torch.Tensor) and y.is_contiguous()
        np.testing.assert_allclose(y.numpy(), expected["y"], rtol=RTOL, atol=ATOL)
    with pytest.raises(BackendError):
        ex()


# -- zoo models on the torch backend --------------------------------------------------------------------
@pytest.mark.parametrize("name", TINY or ["<zoo>"])
def test_zoo_op_patterns_torch(torch_backend, name):
    g = _zoo_graph(name)
    sup = lambda n: torch_backend.supports(g, n)  # noqa: E731
    unsupported = [n.op_type for n in g.nodes if not sup(n)]
    assert not unsupported, f"{name}: ops not mapped: {sorted(set(unsupported))}"
    count, covered = 0, 0
    for p in torch_backend.patterns:
        for mask in p.matches(g, sup):
            _check_subgraph(torch_backend, g, mask)
            count += 1
            covered |= mask
    assert covered == g.all_mask, "every node is covered by some op-level pattern"
    assert count >= len(g.nodes)


@pytest.mark.parametrize("name", TINY or ["<zoo>"])
def test_zoo_whole_model_torch(torch_backend, name):
    g = _zoo_graph(name)
    assert all(torch_backend.supports(g, n) for n in g.nodes)
    _check_subgraph(torch_backend, g, g.all_mask, rtol=RTOL, atol=ATOL_CONV)


# -- inductor ---------------------------------------------------------------------------------------------
def _some_regions(backend, g: Graph, count: int, min_size: int = 2, max_size: int = 5) -> list[int]:
    [pattern] = backend.patterns
    out = []
    for mask in pattern.matches(g, lambda n: backend.supports(g, n)):
        size = bin(mask).count("1")
        if mask != g.all_mask and min_size <= size <= max_size and g.is_connected(mask):
            out.append(mask)
    # spread the picks over the model, deterministically
    step = max(1, len(out) // count)
    return out[::step][:count]


@pytest.mark.parametrize("name", ["resnet50-tiny", "bert-tiny"])
def test_inductor_regions(inductor_backend, name):
    if name not in TINY:
        pytest.skip(f"{name} not in the zoo")
    g = _zoo_graph(name)
    regions = _some_regions(inductor_backend, g, 2)  # a cold Inductor compile takes seconds
    assert regions
    for mask in regions:
        _check_subgraph(inductor_backend, g, mask)


def test_inductor_whole_model(inductor_backend):
    name = "dcgan-tiny"
    if name not in TINY:
        pytest.skip(f"{name} not in the zoo")
    g = _zoo_graph(name)
    t = time.perf_counter()
    _check_subgraph(inductor_backend, g, g.all_mask, rtol=RTOL, atol=ATOL_CONV)
    assert time.perf_counter() - t < 120


def test_inductor_identical_regions_keep_their_weights(inductor_backend):
    """Two structurally identical convolutions with different weights compile to separate programs."""
    name = "resnet50-tiny"
    if name not in TINY:
        pytest.skip(f"{name} not in the zoo")
    g = _zoo_graph(name)
    convs = [n for n in g.nodes if n.op_type == "Conv"]
    by_hash: dict[str, list[int]] = {}
    for n in convs:
        by_hash.setdefault(g.subgraph(1 << n.index).hash, []).append(n.index)
    twins = next((v for v in by_hash.values() if len(v) >= 2), None)
    if twins is None:
        pytest.skip("no two identical convolutions")
    for i in twins[:2]:
        _check_subgraph(inductor_backend, g, 1 << i)
