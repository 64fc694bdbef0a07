"""A small corpus of "models from the wild", built in code (no downloads).

Each builder returns an ``onnx.ModelProto`` shaped like a file a user might
find published: old IR versions, old opsets, weights made by nodes, sloppy
graphs. ``CORPUS`` maps a name to ``(builder, what it exercises)``; the README
lists the same table. Every model is tiny (a few ms on onnxruntime) so the
whole corpus places in CI.

``squeezenet_ir3(fires=...)`` also builds the large benchmark model
(``benchmarks/wild_models.py --large``).
"""

from __future__ import annotations

import io
import warnings
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _w(rs: np.random.Generator, name: str, shape, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rs.standard_normal(shape) * scale).astype(np.float32), name)


def _as_inputs(inits) -> list[onnx.ValueInfoProto]:
    """Initializers listed among the graph inputs, as IR version 3 requires."""
    return [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]


def _ir3(graph: onnx.GraphProto, opset: int = 9) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="wild-corpus")
    m.ir_version = 3
    return m


# -- torch's legacy (TorchScript) exporter ----------------------------------------------------------
def _torch_cnn():
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.conv2 = nn.Conv2d(8, 4, 1)
            self.drop = nn.Dropout(0.5)
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            y = self.pool(torch.relu(self.bn(self.conv(x))))
            y = torch.relu(self.conv2(self.up(y)))
            y = self.pool(y)
            return torch.softmax(self.fc(self.drop(torch.flatten(y, 1))), dim=1)

    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.2, 0.2)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(1, 3, 16, 16),)


def torch_legacy(opset: int) -> onnx.ModelProto:
    """A small CNN through ``torch.onnx.export(dynamo=False)`` at ``opset``."""
    import torch

    net, inputs = _torch_cnn()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # training=PRESERVE would keep Dropout; eval export drops it, so BatchNorm and the rest are what stays
        torch.onnx.export(net, inputs, buf, dynamo=False, opset_version=opset,
                          do_constant_folding=False, input_names=["input"], output_names=["probs"])
    return onnx.load_from_string(buf.getvalue())


# -- hand-made classic models (IR version 3, opset 9) -------------------------------------------------
def squeezenet_ir3(fires: int = 1, seed: int = 0, size: int = 16, width: int = 8) -> onnx.ModelProto:
    """A SqueezeNet-style classifier as old model zoos published it.

    IR version 3, opset 9; every initializer is listed among the graph inputs;
    the conv biases are made by ``ConstantOfShape`` nodes; LRN after the first
    conv, Fire modules (squeeze 1x1, expand 1x1 and 3x3, Concat), Dropout,
    GlobalAveragePool, Flatten and Gemm with ``transB``. 7 nodes per fire after import
    (10 in the file, with its ConstantOfShape biases).
    """
    rs = _rng(seed)
    inits, nodes = [], []

    def bias_of(name: str, n: int, value: float) -> str:
        # the shape is an initializer; the bias is made at run time by ConstantOfShape
        shp = numpy_helper.from_array(np.array([n], dtype=np.int64), f"{name}_shape")
        inits.append(shp)
        nodes.append(helper.make_node("ConstantOfShape", [shp.name], [name], name=f"{name}_cos",
                                      value=numpy_helper.from_array(np.array([value], np.float32))))
        return name

    def conv(x: str, name: str, cin: int, cout: int, k: int, pad: int = 0, stride: int = 1) -> str:
        w = _w(rs, f"{name}_w_0", (cout, cin, k, k), scale=(2.0 / (cin * k * k)) ** 0.5)
        inits.append(w)
        b = bias_of(f"{name}_b_0", cout, 0.01)
        nodes.append(helper.make_node("Conv", [x, w.name, b], [f"{name}_y"], name=name, kernel_shape=[k, k],
                                      pads=[pad] * 4, strides=[stride, stride]))
        nodes.append(helper.make_node("Relu", [f"{name}_y"], [f"{name}_r"], name=f"{name}_relu"))
        return f"{name}_r"

    x = conv("data_0", "conv1", 3, width, 3, pad=1, stride=2)
    nodes.append(helper.make_node("LRN", [x], ["norm1"], name="norm1", size=3, alpha=1e-4, beta=0.75, bias=1.0))
    nodes.append(helper.make_node("MaxPool", ["norm1"], ["pool1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]))
    x, c = "pool1", width
    for i in range(fires):
        # as in SqueezeNet, the fires widen in steps (every 4th) and a stride-2 maxpool follows every 8th
        w = width + 8 * (i // 4)
        s = conv(x, f"fire{i + 2}/squeeze1x1", c, w // 2, 1)
        e1 = conv(s, f"fire{i + 2}/expand1x1", w // 2, w, 1)
        e3 = conv(s, f"fire{i + 2}/expand3x3", w // 2, w, 3, pad=1)
        out = f"fire{i + 2}/concat"
        nodes.append(helper.make_node("Concat", [e1, e3], [out], name=out, axis=1))
        x, c = out, 2 * w
        if i % 8 == 7 and i + 1 < fires:
            nodes.append(helper.make_node("MaxPool", [x], [f"pool{i + 2}"], name=f"pool{i + 2}",
                                          kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
            x = f"pool{i + 2}"
    nodes.append(helper.make_node("Dropout", [x], ["drop"], name="drop9", ratio=0.5))
    nodes.append(helper.make_node("GlobalAveragePool", ["drop"], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    fw = _w(rs, "fc_w_0", (10, c), scale=0.2)  # Gemm with transB, as Caffe2 exports wrote it
    fb = _w(rs, "fc_b_0", (10,), scale=0.1)
    inits += [fw, fb]
    nodes.append(helper.make_node("Gemm", ["flat", fw.name, fb.name], ["fc"], name="fc", transB=1, alpha=1.0, beta=1.0))
    nodes.append(helper.make_node("Softmax", ["fc"], ["prob_1"], name="softmax", axis=1))
    g = helper.make_graph(
        nodes, "squeezenet_ir3",
        [helper.make_tensor_value_info("data_0", F, [1, 3, size, size])] + _as_inputs(inits),
        [helper.make_tensor_value_info("prob_1", F, [1, 10])],
        initializer=inits,
    )
    return _ir3(g)


def bn_upsample_ir3(seed: int = 1) -> onnx.ModelProto:
    """IR 3 / opset 9: Conv, BatchNormalization, opset-9 Upsample (scales as an input), LRN, Dropout, Gemm."""
    rs = _rng(seed)
    inits = [
        _w(rs, "w1", (4, 3, 3, 3)),
        numpy_helper.from_array(rs.uniform(0.5, 1.5, 4).astype(np.float32), "bn_scale"),
        _w(rs, "bn_bias", (4,), 0.1),
        _w(rs, "bn_mean", (4,), 0.1),
        numpy_helper.from_array(rs.uniform(0.5, 1.5, 4).astype(np.float32), "bn_var"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"),
        _w(rs, "fc_w", (5, 4 * 4 * 4), 0.1),
        _w(rs, "fc_b", (5,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["bn"],
                         name="bn1", epsilon=1e-5),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
        helper.make_node("LRN", ["r1"], ["n1"], name="lrn1", size=5),
        helper.make_node("Upsample", ["n1", "up_scales"], ["up"], name="up1", mode="nearest"),
        helper.make_node("MaxPool", ["up"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["p1"], ["p2"], name="pool2", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Dropout", ["p2"], ["d1"], name="drop1", ratio=0.3),
        helper.make_node("Flatten", ["d1"], ["f1"], name="flat1", axis=1),
        helper.make_node("Gemm", ["f1", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    g = helper.make_graph(
        nodes, "bn_upsample_ir3",
        [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])] + _as_inputs(inits),
        [helper.make_tensor_value_info("y", F, [1, 5])],
        initializer=inits,
    )
    return _ir3(g)


def sloppy(seed: int = 2) -> onnx.ModelProto:
    """IR 4 / opset 11: no value_info at all, output shape unset, nodes out of order, unused initializers."""
    rs = _rng(seed)
    inits = [
        _w(rs, "w1", (6, 3, 3, 3)),
        _w(rs, "b1", (6,), 0.1),
        _w(rs, "w2", (6, 6, 1, 1)),
        _w(rs, "unused_w", (64, 64)),  # never read
        numpy_helper.from_array(np.array([0, -1], np.int64), "shape2d"),
        _w(rs, "fc_w", (6 * 4 * 4, 3), 0.1),
        numpy_helper.from_array(np.array([7], np.int64), "unused_i"),  # never read
    ]
    nodes = [
        helper.make_node("MatMul", ["flat", "fc_w"], ["mm"], name="fc"),
        helper.make_node("Sigmoid", ["mm"], ["y"], name="sig"),
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["p2", "shape2d"], ["flat"], name="reshape"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", kernel_shape=[1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["res"], name="residual"),
        helper.make_node("MaxPool", ["res"], ["p2"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    g = helper.make_graph(
        nodes, "sloppy",
        [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", F, None)],  # no shape recorded
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], producer_name="wild-corpus")
    m.ir_version = 6
    return m


#: name -> (builder, what it exercises); the README's corpus table mirrors this
CORPUS: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "torch-legacy-op9": (lambda: torch_legacy(9),
                         "torch legacy exporter, opset 9: Conv, BatchNormalization, MaxPool, opset-9 Upsample, "
                         "Flatten, Gemm, Softmax"),
    "torch-legacy-op11": (lambda: torch_legacy(11), "the same CNN at opset 11 (Resize with scales, Gemm)"),
    "torch-legacy-op13": (lambda: torch_legacy(13), "the same CNN at opset 13"),
    "squeezenet-ir3": (lambda: squeezenet_ir3(fires=1),
                       "IR 3, opset 9, initializers listed as inputs, ConstantOfShape-made biases, LRN, "
                       "a Fire module (Concat), Dropout, GlobalAveragePool, Flatten, Gemm transB"),
    "bn-upsample-ir3": (bn_upsample_ir3,
                        "IR 3, opset 9: BatchNormalization, opset-9 Upsample with a scales input, LRN, "
                        "AveragePool, Dropout, Flatten, Gemm transB"),
    "sloppy": (sloppy, "no value_info, an output without shape, unsorted nodes, unused initializers, "
               "a residual Add"),
}


def build(name: str) -> onnx.ModelProto:
    return CORPUS[name][0]()


# -- a backend for the fallback test: workers rebuild it from its spec, so it lives in an importable module --
from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend  # noqa: E402


class NoSoftmaxFixture(OnnxRuntimeBackend):
    """onnxruntime that declines Softmax alone, as if its per-op probe had failed: no candidate covers the
    Softmax node, yet this backend runs the whole model (as onnxruntime ran the reference)."""

    name = "test-no-softmax"

    def supports(self, graph, node):
        return node.op_type != "Softmax" and super().supports(graph, node)
