"""Model import: zoo names, ONNX files or protos, and ``torch.nn.Module`` -> :class:`Graph`.

Shapes come from ``onnx.shape_inference`` (with data propagation). Where it
leaves a tensor's shape or dtype unknown, the model is run once on onnxruntime
and the observed shapes are used; that needs every graph input to have a static
shape, so inputs with symbolic dimensions must be pinned with ``input_shapes``.

Torch modules go through ``torch.onnx.export(..., dynamo=True)``. It is the
exporter that works best here: its graphs import into TVM's Relax ONNX
frontend (the legacy TorchScript exporter emits a BERT graph that TVM rejects
with a ``ConstantOfShape``/``broadcast_to`` error) and it folds BatchNorm and
constants. Should it fail on a module, the legacy exporter is tried before
giving up.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from collage_ml.errors import ModelError, UnsupportedModelError, first_line
from collage_ml.ir.graph import Graph, TensorInfo, _toposort, run_onnx


def cache_dir() -> Path:
    """Where exported zoo models are cached (``$COLLAGE_ML_CACHE`` or ``~/.cache/collage-ml``)."""
    return Path(os.environ.get("COLLAGE_ML_CACHE", Path.home() / ".cache" / "collage-ml"))


def import_model(
    model: Any,
    example_inputs: Sequence[Any] | None = None,
    *,
    batch: int = 1,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
) -> Graph:
    """Imports ``model`` as a :class:`Graph`.

    ``model`` is a zoo name (``"resnet50"``, ``"bert-tiny"``), a path to an
    ``.onnx`` file, an ``onnx.ModelProto``, or a ``torch.nn.Module`` together
    with ``example_inputs``. ``batch`` applies to zoo models only;
    ``input_shapes`` pins symbolic input dimensions of an ONNX model.
    """
    if isinstance(model, onnx.ModelProto):
        return from_onnx(model, input_shapes=input_shapes, name=name or model.graph.name or "model")
    if isinstance(model, (str, os.PathLike)):
        s = os.fspath(model)
        if s.endswith(".onnx") or os.path.sep in s or os.path.exists(s):
            return from_onnx(load_onnx_file(s), input_shapes=input_shapes, name=name or Path(s).stem)
        from collage_ml.ir import zoo

        zoo.get(s)  # raises UnknownModelError with suggestions
        return from_onnx(zoo_onnx(s, batch=batch), name=name or s)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ModelError("a torch.nn.Module needs example_inputs, e.g. import_model(m, (torch.randn(1, 3, 224, 224),))")
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        return from_onnx(export_torch(model, tuple(example_inputs)), name=name or type(model).__name__)
    raise ModelError(
        f"cannot import a {type(model).__name__}: expected a zoo name, an .onnx path, "
        "an onnx.ModelProto, or a torch.nn.Module with example inputs"
    )


def load_onnx_file(path: str | os.PathLike) -> onnx.ModelProto:
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if p.is_dir():
        raise ModelError(f"{p}: is a directory, not an ONNX file")
    try:
        model = onnx.load(str(p))
    except Exception as e:  # protobuf raises DecodeError, onnx raises various
        raise ModelError(f"{p}: not a readable ONNX model ({type(e).__name__}: {first_line(e)})") from None
    if not model.graph.node:
        raise ModelError(f"{p}: not a readable ONNX model (it has no nodes; truncated or not ONNX?)")
    return model


def export_torch(module: Any, example_inputs: tuple) -> onnx.ModelProto:
    """Exports a torch module with the dynamo exporter (legacy exporter as fallback)."""
    import torch

    # the exporter warns about every torchvision op it cannot register; torchvision is not used here
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    module = module.eval()
    errors = []
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            prog = torch.onnx.export(module, example_inputs, dynamo=True, verbose=False)
            return prog.model_proto
        except Exception as e:
            errors.append(f"dynamo exporter: {first_line(e)}")
        try:
            buf = io.BytesIO()
            torch.onnx.export(module, example_inputs, buf, dynamo=False, opset_version=17)
            return onnx.load_from_string(buf.getvalue())
        except Exception as e:
            errors.append(f"legacy exporter: {first_line(e)}")
    raise ModelError(f"could not export {type(module).__name__} to ONNX ({'; '.join(errors)})")


def zoo_onnx(name: str, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    """The ONNX export of a zoo model, cached on disk keyed by the builder's source and torch version."""
    import torch

    from collage_ml.ir import zoo

    entry = zoo.get(name)  # raises UnknownModelError with suggestions
    key = hashlib.sha256(
        f"{name}|{batch}|{seed}|{torch.__version__}|{onnx.__version__}|{_zoo_source_digest()}".encode()
    ).hexdigest()[:16]
    path = cache_dir() / "zoo" / f"{name}-b{batch}-s{seed}-{key}.onnx"
    if path.exists():
        try:
            return onnx.load(str(path))
        except Exception:
            path.unlink(missing_ok=True)
    module, inputs = entry.build(batch=batch, seed=seed)
    model = export_torch(module, inputs)
    model.graph.name = name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        onnx.save(model, str(tmp))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs time
    return model


def _zoo_source_digest() -> str:
    """A digest of the zoo's source files, so a changed builder invalidates cached exports."""
    h = hashlib.sha256()
    for p in sorted((Path(__file__).parent / "zoo").glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def from_onnx(
    model: onnx.ModelProto, *, input_shapes: Mapping[str, Sequence[int]] | None = None, name: str = "model"
) -> Graph:
    """Builds a Graph from an ONNX model: pins inputs, folds ``Constant`` nodes, infers every shape."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _check_supported(m)
    if input_shapes:
        _pin_inputs(m, input_shapes)
        # shapes recorded for the old input shapes are stale now
        del m.graph.value_info[:]
        for vi in m.graph.output:
            for d in vi.type.tensor_type.shape.dim:
                d.Clear()
    else:
        _pin_inputs(m, {})
    _fold_constant_nodes(m)
    ordered = _toposort(m.graph)  # the checker wants sorted nodes; ONNX files need not be
    del m.graph.node[:]
    m.graph.node.extend(ordered)
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
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        raise ModelError(f"invalid ONNX model: {first_line(e)}") from None
    return Graph(m, tensors, name=name)


def _check_supported(m: onnx.ModelProto) -> None:
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


def _pin_inputs(m: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
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
