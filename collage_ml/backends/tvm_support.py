"""What the ``tvm`` backend runs: the static per-op checks behind :meth:`TVMBackend.supports`.

A node is declined before any probe when its domain, op, element types or
(for indexing ops) constant indices rule it out, or when TVM's ONNX frontend
has no converter for it at the model's opset. The probe itself (import and
legalise the node alone) is :meth:`TVMBackend._probe_node`, keyed by
:func:`io_key`.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from collage_ml.ir.graph import Graph, Node, constant_array

#: element types TVM's ONNX frontend and LLVM codegen handle well on CPU (no fp16/bf16/quantised types)
SUPPORTED_ELEM_TYPES = frozenset(
    {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL}
)
#: ops in the convert map that are not worth the risk: data-dependent output shapes, randomness,
#: control flow and sequence/optional types
DENIED_OPS = frozenset(
    {
        "If", "Loop", "Scan", "NonZero", "Unique", "Compress", "NonMaxSuppression",
        "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
        "Optional", "OptionalHasElement", "OptionalGetElement",
        "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceAt",
        "SequenceLength", "ConcatFromSequence", "SplitToSequence",
    }
)
#: ops that index with their second input; TVM's kernels do not bound-check (``take`` runs in "fast"
#: mode and segfaults on an out-of-range index), so the indices must be constants, checked here
INDEXING_OPS = frozenset({"Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Scatter"})
#: ops that accept a Shape op's result, which the frontend keeps as a Relax ShapeExpr (its list in
#: ``ONNXGraphImporter._construct_nodes``); any other consumer fails with "cannot handle ShapeExpr inputs"
SHAPE_CONSUMERS = frozenset(
    {"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand", "Concat", "Equal",
     "Where", "Cast", "CastLike", "Squeeze"}
)
#: relax ops that may stay after LegalizeOps (the VM runs them as builtins)
BUILTIN_OPS = frozenset({"relax.call_tir", "relax.shape_of", "relax.null_value", "relax.call_pure_packed"})


def constant_indices_in_range(graph: Graph, node: Node) -> bool:
    """An indexing op's indices are a constant and in range (TVM's kernels do not bound-check)."""
    if len(node.inputs) < 2 or node.inputs[1] not in graph.initializers:
        return False
    idx = constant_array(graph, node.inputs[1])
    data = graph.tensors[node.inputs[0]].shape
    if node.op_type in ("Gather", "GatherElements", "ScatterElements", "Scatter"):
        axis = int(node.attributes.get("axis", 0))
        if not -len(data) <= axis < len(data):
            return False
        n = data[axis]
        return bool(idx.size == 0 or (idx.min() >= -n and idx.max() < n))
    # GatherND / ScatterND: the last index dimension addresses the leading data dimensions
    if int(node.attributes.get("batch_dims", 0)) != 0 or idx.ndim == 0 or idx.shape[-1] > len(data):
        return False
    if idx.size == 0:
        return True
    lim = np.array(data[: idx.shape[-1]]).reshape((1,) * (idx.ndim - 1) + (-1,))
    return bool(np.all(idx >= -lim) and np.all(idx < lim))


def io_key(graph: Graph, node: Node) -> tuple:
    """What the probe's result depends on besides op, opset and attributes: input and output types, and
    the values of small constants."""
    parts = []
    for t in node.inputs:
        if not t:
            parts.append("-")
            continue
        ti = graph.tensors[t]
        if t in graph.initializers and ti.numel <= 64:
            # small constants (shapes, axes, pads) change what the converter does
            parts.append(("c", ti.type_key(), graph.initializers[t].SerializeToString()))
        else:
            parts.append(("c" if t in graph.initializers else "x", ti.type_key()))
    parts.extend(graph.tensors[t].type_key() for t in node.outputs if t)
    return tuple(parts)
