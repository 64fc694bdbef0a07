"""What both featurizers read from a subgraph, computed once per structural hash.

:class:`SubgraphInfo` is a compact, backend-independent description of a
subgraph: per node its op slot, FLOPs, bytes read and written, output size,
conv and matmul geometry, and the internal edges. It is built either from a
live :class:`~collage_ml.ir.graph.SubGraph` (during placement) or from the
skeleton ONNX bytes the database stores (:func:`info_from_onnx`), so old
measurements can be featurized again. Both paths give the same numbers,
because the skeleton carries every shape.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from collage_ml.featurize.schema import OP_INDEX, OTHER_OP
from collage_ml.ir.flops import node_bytes, node_flops
from collage_ml.ir.graph import Graph, SubGraph, TensorInfo

#: per-node numeric columns of :attr:`SubgraphInfo.node_values`
NODE_COLUMNS = (
    "flops",
    "bytes_read",
    "bytes_written",
    "out_numel",
    "out_rank",
    "kernel",  # product of the kernel shape (conv, pool)
    "stride",  # largest stride
    "groups",
    "m",  # matmul/gemm output rows (batch folded in)
    "n",  # output columns
    "k",  # reduction length
    "weight_bytes",  # bytes of constant inputs (weights)
)
_COL = {c: i for i, c in enumerate(NODE_COLUMNS)}


@dataclass(frozen=True)
class SubgraphInfo:
    hash: str
    ops: np.ndarray  # int16 [n] op slots
    node_values: np.ndarray  # float64 [n, len(NODE_COLUMNS)]
    edges: np.ndarray  # int64 [2, e] internal producer -> consumer edges (local indices)
    is_input_fed: np.ndarray  # bool [n]: reads a boundary input
    is_output: np.ndarray  # bool [n]: produces a boundary output
    depth: int  # nodes on the longest path
    in_bytes: tuple[int, ...]  # boundary inputs, bytes each
    out_bytes: tuple[int, ...]  # boundary outputs, bytes each

    @property
    def n_nodes(self) -> int:
        return int(self.ops.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edges.shape[1])

    def column(self, name: str) -> np.ndarray:
        return self.node_values[:, _COL[name]]


def _geometry(graph: Graph, node) -> tuple[float, float, float, float, float, float]:
    """(kernel, stride, groups, m, n, k); zeros where the op has none."""
    op = node.op_type
    t = graph.tensors
    a = node.attributes if op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "Gemm") else {}
    if op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool"):
        ks = a.get("kernel_shape")
        if ks is None and op in ("Conv", "ConvTranspose") and len(node.inputs) > 1 and node.inputs[1]:
            ks = t[node.inputs[1]].shape[2:]
        kernel = float(np.prod(ks)) if ks else 1.0
        strides = a.get("strides") or [1]
        return kernel, float(max(strides)), float(a.get("group", 1)), 0.0, 0.0, 0.0
    if op in ("MatMul", "Gemm") and len(node.inputs) >= 2 and node.inputs[0] and node.inputs[1]:
        x, w = t[node.inputs[0]].shape, t[node.inputs[1]].shape
        if op == "Gemm":
            m = x[1] if a.get("transA", 0) else x[0]
            k = x[0] if a.get("transA", 0) else x[1]
            n = w[0] if a.get("transB", 0) else w[1]
        else:
            k = x[-1] if x else 1
            n = w[-1] if len(w) >= 2 else 1
            out = t[node.outputs[0]]
            m = out.numel // max(n, 1)
        return 0.0, 0.0, 0.0, float(m), float(n), float(k)
    return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0


def compute_info(sg: SubGraph) -> SubgraphInfo:
    g = sg.graph
    nodes = sg.nodes
    local = {n.index: i for i, n in enumerate(nodes)}
    n = len(nodes)
    ops = np.fromiter((OP_INDEX.get(nd.op_type, OTHER_OP) for nd in nodes), dtype=np.int16, count=n)
    vals = np.zeros((n, len(NODE_COLUMNS)), dtype=np.float64)
    inputs = set(sg.inputs)
    outputs = set(sg.outputs)
    fed = np.zeros(n, dtype=bool)
    outp = np.zeros(n, dtype=bool)
    src: list[int] = []
    dst: list[int] = []
    depth = [1] * n
    for i, nd in enumerate(nodes):
        r, w = node_bytes(g, nd)
        outs = [g.tensors[o] for o in nd.outputs if o]
        out_numel = sum(o.numel for o in outs)
        rank = len(outs[0].shape) if outs else 0
        weight = sum(g.tensors[x].nbytes for x in dict.fromkeys(nd.inputs) if x in g.initializers)
        kernel, stride, groups, m, nn, k = _geometry(g, nd)
        vals[i] = (node_flops(g, nd), r, w, out_numel, rank, kernel, stride, groups, m, nn, k, weight)
        fed[i] = any(x in inputs for x in nd.inputs)
        outp[i] = any(o in outputs for o in nd.outputs)
        for p in sorted(g.preds[nd.index]):
            j = local.get(p)
            if j is not None:
                src.append(j)
                dst.append(i)
                depth[i] = max(depth[i], depth[j] + 1)  # nodes are in topological order
    edges = np.array([src, dst], dtype=np.int64).reshape(2, -1)
    return SubgraphInfo(
        hash=sg.hash,
        ops=ops,
        node_values=vals,
        edges=edges,
        is_input_fed=fed,
        is_output=outp,
        depth=max(depth) if n else 0,
        in_bytes=tuple(g.tensors[t].nbytes for t in sg.inputs),
        out_bytes=tuple(g.tensors[t].nbytes for t in sg.outputs),
    )


class _LRU(OrderedDict):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def get_or(self, key, make):
        v = self.get(key)
        if v is None:
            v = make()
            self[key] = v
            if len(self) > self.size:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return v


_CACHE = _LRU(50_000)


def subgraph_info(sg: SubGraph) -> SubgraphInfo:
    """The (cached) info of a live subgraph."""
    return _CACHE.get_or(sg.hash, lambda: compute_info(sg))


def _shape_of(vi) -> TensorInfo | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return TensorInfo(vi.name, tuple(dims), tt.elem_type)


def subgraph_from_onnx(data: bytes) -> SubGraph:
    """The whole-graph SubGraph of a stored (skeleton) subgraph ONNX model.

    Raises ``ValueError`` naming the problem if the bytes do not parse or a
    tensor lacks a static shape.
    """
    import onnx

    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ValueError(f"stored subgraph is not valid ONNX ({type(e).__name__})") from None
    g = model.graph
    tensors: dict[str, TensorInfo] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        ti = _shape_of(vi)
        if ti is not None:
            tensors[vi.name] = ti
    # Graph() also records initializers; a missing shape raises ModelError there
    graph = Graph(model, tensors, name=g.name or "stored")
    weights = next((p.value for p in model.metadata_props if p.key == "collage_ml.weights"), "")
    if weights:
        # weights stripped from the skeleton are graph inputs now; count them as constants again
        names = set(weights.split(","))
        graph.input_names = tuple(n for n in graph.input_names if n not in names)
        for name in names:
            if name in graph.tensors and name not in graph.initializers:
                ti = graph.tensors[name]
                graph.initializers[name] = _placeholder_initializer(ti)
    return graph.whole()


def _placeholder_initializer(ti: TensorInfo):
    """An initializer proto carrying only name, dims and dtype (no data), so the structure matches the live graph."""
    import onnx

    t = onnx.TensorProto()
    t.name = ti.name
    t.dims.extend(ti.shape)
    t.data_type = ti.elem_type
    return t


def info_from_onnx(data: bytes, expected_hash: str | None = None) -> SubgraphInfo:
    """The info of a stored subgraph. ``expected_hash`` (the DB key) names the cache entry."""
    sg = subgraph_from_onnx(data)
    info = compute_info(sg)
    if expected_hash is not None and expected_hash != info.hash:
        info = SubgraphInfo(**{**info.__dict__, "hash": expected_hash})
    return info
