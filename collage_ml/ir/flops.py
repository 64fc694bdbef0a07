"""Per-node floating-point operation counts (a multiply-add counts as 2 FLOPs).

These are analytic estimates for the featurizers and ``inspect``: exact for
Conv/ConvTranspose/MatMul/Gemm, one FLOP per output element for elementwise
ops, per input element for reductions and normalisations, and zero for pure
data movement (Reshape, Transpose, Concat, ...).
"""

from __future__ import annotations

import numpy as np

from collage_ml.ir.graph import Graph, Node

DATA_MOVEMENT = frozenset(
    "Reshape Transpose Concat Split Slice Gather Squeeze Unsqueeze Flatten Identity Shape Expand Cast "
    "Pad Tile ConstantOfShape Range Where".split()
)
# roughly how many FLOPs one output element of these ops costs
ELEMENTWISE_COST = {"Sigmoid": 4, "Tanh": 4, "Erf": 4, "Exp": 2, "Gelu": 8, "Softmax": 5, "LogSoftmax": 5, "Div": 1, "Sqrt": 1}
NORMALISATION = frozenset("BatchNormalization LayerNormalization InstanceNormalization GroupNormalization".split())
REDUCTION = frozenset("ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd GlobalAveragePool GlobalMaxPool".split())


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def node_flops(graph: Graph, node: Node) -> int:
    t = graph.tensors
    op = node.op_type
    outs = [t[o] for o in node.outputs if o]
    ins = [t[i] if i else None for i in node.inputs]
    out_numel = sum(o.numel for o in outs)
    if op in ("Conv", "ConvTranspose") and ins[1] is not None:
        w = ins[1].shape  # Conv: [M, C/g, k...]; ConvTranspose: [C, M/g, k...]
        kernel = _numel(w[2:])
        if op == "Conv":
            macs = outs[0].numel * w[1] * kernel
        else:
            macs = ins[0].numel * w[1] * kernel
        bias = outs[0].numel if len(ins) > 2 and ins[2] is not None else 0
        return int(2 * macs + bias)
    if op in ("MatMul", "Gemm"):
        a = ins[0].shape
        if op == "Gemm":
            k = a[0] if node.attributes.get("transA", 0) else a[-1]
        else:
            k = a[-1] if len(a) else 1
        return int(2 * outs[0].numel * k + (outs[0].numel if op == "Gemm" and len(ins) > 2 else 0))
    if op in ("MaxPool", "AveragePool"):
        kernel = _numel(node.attributes.get("kernel_shape", [1]))
        return int(outs[0].numel * kernel)
    if op in REDUCTION or op in NORMALISATION:
        return int((ins[0].numel if ins[0] is not None else out_numel) * (2 if op in NORMALISATION else 1))
    if op in DATA_MOVEMENT:
        return 0
    return int(out_numel * ELEMENTWISE_COST.get(op, 1))


def node_bytes(graph: Graph, node: Node) -> tuple[int, int]:
    """(bytes read, bytes written) by one node, counting every input once, weights included."""
    t = graph.tensors
    read = sum(t[i].nbytes for i in dict.fromkeys(node.inputs) if i)
    written = sum(t[o].nbytes for o in node.outputs if o)
    return read, written
