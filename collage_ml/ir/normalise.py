"""What :func:`collage_ml.ir.from_onnx` does to a model before it becomes a Graph.

So that every emitted subgraph passes the checker and runs on the reference:
local functions are inlined and control flow refused (:func:`check_supported`);
initializers listed among the graph inputs become constants and the IR
version is raised to at least 4 (:func:`normalise_ir`); input shapes are
pinned (:func:`pin_inputs`); ``Constant`` nodes and constant subexpressions
become initializers, unused initializers go, nodes are sorted and every
tensor's static type is inferred, or observed on onnxruntime where inference
leaves it unknown (:func:`normalise`); and an old default-domain opset is
converted when the converted model gives the same outputs
(:func:`convert_opset`). Each change is noted for ``Graph.import_notes``.
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from collage_ml.errors import ModelError, UnsupportedModelError, first_line
from collage_ml.ir.graph import TensorInfo, _toposort
from collage_ml.ir.reference import run_onnx

#: models below this default-domain opset are converted to :data:`TARGET_OPSET` with ``onnx.version_converter``:
#: their ops include forms the backends' converters (torch's mapping, TVM) lack or handle poorly (opset-9
#: ``Upsample``, attribute-form ``Slice`` and ``Pad``); from opset 11 on the backends handle the file's own opset
CONVERT_BELOW_OPSET = 11
TARGET_OPSET = 13
#: constant subexpressions are folded into initializers only up to this many bytes of results
FOLD_MAX_BYTES = 256 << 20
#: ops folded when every input is a constant: generators of weights and shape/data-movement ops, as old
#: exporters wrote them (ConstantOfShape biases, Concat-ed Resize scales). Arithmetic on constants (e.g. a
#: Gemm of a constant initial state) stays a node, as it always was, so zoo graphs keep their shape
_FOLDABLE = frozenset(
    """ConstantOfShape Concat Shape Size Gather Unsqueeze Squeeze Reshape Flatten Cast Range Slice Identity
    Expand Tile Transpose Split""".split()
)



def normalise(m: onnx.ModelProto, notes: list[str]) -> tuple[onnx.ModelProto, dict[str, TensorInfo]]:
    """Folds constants, sorts nodes, infers and records every tensor's static type."""
    _fold_constant_nodes(m)
    ordered = _toposort(m.graph)  # the checker wants sorted nodes; ONNX files need not be
    if [tuple(n.output) for n in ordered] != [tuple(n.output) for n in m.graph.node]:
        notes.append("nodes sorted topologically")
    del m.graph.node[:]
    m.graph.node.extend(ordered)
    _fold_constant_subexpressions(m, notes)
    _drop_unused_initializers(m, notes)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception as e:
        raise ModelError(f"ONNX shape inference failed: {first_line(e)}") from None
    tensors = _static_types(m)
    needed = [t for nd in m.graph.node for t in nd.output if t and t not in tensors]
    needed += [o.name for o in m.graph.output if o.name not in tensors]
    if needed:
        tensors.update(_observe_types(m, tensors, needed))
    # record the full static types in the model, so SubGraph.to_onnx and backends see them
    _write_value_info(m, tensors)
    return m, tensors


def normalise_ir(m: onnx.ModelProto, notes: list[str]) -> None:
    """Initializers listed as graph inputs are constants: they leave the inputs; the IR version becomes >= 4.

    Before IR version 4 every initializer had to be a graph input too, so a
    subgraph emitted with the old IR version and a weight fails the checker.
    From IR 4 on, an initializer that is also an input is a default value;
    collage-ml has always treated it as a constant, and now says so in the file.
    """
    inits = {t.name for t in m.graph.initializer}
    listed = [vi for vi in m.graph.input if vi.name in inits]
    if listed:
        keep = [vi for vi in m.graph.input if vi.name not in inits]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        notes.append(f"{len(listed)} initializer(s) listed as graph inputs are constants (removed from the inputs)")
    if m.ir_version < 4:
        notes.append(f"IR version {m.ir_version} -> 4")
        m.ir_version = 4


def default_opset(m: onnx.ModelProto) -> int | None:
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return None


def convert_opset(
    m: onnx.ModelProto, opset: int, notes: list[str]
) -> tuple[onnx.ModelProto, dict[str, TensorInfo]] | None:
    """``m`` converted to :data:`TARGET_OPSET`, re-normalised, when it gives the same outputs; else None."""
    from onnx import version_converter

    before = Counter(n.op_type for n in m.graph.node)
    try:
        c = version_converter.convert_version(m, TARGET_OPSET)
        if c.ir_version < m.ir_version:
            c.ir_version = m.ir_version
        sub: list[str] = []
        c, tensors = normalise(c, sub)
        onnx.checker.check_model(c)
        why = _same_outputs(m, c)
    except Exception as e:
        notes.append(f"opset {opset} kept: onnx.version_converter to {TARGET_OPSET} failed ({first_line(e, 160)})")
        return None
    if why:
        notes.append(f"opset {opset} kept: the model converted to opset {TARGET_OPSET} {why}")
        return None
    after = Counter(n.op_type for n in c.graph.node)
    changed = sorted(set(before) ^ set(after))
    notes.append(f"opset {opset} -> {TARGET_OPSET} (onnx.version_converter"
                 + (f"; ops now {', '.join(f'{k}:{before.get(k, 0)}->{after.get(k, 0)}' for k in changed)})"
                    if changed else ")"))
    return c, tensors


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto) -> str | None:
    """None when ``a`` and ``b`` give the same outputs on onnxruntime for seeded inputs; else why not."""
    feeds = _seeded_feeds(a)
    if set(_seeded_feeds(b)) != set(feeds):
        return "has other inputs"
    names = [o.name for o in a.graph.output]
    if [o.name for o in b.graph.output] != names:
        return "has other outputs"
    ra = run_onnx(a, feeds, names)
    rb = run_onnx(b, feeds, names)
    for n in names:
        x, y = np.asarray(ra[n]), np.asarray(rb[n])
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"gives {n!r} as {y.dtype}{list(y.shape)}, not {x.dtype}{list(x.shape)}"
        if not np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
            return f"gives other values for {n!r}"
    return None


def _seeded_feeds(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        shape = [int(d) for d in _dims(vi)]
        feeds[vi.name] = (rng.standard_normal(shape).astype(dt) if np.issubdtype(dt, np.floating)
                          else rng.integers(0, 2 if dt == np.bool_ else 10, shape).astype(dt))
    return feeds


def _fold_constant_subexpressions(m: onnx.ModelProto, notes: list[str]) -> None:
    """Nodes whose every input is a constant (e.g. ``ConstantOfShape`` making a bias) become initializers.

    Only :data:`_FOLDABLE` ops fold; they are evaluated once on onnxruntime.
    Nodes producing a graph output stay.
    """
    const = {t.name for t in m.graph.initializer}
    outs = {o.name for o in m.graph.output}
    fold, rest = [], []
    for nd in m.graph.node:  # sorted: a chain of constant nodes folds in one pass
        if (nd.domain in ("", "ai.onnx") and nd.op_type in _FOLDABLE and nd.input
                and all(not t or t in const for t in nd.input) and not any(t in outs for t in nd.output)
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in nd.attribute)):
            fold.append(nd)
            const.update(t for t in nd.output if t)
        else:
            rest.append(nd)
    if not fold:
        return
    made = {t for nd in fold for t in nd.output if t}
    wanted = list(dict.fromkeys(t for nd in rest for t in nd.input if t in made))
    if not wanted:
        values = {}
    else:
        sub = helper.make_model(
            helper.make_graph(fold, "fold", [], [onnx.ValueInfoProto(name=t) for t in wanted],
                              initializer=list(m.graph.initializer)),
            opset_imports=list(m.opset_import),
        )
        sub.ir_version = max(m.ir_version, 4)
        try:
            values = run_onnx(sub, {}, wanted)
        except Exception as e:
            notes.append(f"{len(fold)} constant node(s) left unfolded: onnxruntime could not evaluate them "
                         f"({first_line(e, 160)})")
            return
        if sum(np.asarray(v).nbytes for v in values.values()) > FOLD_MAX_BYTES:
            notes.append(f"{len(fold)} constant node(s) left unfolded: their results exceed {FOLD_MAX_BYTES >> 20} MiB")
            return
    for t in wanted:
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(values[t]), t))
    del m.graph.node[:]
    m.graph.node.extend(rest)
    ops = Counter(nd.op_type for nd in fold)
    notes.append(f"{len(fold)} constant node(s) folded into initializers ("
                 + ", ".join(f"{k} x{v}" for k, v in ops.most_common()) + ")")


def _drop_unused_initializers(m: onnx.ModelProto, notes: list[str]) -> None:
    used = {t for nd in m.graph.node for t in nd.input} | {o.name for o in m.graph.output}
    keep = [t for t in m.graph.initializer if t.name in used]
    if len(keep) != len(m.graph.initializer):
        notes.append(f"{len(m.graph.initializer) - len(keep)} initializer(s) that no node reads dropped")
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)


def check_supported(m: onnx.ModelProto) -> None:
    if not m.graph.node:
        raise ModelError("the ONNX model has no nodes")
    if m.functions:
        # local functions (e.g. from older exporters) are inlined so every node is a plain op
        from onnx import inliner

        m.CopyFrom(inliner.inline_local_functions(m))
    for nd in m.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in nd.attribute):
            raise UnsupportedModelError(
                f"node {nd.name or nd.op_type!r} ({nd.op_type}) has a subgraph; control flow is not supported"
            )


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]


def pin_inputs(m: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    inits = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in inits]
    unknown = set(shapes) - set(names)
    if unknown:
        raise ModelError(f"input_shapes names unknown input(s) {sorted(unknown)}; the inputs are {names}")
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"input {vi.name!r} is not a tensor (sequences and maps are not supported)")
        if vi.name in shapes:
            new = [int(d) for d in shapes[vi.name]]
            if any(d <= 0 for d in new):
                raise ModelError(f"input_shapes[{vi.name!r}] = {new}: dimensions must be positive")
            tt.ClearField("shape")
            for d in new:
                tt.shape.dim.add().dim_value = d
            continue
        dims = _dims(vi)
        if not tt.HasField("shape") or any(not isinstance(d, int) or d <= 0 for d in dims):
            shown = [d if isinstance(d, int) and d > 0 else (d or "?") for d in dims] if tt.HasField("shape") else "unknown rank"
            raise UnsupportedModelError(
                f"input {vi.name!r} has a dynamic shape {shown}; pin it with input_shapes={{{vi.name!r}: [...]}} "
                f"(CLI: --input-shape {vi.name}=1,3,224,224)"
            )


def _fold_constant_nodes(m: onnx.ModelProto) -> None:
    """Turns ``Constant`` nodes into initializers, so every node is a real operator."""
    keep = []
    for nd in m.graph.node:
        if nd.op_type == "Constant" and nd.domain in ("", "ai.onnx") and len(nd.attribute) == 1:
            a = nd.attribute[0]
            if a.name == "value":
                t = onnx.TensorProto()
                t.CopyFrom(a.t)
            elif a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                val = helper.get_attribute_value(a)
                dtype = np.float32 if "float" in a.name else np.int64
                t = numpy_helper.from_array(np.array(val, dtype=dtype))
            else:
                keep.append(nd)
                continue
            t.name = nd.output[0]
            m.graph.initializer.append(t)
            continue
        keep.append(nd)
    if len(keep) != len(m.graph.node):
        del m.graph.node[:]
        m.graph.node.extend(keep)


def _static_types(m: onnx.ModelProto) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        if not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if tt.elem_type == 0 or not tt.HasField("shape"):
            continue
        dims = _dims(vi)
        if all(isinstance(d, int) and d > 0 for d in dims) or not dims:
            out[vi.name] = TensorInfo(vi.name, tuple(int(d) for d in dims), tt.elem_type)
    return out


def _observe_types(m: onnx.ModelProto, known: Mapping[str, TensorInfo], names: list[str]) -> dict[str, TensorInfo]:
    """Runs the model once on onnxruntime to read the shapes static inference left unknown."""
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    rng = np.random.default_rng(0)
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        t = known.get(vi.name) or TensorInfo(vi.name, tuple(_dims(vi)), vi.type.tensor_type.elem_type)
        dt = t.dtype
        feeds[vi.name] = (
            rng.standard_normal(t.shape).astype(dt) if np.issubdtype(dt, np.floating) else np.zeros(t.shape, dt)
        )
    try:
        values = run_onnx(m, feeds, names)
    except Exception as e:
        raise UnsupportedModelError(
            f"could not resolve the shapes of {len(names)} tensor(s) (e.g. {names[0]!r}): "
            f"onnxruntime failed to run the model: {first_line(e)}"
        ) from None
    return {
        n: TensorInfo(n, tuple(v.shape), helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype))
        for n, v in values.items()
    }


def _write_value_info(m: onnx.ModelProto, tensors: Mapping[str, TensorInfo]) -> None:
    inits = {t.name for t in m.graph.initializer}
    io_names = {vi.name for vi in m.graph.input} | {vi.name for vi in m.graph.output}
    del m.graph.value_info[:]
    for nd in m.graph.node:
        for t in nd.output:
            if t and t not in io_names and t not in inits:
                m.graph.value_info.append(tensors[t].value_info())
    for vi in m.graph.output:
        if vi.name in tensors:
            vi.CopyFrom(tensors[vi.name].value_info())
