"""ONNX -> torch: an op mapping and an interpreter for SubGraphs (the ``torch`` and ``inductor`` backends).

:data:`OPS` maps ONNX op types (default domain) to functions
``(node, graph, inputs) -> outputs`` implemented with torch ops. Each entry is
backed by a *builder* that reads the node's attributes, static shapes and
shape-like constant inputs once and returns a closure over tensors only; the
:class:`TorchProgram` uses the builders directly, so running a program does no
attribute parsing, and the generated code is straight-line Python over
tensors, which ``torch.compile(fullgraph=True)`` traces without graph breaks.

Every tensor of a :class:`~collage_ml.ir.graph.Graph` has a static shape, and
the mapping uses that: Reshape, Flatten, Squeeze, Unsqueeze, Expand, Tile,
Split and ConstantOfShape take their target shapes from the graph rather than
from their shape inputs, so those inputs need not be constants. Inputs whose
*values* decide the computation (Slice starts/ends/axes/steps, Pad pads, Clip
min/max, Reduce* axes, Resize scales/sizes, Range) must be initializers, or
the node is unsupported.

:func:`supported` decides whether a node can be run: the op is in the table,
its tensors have the dtypes the mapping handles (float32 for math, int64/int32
and bool where they make sense), the builder accepts its attributes and
constants, and running the closure on ``meta`` tensors gives exactly the
output shapes and dtypes the graph records.
"""

from __future__ import annotations

import itertools
import linecache
import math
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import onnx
import torch
import torch.nn.functional as F

from collage_ml.errors import BackendError
from collage_ml.ir.graph import Graph, Node, SubGraph, constant_array

Tensor = torch.Tensor
OpFn = Callable[[Node, Graph, list], list]
Kernel = Callable[[list], list]

_TP = onnx.TensorProto
FLOAT, INT32, INT64, BOOL = _TP.FLOAT, _TP.INT32, _TP.INT64, _TP.BOOL
_F = frozenset({FLOAT})
_I = frozenset({INT64, INT32})
_FI = _F | _I
_ANY = _FI | {BOOL}

#: ONNX element types the mapping can hold as torch tensors
TORCH_DTYPES: dict[int, torch.dtype] = {
    _TP.FLOAT: torch.float32,
    _TP.DOUBLE: torch.float64,
    _TP.FLOAT16: torch.float16,
    _TP.BFLOAT16: torch.bfloat16,
    _TP.INT64: torch.int64,
    _TP.INT32: torch.int32,
    _TP.INT16: torch.int16,
    _TP.INT8: torch.int8,
    _TP.UINT8: torch.uint8,
    _TP.BOOL: torch.bool,
}


class Unsupported(Exception):
    """A builder cannot map this node (attribute, constant or dtype it does not handle)."""


@dataclass(frozen=True)
class OpSpec:
    op_type: str
    build: Callable[[Node, Graph], Kernel]
    #: allowed element types of every input and output not listed in ``free``
    dtypes: frozenset[int]
    #: input slots exempt from the dtype check (indices, shapes, conditions...); the builder checks them
    free_inputs: frozenset[int] = frozenset()
    #: output slots exempt from the dtype check
    free_outputs: frozenset[int] = frozenset()


SPECS: dict[str, OpSpec] = {}
#: ONNX op type -> ``(node, graph, inputs) -> outputs`` over torch tensors
OPS: dict[str, OpFn] = {}


def _as_op_fn(build: Callable[[Node, Graph], Kernel]) -> OpFn:
    def run(node: Node, graph: Graph, inputs: list) -> list:
        return build(node, graph)(list(inputs))

    run.__name__ = getattr(build, "__name__", "op")
    return run


def _register(
    names: str | Sequence[str],
    dtypes: frozenset[int] = _F,
    free_inputs: Sequence[int] = (),
    free_outputs: Sequence[int] = (),
):
    if isinstance(names, str):
        names = [names]

    def deco(build):
        for n in names:
            SPECS[n] = OpSpec(n, build, frozenset(dtypes), frozenset(free_inputs), frozenset(free_outputs))
            OPS[n] = _as_op_fn(build)
        return build

    return deco


# -- helpers -----------------------------------------------------------------------------------
def opset_version(graph: Graph) -> int:
    for o in graph.opset_imports:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _attr(node: Node, name: str, default=None):
    v = node.attributes.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    return tuple(graph.tensors[name].shape)


def _out_shape(graph: Graph, node: Node, k: int = 0) -> tuple[int, ...]:
    return _shape(graph, node.outputs[k])


def _has(node: Node, k: int) -> bool:
    return len(node.inputs) > k and bool(node.inputs[k])


def _const(graph: Graph, node: Node, k: int, what: str) -> np.ndarray:
    name = node.inputs[k]
    if name not in graph.initializers:
        raise Unsupported(f"{node.op_type}: the {what} input {name!r} must be a constant (initializer)")
    return constant_array(graph, name)


def _ints(a) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(a).reshape(-1))


def _torch_pad(begins: Sequence[int], ends: Sequence[int]) -> tuple[int, ...]:
    """ONNX per-axis (begin, end) pads over the trailing axes -> F.pad's last-axis-first list."""
    out: list[int] = []
    for b, e in zip(reversed(list(begins)), reversed(list(ends))):
        out += [int(b), int(e)]
    return tuple(out)


def _resolve_pads(
    node: Node, spatial: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int]
) -> list[int]:
    """Conv/pool pads ``[b1..bn, e1..en]`` from ``pads``/``auto_pad`` (SAME_* computed from static shapes)."""
    nd = len(k)
    auto = _attr(node, "auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = [int(p) for p in (_attr(node, "pads") or [0] * (2 * nd))]
        if len(pads) != 2 * nd:
            raise Unsupported(f"{node.op_type}: pads {pads} do not match {nd} spatial axes")
        return pads
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        b, e = [], []
        for i in range(nd):
            out = -(-spatial[i] // s[i])
            total = max(0, (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            b.append(small if auto == "SAME_UPPER" else big)
            e.append(big if auto == "SAME_UPPER" else small)
        return b + e
    raise Unsupported(f"{node.op_type}: auto_pad={auto!r}")


def _axis(a: int, rank: int) -> int:
    if not -max(rank, 1) <= a < max(rank, 1):
        raise Unsupported(f"axis {a} out of range for rank {rank}")
    return a % rank if rank else 0


# -- convolution -------------------------------------------------------------------------------
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@_register("Conv")
def _conv(node: Node, graph: Graph) -> Kernel:
    xs, ws = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
    nd = len(xs) - 2
    if nd not in _CONV:
        raise Unsupported(f"Conv over {nd} spatial axes")
    k = tuple(_attr(node, "kernel_shape") or ws[2:])
    s = tuple(_attr(node, "strides") or [1] * nd)
    d = tuple(_attr(node, "dilations") or [1] * nd)
    groups = int(_attr(node, "group", 1))
    pads = _resolve_pads(node, xs[2:], k, s, d)
    fn = _CONV[nd]
    if pads[:nd] == pads[nd:]:
        padding, pre = tuple(pads[:nd]), None
    else:
        padding, pre = 0, _torch_pad(pads[:nd], pads[nd:])

    def conv(ins):
        x = ins[0]
        if pre is not None:
            x = F.pad(x, pre)
        b = ins[2] if len(ins) > 2 else None
        return [fn(x, ins[1], b, s, padding, d, groups)]

    return conv


@_register("ConvTranspose")
def _conv_transpose(node: Node, graph: Graph) -> Kernel:
    xs, ws = _shape(graph, node.inputs[0]), _shape(graph, node.inputs[1])
    nd = len(xs) - 2
    if nd not in _CONV_T:
        raise Unsupported(f"ConvTranspose over {nd} spatial axes")
    k = tuple(_attr(node, "kernel_shape") or ws[2:])
    s = tuple(_attr(node, "strides") or [1] * nd)
    d = tuple(_attr(node, "dilations") or [1] * nd)
    groups = int(_attr(node, "group", 1))
    op = [int(v) for v in (_attr(node, "output_padding") or [0] * nd)]
    auto = _attr(node, "auto_pad", "NOTSET") or "NOTSET"
    out_shape = _attr(node, "output_shape")
    if out_shape or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = list(out_shape)[-nd:] if out_shape else [xs[2 + i] * s[i] for i in range(nd)]
        b, e = [], []
        for i in range(nd):
            total = s[i] * (xs[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1 - target[i]
            if auto == "SAME_UPPER":
                b.append(total // 2), e.append(total - total // 2)
            else:
                b.append(total - total // 2), e.append(total // 2)
        pads = b + e
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    elif auto == "NOTSET":
        pads = [int(p) for p in (_attr(node, "pads") or [0] * (2 * nd))]
    else:
        raise Unsupported(f"ConvTranspose: auto_pad={auto!r}")
    if any(p < 0 for p in pads):
        raise Unsupported("ConvTranspose: negative pads")
    common = tuple(min(pads[i], pads[nd + i]) for i in range(nd))
    crop = [(pads[i] - common[i], pads[nd + i] - common[i]) for i in range(nd)]
    fn = _CONV_T[nd]
    op_t = tuple(op)
    index = None
    if any(c != (0, 0) for c in crop):
        index = (slice(None), slice(None)) + tuple(slice(cb, -ce if ce else None) for cb, ce in crop)

    def conv_transpose(ins):
        b = ins[2] if len(ins) > 2 else None
        y = fn(ins[0], ins[1], b, s, common, op_t, groups, d)
        if index is not None:
            y = y[index]
        return [y]

    return conv_transpose


# -- matrix products -------------------------------------------------------------------------
@_register("MatMul", _FI)
def _matmul(node, graph):
    return lambda ins: [torch.matmul(ins[0], ins[1])]


@_register("Gemm")
def _gemm(node, graph):
    alpha = float(_attr(node, "alpha", 1.0))
    beta = float(_attr(node, "beta", 1.0))
    ta, tb = int(_attr(node, "transA", 0)), int(_attr(node, "transB", 0))
    has_c = _has(node, 2)
    n_out = _out_shape(graph, node)[-1]
    if ta == 0 and tb == 1 and alpha == 1.0 and beta == 1.0 and (
        not has_c or _shape(graph, node.inputs[2]) == (n_out,)
    ):
        # the common Linear layer: oneDNN/MKL's fused GEMM + bias
        return lambda ins: [F.linear(ins[0], ins[1], ins[2] if has_c else None)]

    def gemm(ins):
        a = ins[0].t() if ta else ins[0]
        b = ins[1].t() if tb else ins[1]
        if has_c:
            return [torch.addmm(ins[2], a, b, beta=beta, alpha=alpha)]
        y = torch.mm(a, b)
        return [y * alpha if alpha != 1.0 else y]

    return gemm


@_register("Einsum", _FI)
def _einsum(node, graph):
    eq = _attr(node, "equation")
    return lambda ins: [torch.einsum(eq, *ins)]


# -- elementwise ---------------------------------------------------------------------------------
def _binary(name: str, fn, dtypes=_FI):
    _register(name, dtypes)(lambda node, graph: (lambda ins: [fn(ins[0], ins[1])]))


_binary("Add", torch.add)
_binary("Sub", torch.sub)
_binary("Mul", torch.mul)
_binary("Pow", torch.pow, _F)


@_register("Div", _FI)
def _div(node, graph):
    if graph.tensors[node.outputs[0]].elem_type in _I:
        return lambda ins: [torch.div(ins[0], ins[1], rounding_mode="trunc")]
    return lambda ins: [torch.div(ins[0], ins[1])]


@_register("Mod", _FI)
def _mod(node, graph):
    if int(_attr(node, "fmod", 0)):
        return lambda ins: [torch.fmod(ins[0], ins[1])]
    if graph.tensors[node.outputs[0]].elem_type not in _I:
        raise Unsupported("Mod with fmod=0 on floats")
    return lambda ins: [torch.remainder(ins[0], ins[1])]


def _variadic(name: str, fn, dtypes=_FI):
    def build(node, graph):
        def run(ins):
            y = ins[0]
            for t in ins[1:]:
                y = fn(y, t)
            return [y]

        return run

    _register(name, dtypes)(build)


_variadic("Sum", torch.add)
_variadic("Max", torch.maximum)
_variadic("Min", torch.minimum)


@_register("Mean")
def _mean(node, graph):
    n = len(node.inputs)

    def run(ins):
        y = ins[0]
        for t in ins[1:]:
            y = y + t
        return [y / n]

    return run


def _unary(name: str, fn, dtypes=_F):
    _register(name, dtypes)(lambda node, graph: (lambda ins: [fn(ins[0])]))


for _name, _fn in {
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Exp": torch.exp,
    "Log": torch.log,
    "Erf": torch.erf,
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "Tanh": torch.tanh,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Round": torch.round,  # round half to even, like ONNX
    "Softplus": F.softplus,
    "Softsign": F.softsign,
    "HardSwish": F.hardswish,
    "Mish": F.mish,
}.items():
    _unary(_name, _fn)
_unary("Neg", torch.neg, _FI)
_unary("Abs", torch.abs, _FI)
_unary("Sign", torch.sign, _FI)
_unary("Not", torch.logical_not, frozenset({BOOL}))


@_register("LeakyRelu")
def _leaky_relu(node, graph):
    a = float(_attr(node, "alpha", 0.01))
    return lambda ins: [F.leaky_relu(ins[0], a)]


@_register("Elu")
def _elu(node, graph):
    a = float(_attr(node, "alpha", 1.0))
    return lambda ins: [F.elu(ins[0], a)]


@_register("Selu")
def _selu(node, graph):
    a = float(_attr(node, "alpha", 1.67326319217681884765625))
    g = float(_attr(node, "gamma", 1.05070102214813232421875))
    return lambda ins: [g * torch.where(ins[0] > 0, ins[0], a * torch.expm1(ins[0]))]


@_register("PRelu")
def _prelu(node, graph):
    return lambda ins: [torch.where(ins[0] >= 0, ins[0], ins[0] * ins[1])]


@_register("HardSigmoid")
def _hard_sigmoid(node, graph):
    a = float(_attr(node, "alpha", 0.2))
    b = float(_attr(node, "beta", 0.5))
    return lambda ins: [torch.clamp(ins[0] * a + b, 0.0, 1.0)]


@_register("Gelu")
def _gelu(node, graph):
    approx = _attr(node, "approximate", "none") or "none"
    if approx not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approx!r}")
    return lambda ins: [F.gelu(ins[0], approximate=approx)]


@_register("Clip", _FI, free_inputs=(1, 2))
def _clip(node, graph):
    if opset_version(graph) < 11:
        lo, hi = _attr(node, "min"), _attr(node, "max")
    else:
        lo = _const(graph, node, 1, "min").item() if _has(node, 1) else None
        hi = _const(graph, node, 2, "max").item() if _has(node, 2) else None
    if graph.tensors[node.inputs[0]].elem_type in _I:
        lo = None if lo is None else int(lo)
        hi = None if hi is None else int(hi)
    else:
        lo = None if lo is None else float(lo)
        hi = None if hi is None else float(hi)
    if lo is None and hi is None:
        return lambda ins: [ins[0]]
    if lo is not None and hi is not None and lo > hi:
        raise Unsupported("Clip with min > max")
    return lambda ins: [torch.clamp(ins[0], lo, hi)]


# comparisons and logic
def _compare(name: str, fn):
    _register(name, _ANY, free_outputs=(0,))(lambda node, graph: (lambda ins: [fn(ins[0], ins[1])]))


_compare("Equal", torch.eq)
_compare("Less", torch.lt)
_compare("LessOrEqual", torch.le)
_compare("Greater", torch.gt)
_compare("GreaterOrEqual", torch.ge)
_binary("And", torch.logical_and, frozenset({BOOL}))
_binary("Or", torch.logical_or, frozenset({BOOL}))
_binary("Xor", torch.logical_xor, frozenset({BOOL}))


@_register("Where", _ANY, free_inputs=(0,))
def _where(node, graph):
    if graph.tensors[node.inputs[0]].elem_type != BOOL:
        raise Unsupported("Where condition must be bool")
    return lambda ins: [torch.where(ins[0], ins[1], ins[2])]


# -- softmax family ---------------------------------------------------------------------------
def _softmax_like(name: str, fn):
    def build(node, graph):
        shape = _shape(graph, node.inputs[0])
        rank = len(shape)
        if opset_version(graph) >= 13:
            axis = _axis(int(_attr(node, "axis", -1)), rank)
            return lambda ins: [fn(ins[0], axis)]
        # opset < 13: the input is coerced to 2-D at ``axis``
        axis = _axis(int(_attr(node, "axis", 1)), rank)
        rows = int(np.prod(shape[:axis], dtype=np.int64))
        return lambda ins: [fn(ins[0].reshape(rows, -1), 1).reshape(shape)]

    _register(name)(build)


_softmax_like("Softmax", lambda x, d: torch.softmax(x, d))
_softmax_like("LogSoftmax", lambda x, d: torch.log_softmax(x, d))


# -- normalisation --------------------------------------------------------------------------------
@_register("BatchNormalization")
def _batch_norm(node, graph):
    if int(_attr(node, "training_mode", 0)) or any(node.outputs[1:]):
        raise Unsupported("BatchNormalization in training mode")
    if len(_shape(graph, node.inputs[0])) < 2:
        raise Unsupported("BatchNormalization of a rank<2 tensor")
    eps = float(_attr(node, "epsilon", 1e-5))
    return lambda ins: [F.batch_norm(ins[0], ins[3], ins[4], ins[1], ins[2], False, 0.0, eps)]


@_register("LayerNormalization")
def _layer_norm(node, graph):
    xs = _shape(graph, node.inputs[0])
    rank = len(xs)
    axis = _axis(int(_attr(node, "axis", -1)), rank)
    eps = float(_attr(node, "epsilon", 1e-5))
    ns = tuple(xs[axis:])
    dims = tuple(range(axis, rank))
    exact = _shape(graph, node.inputs[1]) == ns and (not _has(node, 2) or _shape(graph, node.inputs[2]) == ns)
    has_b = _has(node, 2)
    extra = [bool(t) for t in node.outputs[1:]]

    def layer_norm(ins):
        x = ins[0]
        if exact:
            y = F.layer_norm(x, ns, ins[1], ins[2] if has_b else None, eps)
        else:
            y = F.layer_norm(x, ns, None, None, eps) * ins[1]
            if has_b:
                y = y + ins[2]
        outs = [y]
        if extra:
            mean = x.mean(dim=dims, keepdim=True)
            var = (x - mean).square().mean(dim=dims, keepdim=True)
            outs += [mean, torch.rsqrt(var + eps)][: len(extra)]
        return outs

    return layer_norm


@_register("InstanceNormalization")
def _instance_norm(node, graph):
    eps = float(_attr(node, "epsilon", 1e-5))
    return lambda ins: [F.instance_norm(ins[0], weight=ins[1], bias=ins[2], eps=eps)]


# -- pooling ---------------------------------------------------------------------------------------
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pool(kind: str):
    def build(node, graph):
        xs = _shape(graph, node.inputs[0])
        nd = len(xs) - 2
        if nd not in (1, 2, 3):
            raise Unsupported(f"{node.op_type} over {nd} spatial axes")
        k = tuple(int(v) for v in _attr(node, "kernel_shape"))
        s = tuple(int(v) for v in (_attr(node, "strides") or [1] * nd))
        d = tuple(int(v) for v in (_attr(node, "dilations") or [1] * nd))
        ceil = bool(_attr(node, "ceil_mode", 0))
        pads = _resolve_pads(node, xs[2:], k, s, d)
        if any(p < 0 for p in pads):
            raise Unsupported(f"{node.op_type}: negative pads")
        eff = [(k[i] - 1) * d[i] + 1 for i in range(nd)]
        native = pads[:nd] == pads[nd:] and all(pads[i] <= eff[i] // 2 for i in range(nd))
        if native:
            padding, pre = tuple(pads[:nd]), None
        else:
            padding, pre = 0, _torch_pad(pads[:nd], pads[nd:])
        if kind == "max":
            if len(node.outputs) > 1 and node.outputs[1]:
                raise Unsupported("MaxPool with an Indices output")
            if int(_attr(node, "storage_order", 0)):
                raise Unsupported("MaxPool storage_order=1")
            fn = _MAX_POOL[nd]

            def max_pool(ins):
                x = ins[0]
                if pre is not None:
                    x = F.pad(x, pre, value=float("-inf"))
                return [fn(x, k, s, padding, d, ceil)]

            return max_pool
        if any(v != 1 for v in d):
            raise Unsupported("AveragePool with dilations")
        cip = bool(_attr(node, "count_include_pad", 0))
        fn = _AVG_POOL[nd]
        if pre is None or cip:

            def avg_pool(ins):
                x = ins[0]
                if pre is not None:
                    x = F.pad(x, pre)
                return [fn(x, k, s, padding, ceil, cip)]

            return avg_pool
        spatial_ones = (1, 1) + tuple(xs[2:])

        def avg_pool_exclude_pad(ins):
            # asymmetric pads without counting them: divide by the pooled count of real elements
            x = F.pad(ins[0], pre)
            count = fn(F.pad(ins[0].new_ones(spatial_ones), pre), k, s, 0, ceil, True)
            return [fn(x, k, s, 0, ceil, True) / count]

        return avg_pool_exclude_pad

    return build


_register("MaxPool")(_pool("max"))
_register("AveragePool")(_pool("avg"))


@_register("GlobalAveragePool")
def _global_avg(node, graph):
    dims = tuple(range(2, len(_shape(graph, node.inputs[0]))))
    return lambda ins: [ins[0].mean(dim=dims, keepdim=True)]


@_register("GlobalMaxPool")
def _global_max(node, graph):
    dims = tuple(range(2, len(_shape(graph, node.inputs[0]))))
    return lambda ins: [ins[0].amax(dim=dims, keepdim=True)]


# -- reductions --------------------------------------------------------------------------------
def _reduce_axes(node, graph) -> tuple[int, ...] | None:
    """The reduced axes (sorted, non-negative), or None for the identity (empty axes with noop)."""
    rank = len(_shape(graph, node.inputs[0]))
    if _has(node, 1):
        axes = _ints(_const(graph, node, 1, "axes"))
    else:
        axes = tuple(int(a) for a in (_attr(node, "axes") or ()))
    if not axes:
        if int(_attr(node, "noop_with_empty_axes", 0)):
            return None
        return tuple(range(rank))
    return tuple(sorted({_axis(a, rank) for a in axes}))


def _reduction(name: str, fn, dtypes=_F):
    def build(node, graph):
        axes = _reduce_axes(node, graph)
        keep = bool(_attr(node, "keepdims", 1))
        if axes is None:
            return lambda ins: [ins[0]]
        if not axes:  # a rank-0 input
            return lambda ins: [fn(ins[0].reshape(1), (0,), False)]
        return lambda ins: [fn(ins[0], axes, keep)]

    _register(name, dtypes, free_inputs=(1,))(build)


def _prod(x, axes, keep):
    for a in reversed(axes):
        x = torch.prod(x, a, keepdim=keep)
    return x


_reduction("ReduceMean", lambda x, a, k: x.mean(dim=a, keepdim=k))
_reduction("ReduceSum", lambda x, a, k: x.sum(dim=a, keepdim=k), _FI)
_reduction("ReduceMax", lambda x, a, k: x.amax(dim=a, keepdim=k), _FI)
_reduction("ReduceMin", lambda x, a, k: x.amin(dim=a, keepdim=k), _FI)
_reduction("ReduceProd", _prod, _FI)
_reduction("ReduceL1", lambda x, a, k: x.abs().sum(dim=a, keepdim=k))
_reduction("ReduceL2", lambda x, a, k: torch.linalg.vector_norm(x, 2, dim=a, keepdim=k))
_reduction("ReduceSumSquare", lambda x, a, k: x.square().sum(dim=a, keepdim=k))
_reduction("ReduceLogSumExp", lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k))


def _arg_reduction(name: str, fn):
    def build(node, graph):
        rank = len(_shape(graph, node.inputs[0]))
        axis = _axis(int(_attr(node, "axis", 0)), rank)
        keep = bool(_attr(node, "keepdims", 1))
        if int(_attr(node, "select_last_index", 0)):
            raise Unsupported(f"{name} select_last_index=1")
        return lambda ins: [fn(ins[0], axis, keep)]

    _register(name, _FI, free_outputs=(0,))(build)


_arg_reduction("ArgMax", lambda x, a, k: torch.argmax(x, a, k))
_arg_reduction("ArgMin", lambda x, a, k: torch.argmin(x, a, k))


# -- shapes and data movement ----------------------------------------------------------------------
def _to_static_shape(node, graph):
    shape = _out_shape(graph, node)
    return lambda ins: [ins[0].reshape(shape)]


# the graph holds every output shape, so these are all reshapes to it (shape/axes inputs need not be constant)
for _name in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    _register(_name, _ANY, free_inputs=(1,))(_to_static_shape)


@_register("Identity", _ANY)
def _identity(node, graph):
    return lambda ins: [ins[0]]


@_register("Dropout", _ANY, free_inputs=(1, 2), free_outputs=(1,))
def _dropout(node, graph):
    if _has(node, 2):
        if node.inputs[2] not in graph.initializers or bool(constant_array(graph, node.inputs[2]).item()):
            raise Unsupported("Dropout in training mode (or with a non-constant training_mode)")
    if len(node.outputs) > 1 and node.outputs[1]:
        return lambda ins: [ins[0], torch.ones_like(ins[0], dtype=torch.bool)]
    return lambda ins: [ins[0]]


@_register("Transpose", _ANY)
def _transpose(node, graph):
    rank = len(_shape(graph, node.inputs[0]))
    perm = tuple(int(p) for p in (_attr(node, "perm") or range(rank - 1, -1, -1)))
    return lambda ins: [ins[0].permute(perm)]


@_register("Concat", _ANY)
def _concat(node, graph):
    rank = len(_shape(graph, node.inputs[0]))
    axis = _axis(int(_attr(node, "axis")), rank)
    return lambda ins: [torch.cat([t for t in ins if t is not None], dim=axis)]


@_register("Split", _ANY, free_inputs=(1,))
def _split(node, graph):
    rank = len(_shape(graph, node.inputs[0]))
    axis = _axis(int(_attr(node, "axis", 0)), rank)
    sizes = [_shape(graph, t)[axis] for t in node.outputs]
    return lambda ins: list(torch.split(ins[0], sizes, dim=axis))


@_register("Slice", _ANY, free_inputs=(1, 2, 3, 4))
def _slice(node, graph):
    xs = _shape(graph, node.inputs[0])
    rank = len(xs)
    if opset_version(graph) < 10:
        starts = list(_attr(node, "starts"))
        ends = list(_attr(node, "ends"))
        axes = list(_attr(node, "axes") or range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts = list(_ints(_const(graph, node, 1, "starts")))
        ends = list(_ints(_const(graph, node, 2, "ends")))
        axes = list(_ints(_const(graph, node, 3, "axes"))) if _has(node, 3) else list(range(len(starts)))
        steps = list(_ints(_const(graph, node, 4, "steps"))) if _has(node, 4) else [1] * len(starts)
    index: list[slice] = [slice(None)] * rank
    flips: list[int] = []
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _axis(ax, rank)
        if sp == 0:
            raise Unsupported("Slice step 0")
        r = range(*slice(st, en, sp).indices(xs[ax]))
        if sp > 0:
            index[ax] = slice(r.start, max(r.start, r.stop), sp)
        else:
            # x[s], x[s+sp], ... (sp < 0) is flip(x)[d-1-s :: -sp]
            n = len(r)
            j0 = xs[ax] - 1 - r.start if n else 0
            index[ax] = slice(j0, j0 + (n - 1) * (-sp) + 1 if n else j0, -sp)
            flips.append(ax)
    idx = tuple(index)
    flip_dims = tuple(flips)

    def slice_(ins):
        x = ins[0]
        if flip_dims:
            x = torch.flip(x, flip_dims)
        return [x[idx]]

    return slice_


@_register("Gather", _ANY, free_inputs=(1,))
def _gather(node, graph):
    xs = _shape(graph, node.inputs[0])
    rank = len(xs)
    axis = _axis(int(_attr(node, "axis", 0)), rank)
    if graph.tensors[node.inputs[1]].elem_type not in _I:
        raise Unsupported("Gather indices must be int64/int32")
    out = _out_shape(graph, node)
    dim = xs[axis]
    name = node.inputs[1]
    if name in graph.initializers:
        idx = constant_array(graph, name)
        if idx.ndim == 0:
            i = int(idx) % dim if dim else 0
            return lambda ins: [ins[0].select(axis, i)]
        nonneg = bool((idx >= 0).all())
    else:
        nonneg = False

    def gather(ins):
        i = ins[1].reshape(-1)
        if i.dtype != torch.int64:
            i = i.long()
        if not nonneg:
            i = torch.where(i < 0, i + dim, i)
        return [ins[0].index_select(axis, i).reshape(out)]

    return gather


@_register("GatherElements", _ANY, free_inputs=(1,))
def _gather_elements(node, graph):
    rank = len(_shape(graph, node.inputs[0]))
    axis = _axis(int(_attr(node, "axis", 0)), rank)
    dim = _shape(graph, node.inputs[0])[axis]

    def gather_elements(ins):
        i = ins[1].long()
        return [torch.gather(ins[0], axis, torch.where(i < 0, i + dim, i))]

    return gather_elements


@_register("Expand", _ANY, free_inputs=(1,))
def _expand(node, graph):
    shape = _out_shape(graph, node)
    return lambda ins: [ins[0].expand(shape)]


@_register("Tile", _ANY, free_inputs=(1,))
def _tile(node, graph):
    xs, out = _shape(graph, node.inputs[0]), _out_shape(graph, node)
    if any(a == 0 for a in xs):
        raise Unsupported("Tile of an empty tensor")
    reps = tuple(o // a for o, a in zip(out, xs))
    return lambda ins: [ins[0].repeat(reps)]


@_register("Cast", _ANY)
def _cast(node, graph):
    to = int(_attr(node, "to"))
    if to not in TORCH_DTYPES or to not in _ANY:
        raise Unsupported(f"Cast to {onnx.TensorProto.DataType.Name(to)}")
    dt = TORCH_DTYPES[to]
    return lambda ins: [ins[0].to(dt)]


@_register("Shape", _ANY, free_inputs=(0,), free_outputs=(0,))
def _shape_op(node, graph):
    xs = _shape(graph, node.inputs[0])
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    value = list(xs[slice(start, end)])
    return lambda ins: [torch.tensor(value, dtype=torch.int64, device=ins[0].device)]


@_register("Size", _ANY, free_inputs=(0,), free_outputs=(0,))
def _size_op(node, graph):
    n = graph.tensors[node.inputs[0]].numel
    return lambda ins: [torch.tensor(n, dtype=torch.int64, device=ins[0].device)]


@_register("ConstantOfShape", _ANY, free_inputs=(0,))
def _constant_of_shape(node, graph):
    shape = _out_shape(graph, node)
    value = node.attributes.get("value")
    arr = onnx.numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    et = graph.tensors[node.outputs[0]].elem_type
    dt = TORCH_DTYPES[et]
    v = arr[0].item()
    return lambda ins: [torch.full(shape, v, dtype=dt, device=ins[0].device)]


@_register("Range", _FI)
def _range(node, graph):
    start = _const(graph, node, 0, "start").item()
    limit = _const(graph, node, 1, "limit").item()
    delta = _const(graph, node, 2, "delta").item()
    dt = TORCH_DTYPES[graph.tensors[node.outputs[0]].elem_type]
    n = max(int(math.ceil((limit - start) / delta)), 0)
    values = [start + i * delta for i in range(n)]
    return lambda ins: [torch.tensor(values, dtype=dt, device=ins[0].device)]


@_register("Pad", _ANY, free_inputs=(1, 2, 3))
def _pad(node, graph):
    xs = _shape(graph, node.inputs[0])
    rank = len(xs)
    mode = _attr(node, "mode", "constant") or "constant"
    if opset_version(graph) < 11:
        pads = [int(p) for p in _attr(node, "pads")]
        value = float(_attr(node, "value", 0.0))
        axes = list(range(rank))
    else:
        pads = list(_ints(_const(graph, node, 1, "pads")))
        value = _const(graph, node, 2, "constant_value").item() if _has(node, 2) else 0
        axes = [_axis(a, rank) for a in _ints(_const(graph, node, 3, "axes"))] if _has(node, 3) else list(range(rank))
    n = len(axes)
    if len(pads) != 2 * n:
        raise Unsupported(f"Pad: {len(pads)} pads for {n} axes")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[n + i]
    used = [a for a in range(rank) if begin[a] or end[a]]
    if not used:
        return lambda ins: [ins[0]]
    first = min(used)
    tp = _torch_pad(begin[first:], end[first:])
    if mode == "constant":
        return lambda ins: [F.pad(ins[0], tp, value=value)]
    if mode not in ("reflect", "edge"):
        raise Unsupported(f"Pad mode {mode!r}")
    # torch's reflect/replicate pad the last k <= 3 axes of an input of rank k+1 or k+2
    k = max(rank - first, rank - 2)
    if any(p < 0 for p in pads) or k > 3 or k < 1:
        raise Unsupported(f"Pad mode {mode!r} on these axes")
    tmode = "reflect" if mode == "reflect" else "replicate"
    tp = _torch_pad(begin[rank - k :], end[rank - k :])
    return lambda ins: [F.pad(ins[0], tp, mode=tmode)]


@_register("Resize", _F, free_inputs=(1, 2, 3))
def _resize(node, graph):
    xs, out = _shape(graph, node.inputs[0]), _out_shape(graph, node)
    nd = len(xs) - 2
    if nd not in (1, 2, 3) or out[:2] != xs[:2]:
        raise Unsupported("Resize of anything but the spatial axes of an N,C,... tensor")
    if int(_attr(node, "antialias", 0)) or _attr(node, "axes") or int(_attr(node, "exclude_outside", 0)):
        raise Unsupported("Resize with antialias/axes/exclude_outside")
    mode = _attr(node, "mode", "nearest") or "nearest"
    ctm = _attr(node, "coordinate_transformation_mode", "half_pixel") or "half_pixel"
    nearest = _attr(node, "nearest_mode", "round_prefer_floor") or "round_prefer_floor"
    scales = None
    if _has(node, 2):
        sc = _const(graph, node, 2, "scales")
        if sc.size:
            scales = tuple(float(v) for v in sc.reshape(-1)[2:])
    if _has(node, 3) and node.inputs[3] not in graph.initializers:
        raise Unsupported("Resize: the sizes input must be a constant")
    size = tuple(out[2:])
    if mode == "nearest":
        if ctm != "asymmetric" or nearest != "floor":
            raise Unsupported(f"Resize nearest with {ctm}/{nearest}")
        kw = dict(mode="nearest")
    elif mode == "linear":
        if ctm == "align_corners":
            kw = dict(mode={1: "linear", 2: "bilinear", 3: "trilinear"}[nd], align_corners=True)
        elif ctm == "half_pixel" or (ctm == "pytorch_half_pixel" and all(o > 1 for o in size)):
            kw = dict(mode={1: "linear", 2: "bilinear", 3: "trilinear"}[nd], align_corners=False)
        else:
            raise Unsupported(f"Resize linear with {ctm}")
    else:
        raise Unsupported(f"Resize mode {mode!r}")
    if scales is not None and kw.get("align_corners") is not True:
        # ONNX maps coordinates with 1/scale; so does torch given scale_factor (not recomputed)
        return lambda ins: [F.interpolate(ins[0], scale_factor=scales, recompute_scale_factor=False, **kw)]
    return lambda ins: [F.interpolate(ins[0], size=size, **kw)]


# -- support check -------------------------------------------------------------------------------------
_SUPPORT_CACHE: "weakref.WeakKeyDictionary[Graph, dict[int, str | None]]" = weakref.WeakKeyDictionary()


def unsupported_reason(graph: Graph, node: Node) -> str | None:
    """None when the mapping can run ``node``; otherwise why not, in one line."""
    cache = _SUPPORT_CACHE.setdefault(graph, {})
    if node.index < len(graph.nodes) and graph.nodes[node.index] is node:
        if node.index not in cache:
            cache[node.index] = _check(graph, node)
        return cache[node.index]
    return _check(graph, node)


def supported(graph: Graph, node: Node) -> bool:
    """Can the mapping run ``node`` (op, dtypes, attributes, constant shape-like inputs)?"""
    return unsupported_reason(graph, node) is None


def _check(graph: Graph, node: Node) -> str | None:
    if node.domain not in ("", "ai.onnx"):
        return f"{node.domain}::{node.op_type} is not in the default ONNX domain"
    spec = SPECS.get(node.op_type)
    if spec is None:
        return f"{node.op_type} is not mapped to torch"
    for k, t in enumerate(node.inputs):
        if t and k not in spec.free_inputs and graph.tensors[t].elem_type not in spec.dtypes:
            return f"{node.op_type}: input {k} has dtype {_dtype_name(graph.tensors[t].elem_type)}"
    for k, t in enumerate(node.outputs):
        if t and k not in spec.free_outputs and graph.tensors[t].elem_type not in spec.dtypes:
            return f"{node.op_type}: output {k} has dtype {_dtype_name(graph.tensors[t].elem_type)}"
    for t in list(node.inputs) + list(node.outputs):
        if t and graph.tensors[t].elem_type not in TORCH_DTYPES:
            return f"{node.op_type}: dtype {_dtype_name(graph.tensors[t].elem_type)} has no torch equivalent"
    try:
        kernel = spec.build(node, graph)
    except Unsupported as e:
        return str(e)
    except Exception as e:  # a malformed attribute etc.
        return f"{node.op_type}: {type(e).__name__}: {e}"
    # the closure on meta tensors must give exactly the shapes and dtypes the graph records
    try:
        with torch.inference_mode():
            outs = kernel([_meta(graph, t) for t in node.inputs])
    except Exception as e:
        first = (str(e).splitlines() or [""])[0][:200]
        return f"{node.op_type}: the torch mapping fails on these shapes ({type(e).__name__}: {first})"
    names = list(node.outputs)
    if len(outs) < len([t for t in names if t]):
        return f"{node.op_type}: the mapping returned {len(outs)} outputs"
    for t, y in zip(names, outs):
        if not t:
            continue
        info = graph.tensors[t]
        if tuple(y.shape) != tuple(info.shape) or y.dtype != TORCH_DTYPES[info.elem_type]:
            return (
                f"{node.op_type}: the mapping gives {tuple(y.shape)}/{y.dtype} for {t!r}, "
                f"the graph says {tuple(info.shape)}/{TORCH_DTYPES[info.elem_type]}"
            )
    return None


def _meta(graph: Graph, name: str) -> Tensor | None:
    if not name:
        return None
    info = graph.tensors[name]
    return torch.empty(info.shape, dtype=TORCH_DTYPES[info.elem_type], device="meta")


def _dtype_name(et: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(et).lower()
    except ValueError:
        return str(et)


def build(node: Node, graph: Graph) -> Kernel:
    """The kernel ``inputs -> outputs`` for ``node``; raises BackendError when it is unsupported."""
    reason = unsupported_reason(graph, node)
    if reason is not None:
        raise BackendError(f"node {node.name!r} ({node.op_type}) cannot run on torch: {reason}")
    return SPECS[node.op_type].build(node, graph)


# -- programs ------------------------------------------------------------------------------------------
_PROGRAM_IDS = itertools.count()


class TorchProgram:
    """A SubGraph as straight-line Python over torch tensors.

    The weights (the subgraph's constants) are converted to contiguous torch
    tensors on ``device`` once (the inputs must be on that device too; kernels
    that create tensors put them next to their inputs). :attr:`fn` is a generated function with one positional
    argument per ``sg.inputs`` entry; it calls one kernel per node in
    topological order, drops each intermediate after its last use, and returns
    the ``sg.outputs`` as a list. :meth:`forward` calls it.

    :meth:`module` gives the same program as a ``torch.nn.Module`` whose
    buffers are the weights, for ``torch.compile`` (Inductor's freezing treats
    a module's buffers as constants: it folds them and prepacks convolution
    weights). Every program generates its own code objects, so dynamo caches
    and guards each program separately instead of piling recompilations (and
    its recompile limit) onto one shared ``forward``.
    """

    def __init__(self, sg: SubGraph, device: str | torch.device = "cpu"):
        g = sg.graph
        bad = [(n, unsupported_reason(g, n)) for n in sg.nodes]
        bad = [(n, r) for n, r in bad if r is not None]
        if bad:
            n, r = bad[0]
            more = f" (and {len(bad) - 1} more unsupported node(s))" if len(bad) > 1 else ""
            raise BackendError(f"torch cannot run node {n.name!r} ({n.op_type}): {r}{more}")
        self.subgraph = sg
        self.input_names: tuple[str, ...] = tuple(sg.inputs)
        self.output_names: tuple[str, ...] = tuple(sg.outputs)
        self.device = torch.device(device)
        self.constants: dict[str, Tensor] = {
            name: torch.from_numpy(np.array(constant_array(g, name), copy=True, order="C")).to(self.device).contiguous()
            for name in sg.constants
        }
        self.input_infos = tuple(g.tensors[t] for t in self.input_names)
        self._id = next(_PROGRAM_IDS)
        self._kernels: dict[str, Kernel] = {}
        self._body = self._generate_body(sg)
        self.fn: Callable[..., list] = self._define(self._params(), "", dict(self._const_vars()))
        self._module: torch.nn.Module | None = None

    def _const_vars(self) -> list[tuple[str, Tensor]]:
        return [(f"c{i}", t) for i, t in enumerate(self.constants.values())]

    def _params(self) -> str:
        return ", ".join(f"x{i}" for i in range(len(self.input_names)))

    def _generate_body(self, sg: SubGraph) -> list[str]:
        g = sg.graph
        var: dict[str, str] = {name: f"x{i}" for i, name in enumerate(self.input_names)}
        var.update({name: f"c{i}" for i, name in enumerate(self.constants)})
        nodes = sg.nodes
        last_use: dict[str, int] = {}
        for i, n in enumerate(nodes):
            for t in n.inputs:
                if t:
                    last_use[t] = i
        keep = set(self.output_names) | set(self.constants)
        lines: list[str] = []
        counter = itertools.count()
        for i, n in enumerate(nodes):
            self._kernels[f"k{i}"] = SPECS[n.op_type].build(n, g)
            args = ", ".join(var[t] if t else "None" for t in n.inputs)
            lines.append(f"    # {n.op_type} {n.name!r}")
            produced = [(k, t) for k, t in enumerate(n.outputs) if t]
            for t in n.outputs:
                if t:
                    var[t] = f"v{next(counter)}"
            if len(produced) == 1:
                k, t = produced[0]
                lines.append(f"    {var[t]} = k{i}([{args}])[{k}]")
            else:
                lines.append(f"    _o = k{i}([{args}])")
                lines += [f"    {var[t]} = _o[{k}]" for k, t in produced]
                lines.append("    del _o")
            dead = {var[t] for t in n.inputs if t and last_use.get(t) == i and t not in keep}
            dead |= {var[t] for t in n.outputs if t and t not in last_use and t not in keep}
            if dead:
                lines.append(f"    del {', '.join(sorted(dead))}")
        lines.append(f"    return [{', '.join(var[t] for t in self.output_names)}]")
        return lines

    def _define(self, params: str, prologue: str, scope: dict) -> Callable[..., list]:
        src = f"def forward({params}):\n{prologue}" + "\n".join(self._body) + "\n"
        filename = f"<collage_ml.torch_program {self._id} {self.subgraph.hash[:12]}{' module' if prologue else ''}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        scope = {**scope, **self._kernels}
        exec(compile(src, filename, "exec"), scope)
        if not prologue:
            self.source = src
        return scope["forward"]  # type: ignore[return-value]

    def module(self) -> torch.nn.Module:
        """The program as an ``nn.Module`` (weights as buffers ``c0, c1, ...``), built once."""
        if self._module is None:
            consts = self._const_vars()
            prologue = "".join(f"    {c} = self.{c}\n" for c, _ in consts)
            params = "self" + (", " + self._params() if self.input_names else "")
            fwd = self._define(params, prologue, {})
            cls = type("TorchProgramModule", (torch.nn.Module,), {"forward": fwd, "__module__": __name__})
            mod = cls()
            for c, t in consts:
                mod.register_buffer(c, t)
            self._module = mod.eval()
        return self._module

    def forward(self, *inputs: Tensor) -> list[Tensor]:
        if len(inputs) != len(self.input_names):
            raise BackendError(f"expected {len(self.input_names)} input(s) {list(self.input_names)}, got {len(inputs)}")
        return self.fn(*inputs)

    __call__ = forward

    def example_inputs(self, seed: int = 0) -> list[Tensor]:
        """Random inputs of the right shapes and dtypes on the program's device.

        Floats are standard normal, bools coin flips, integers zero (valid indices).
        """
        gen = torch.Generator().manual_seed(seed)
        out = []
        for info in self.input_infos:
            dt = TORCH_DTYPES[info.elem_type]
            if dt.is_floating_point:
                out.append(torch.randn(info.shape, generator=gen, dtype=dt))
            elif dt == torch.bool:
                out.append(torch.randint(0, 2, info.shape, generator=gen).bool())
            else:
                out.append(torch.zeros(info.shape, dtype=dt))
        return [t.to(self.device) for t in out]


def to_torch(x) -> Tensor:
    """A backend input (numpy array, torch tensor or any DLPack-capable tensor) as a torch tensor."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        if not x.flags.writeable:
            x = x.copy()
        return torch.from_numpy(x)
    if hasattr(x, "__dlpack__"):
        return torch.from_dlpack(x)
    return torch.from_numpy(np.array(x))
