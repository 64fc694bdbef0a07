"""The graph IR: an immutable DAG over ONNX nodes, and convex SubGraphs of it.

A :class:`Graph` wraps a shape-inferred ``onnx.ModelProto``. Every tensor has a
static shape and dtype (``TensorInfo``); initializers are kept as constants and
are not graph inputs. Nodes are stored in topological order, and node sets are
represented as Python ``int`` bitsets over node indices, which makes the
convexity checks and the DP's state cheap.

A :class:`SubGraph` is a convex node set of a Graph. Its structural hash covers
op types, attributes, shapes and dtypes, and the wiring between nodes, but not
node or tensor names nor the values of weights, so an identical block repeated
in a model (or across models) hashes the same.

The reference run behind :meth:`Graph.reference` (the whole model on ONNX
Runtime, every tensor captured) lives in :mod:`collage_ml.ir.reference`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from collage_ml.errors import ModelError
from collage_ml.ir.reference import run_reference, seeded_inputs


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's static type: ``shape`` is a tuple of ints, ``elem_type`` an ONNX TensorProto enum."""

    name: str
    shape: tuple[int, ...]
    elem_type: int

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type))

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def value_info(self, name: str | None = None) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name or self.name, self.elem_type, list(self.shape))

    def type_key(self) -> str:
        return f"{self.elem_type}:{'x'.join(map(str, self.shape))}"


@dataclass(frozen=True)
class Node:
    """One ONNX node. ``inputs``/``outputs`` are tensor names; ``''`` marks an omitted optional input."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    proto: onnx.NodeProto = field(repr=False, compare=False)

    @cached_property
    def attributes(self) -> dict[str, object]:
        return {a.name: helper.get_attribute_value(a) for a in self.proto.attribute}

    @cached_property
    def attr_key(self) -> bytes:
        """Attributes serialised canonically (sorted by name, without doc strings)."""
        parts = []
        for a in sorted(self.proto.attribute, key=lambda a: a.name):
            a2 = onnx.AttributeProto()
            a2.CopyFrom(a)
            a2.ClearField("doc_string")
            parts.append(a2.SerializeToString(deterministic=True))
        return b"|".join(parts)


def _bits(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask


def iter_bits(mask: int) -> Iterable[int]:
    """Yields the set bit positions of ``mask`` in increasing order."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class Graph:
    """An immutable, shape-annotated DAG over the nodes of an ONNX model.

    Build it with :func:`collage_ml.ir.import_model` (or :meth:`from_onnx` for a
    model that already has every shape inferred).
    """

    def __init__(self, model: onnx.ModelProto, tensors: Mapping[str, TensorInfo], name: str = "model"):
        self.name = name
        self.model = model
        g = model.graph
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
        self.input_names: tuple[str, ...] = tuple(i.name for i in g.input if i.name not in self.initializers)
        self.output_names: tuple[str, ...] = tuple(o.name for o in g.output)
        self.tensors: dict[str, TensorInfo] = dict(tensors)
        for n, t in self.initializers.items():
            self.tensors.setdefault(n, TensorInfo(n, tuple(t.dims), t.data_type))
        missing = [
            t
            for nd in g.node
            for t in list(nd.input) + list(nd.output)
            if t and t not in self.tensors
        ]
        if missing:
            raise ModelError(f"tensor {missing[0]!r} has no static shape/dtype after inference")
        self.nodes: tuple[Node, ...] = tuple(
            Node(i, nd.name or f"{nd.op_type}_{i}", nd.op_type, nd.domain, tuple(nd.input), tuple(nd.output), nd)
            for i, nd in enumerate(_toposort(g))
        )
        self.producer: dict[str, int] = {t: n.index for n in self.nodes for t in n.outputs if t}
        consumers: dict[str, list[int]] = {}
        for n in self.nodes:
            for t in dict.fromkeys(n.inputs):
                if t:
                    consumers.setdefault(t, []).append(n.index)
        self.consumers: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in consumers.items()}
        self.preds: tuple[frozenset[int], ...] = tuple(
            frozenset(self.producer[t] for t in n.inputs if t in self.producer) for n in self.nodes
        )
        self.succs: tuple[frozenset[int], ...] = tuple(
            frozenset(c for t in n.outputs for c in self.consumers.get(t, ())) for n in self.nodes
        )
        self.opset_imports = tuple(model.opset_import)
        self._reference_cache: dict[int, dict[str, np.ndarray]] = {}
        #: what the importer changed to make the model searchable (IR version, opset, folded constants...)
        self.import_notes: list[str] = []

    # -- structure -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={list(self.input_names)})"

    @cached_property
    def pred_mask(self) -> tuple[int, ...]:
        return tuple(_bits(p) for p in self.preds)

    @cached_property
    def succ_mask(self) -> tuple[int, ...]:
        return tuple(_bits(s) for s in self.succs)

    @cached_property
    def descendants(self) -> tuple[int, ...]:
        """``descendants[i]``: bitset of nodes reachable from node ``i`` (excluding ``i``)."""
        desc = [0] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            m = 0
            for s in self.succs[i]:
                m |= (1 << s) | desc[s]
            desc[i] = m
        return tuple(desc)

    @cached_property
    def ancestors(self) -> tuple[int, ...]:
        anc = [0] * len(self.nodes)
        for i in range(len(self.nodes)):
            m = 0
            for p in self.preds[i]:
                m |= (1 << p) | anc[p]
            anc[i] = m
        return tuple(anc)

    @property
    def all_mask(self) -> int:
        return (1 << len(self.nodes)) - 1

    def is_convex(self, mask: int) -> bool:
        """True when no path leaves the node set ``mask`` and comes back into it."""
        down = 0
        for i in iter_bits(mask):
            down |= self.descendants[i]
        outside = down & ~mask
        if not outside:
            return True
        up = 0
        for i in iter_bits(mask):
            up |= self.ancestors[i]
        # a node outside the set that is both below and above the set breaks convexity
        return not (outside & up)

    def is_connected(self, mask: int) -> bool:
        """Weak connectivity of the node set (edges taken in both directions)."""
        if not mask:
            return False
        start = mask & -mask
        seen = start
        frontier = start
        while frontier:
            nxt = 0
            for i in iter_bits(frontier):
                nxt |= self.pred_mask[i] | self.succ_mask[i]
            nxt &= mask & ~seen
            seen |= nxt
            frontier = nxt
        return seen == mask

    def subgraph(self, nodes: Iterable[int] | int) -> "SubGraph":
        """A SubGraph over node indices (or a bitset). Raises ValueError when not convex."""
        return SubGraph(self, nodes if isinstance(nodes, int) else _bits(nodes))

    def whole(self) -> "SubGraph":
        return SubGraph(self, self.all_mask)

    # -- summaries -----------------------------------------------------------------
    def op_histogram(self) -> dict[str, int]:
        return dict(Counter(n.op_type for n in self.nodes).most_common())

    def flops(self) -> int:
        from collage_ml.ir.flops import node_flops

        return sum(node_flops(self, n) for n in self.nodes)

    def param_bytes(self) -> int:
        return sum(self.tensors[n].nbytes for n in self.initializers)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "nodes": len(self.nodes),
            "flops": self.flops(),
            "param_bytes": self.param_bytes(),
            "inputs": {n: list(self.tensors[n].shape) for n in self.input_names},
            "outputs": {n: list(self.tensors[n].shape) for n in self.output_names},
            "op_histogram": self.op_histogram(),
        }

    # -- reference activations (collage_ml.ir.reference) -------------------------------
    def example_inputs(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs: standard normal for floats, integers in [0, 10) for ints, coin flips for bools."""
        return seeded_inputs(self, seed)

    def reference(self, inputs: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
        """Runs the whole model on onnxruntime and returns every tensor by name.

        The result holds the graph inputs, every intermediate tensor and the
        outputs. With ``inputs=None`` the seeded :meth:`example_inputs` are used
        and the result is cached per seed.
        """
        if inputs is None and seed in self._reference_cache:
            return self._reference_cache[seed]
        result = run_reference(self, dict(inputs) if inputs is not None else self.example_inputs(seed))
        if inputs is None:
            self._reference_cache[seed] = result
        return result


def _toposort(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Stable topological sort (Kahn's algorithm, original order as tie-break)."""
    produced_by: dict[str, int] = {}
    for i, nd in enumerate(g.node):
        for t in nd.output:
            if t:
                produced_by[t] = i
    indeg = [0] * len(g.node)
    users: list[list[int]] = [[] for _ in g.node]
    for i, nd in enumerate(g.node):
        deps = {produced_by[t] for t in nd.input if t in produced_by}
        indeg[i] = len(deps)
        for d in deps:
            users[d].append(i)
    import heapq

    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(g.node[i])
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(g.node):
        raise ModelError("the ONNX graph has a cycle")
    return order


class SubGraph:
    """A convex set of nodes of a :class:`Graph`.

    ``mask`` is a bitset over node indices. ``inputs`` are the boundary tensors
    it reads (produced outside it and not constants), ``outputs`` the tensors it
    produces that are read outside it or are graph outputs. Both are in a
    canonical order (order of first use/definition in topological order).
    """

    def __init__(self, graph: Graph, mask: int):
        if mask <= 0 or mask > graph.all_mask:
            raise ValueError("empty or out-of-range node set")
        if not graph.is_convex(mask):
            raise ValueError("node set is not convex")
        self.graph = graph
        self.mask = mask

    @cached_property
    def node_indices(self) -> tuple[int, ...]:
        return tuple(iter_bits(self.mask))

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self.graph.nodes[i] for i in self.node_indices)

    def __len__(self) -> int:
        return len(self.node_indices)

    def __repr__(self) -> str:
        ops = ",".join(n.op_type for n in self.nodes[:4]) + ("..." if len(self) > 4 else "")
        return f"SubGraph({len(self)} nodes [{ops}], hash={self.hash[:12]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubGraph) and other.graph is self.graph and other.mask == self.mask

    def __hash__(self) -> int:
        return hash((id(self.graph), self.mask))

    @cached_property
    def inputs(self) -> tuple[str, ...]:
        g = self.graph
        produced = {t for n in self.nodes for t in n.outputs}
        seen: dict[str, None] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t and t not in produced and t not in g.initializers:
                    seen.setdefault(t, None)
        return tuple(seen)

    @cached_property
    def constants(self) -> tuple[str, ...]:
        g = self.graph
        seen: dict[str, None] = {}
        for n in self.nodes:
            for t in n.inputs:
                if t in g.initializers:
                    seen.setdefault(t, None)
        return tuple(seen)

    @cached_property
    def outputs(self) -> tuple[str, ...]:
        g = self.graph
        graph_outs = set(g.output_names)
        out = []
        for n in self.nodes:
            for t in n.outputs:
                if not t:
                    continue
                if t in graph_outs or any(not (self.mask >> c) & 1 for c in g.consumers.get(t, ())):
                    out.append(t)
        return tuple(out)

    # -- structural hash -------------------------------------------------------------
    @cached_property
    def hash(self) -> str:
        """A structural hash: op types, attributes, shapes, dtypes and wiring; not names or weight values.

        Each node gets an "upstream" label computed in topological order from
        its own signature and, per input slot, the label of the producing node
        and output index (or the type of a boundary input or constant), and a
        "downstream" label from its consumers. The hash is that of the sorted
        multiset of node labels plus the boundary outputs' labels, so it does
        not depend on node order or naming.
        """
        g = self.graph
        tensors = g.tensors
        mask = self.mask
        local_out: dict[str, tuple[int, int]] = {}
        up: dict[int, bytes] = {}
        for i in self.node_indices:
            n = g.nodes[i]
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{n.domain}::{n.op_type}|".encode())
            h.update(n.attr_key)
            for t in n.inputs:
                if not t:
                    h.update(b"|none")
                elif t in local_out:
                    p, k = local_out[t]
                    h.update(b"|in:" + up[p] + str(k).encode())
                elif t in g.initializers:
                    h.update(f"|const:{tensors[t].type_key()}".encode())
                else:
                    h.update(f"|ext:{tensors[t].type_key()}".encode())
            for t in n.outputs:
                h.update(f"|out:{tensors[t].type_key() if t else 'none'}".encode())
            up[i] = h.digest()
            for k, t in enumerate(n.outputs):
                if t:
                    local_out[t] = (i, k)
        down: dict[int, bytes] = {}
        outs = set(self.outputs)
        for i in reversed(self.node_indices):
            n = g.nodes[i]
            h = hashlib.blake2b(up[i], digest_size=16)
            for k, t in enumerate(n.outputs):
                uses = sorted(
                    down[c] + str(g.nodes[c].inputs.index(t)).encode()
                    for c in g.consumers.get(t, ())
                    if (mask >> c) & 1
                )
                h.update(f"|o{k}:{int(t in outs)}:".encode() + b",".join(uses))
            down[i] = h.digest()
        total = hashlib.blake2b(digest_size=20)
        for label in sorted(down.values()):
            total.update(label)
        return total.hexdigest()

    # -- export ------------------------------------------------------------------------
    def to_onnx(self, check: bool = True) -> onnx.ModelProto:
        """A standalone ONNX model: boundary tensors become its inputs and outputs; used weights travel with it."""
        g = self.graph
        graph = helper.make_graph(
            [n.proto for n in self.nodes],
            f"{g.name}_sub_{self.hash[:10]}",
            [g.tensors[t].value_info() for t in self.inputs],
            [g.tensors[t].value_info() for t in self.outputs],
            initializer=[g.initializers[t] for t in self.constants],
            value_info=[
                g.tensors[t].value_info()
                for n in self.nodes
                for t in n.outputs
                if t and t not in set(self.outputs)
            ],
        )
        model = helper.make_model(graph, opset_imports=list(g.opset_imports), producer_name="collage-ml")
        model.ir_version = g.model.ir_version
        if check:
            onnx.checker.check_model(model)
        return model

    def skeleton_onnx(self, keep_bytes: int = 4096) -> bytes:
        """The subgraph as ONNX bytes without its large weights, for the database.

        Constants up to ``keep_bytes`` (shapes, axes, small biases) keep their
        values, since they carry meaning; larger ones become graph inputs, and
        their names are listed in the metadata entry ``collage_ml.weights``.
        The structural hash ignores weight values, so nothing a featurizer
        needs is lost.
        """
        g = self.graph
        model = self.to_onnx(check=False)
        big = [t for t in model.graph.initializer if g.tensors[t.name].nbytes > keep_bytes]
        if big:
            names = [t.name for t in big]
            keep = [t for t in model.graph.initializer if t.name not in set(names)]
            del model.graph.initializer[:]
            model.graph.initializer.extend(keep)
            model.graph.input.extend(g.tensors[n].value_info() for n in names)
            model.metadata_props.add(key="collage_ml.weights", value=",".join(names))
        return model.SerializeToString()

    def reference_io(self, reference: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Splits a :meth:`Graph.reference` result into this subgraph's feeds and expected outputs."""
        return ({t: reference[t] for t in self.inputs}, {t: reference[t] for t in self.outputs})


def constant_array(graph: Graph, name: str) -> np.ndarray:
    """The value of an initializer as a numpy array."""
    return numpy_helper.to_array(graph.initializers[name])
