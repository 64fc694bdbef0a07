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

What :func:`from_onnx` changes to make a model searchable (IR version,
constants, opset, shapes) is in :mod:`collage_ml.ir.normalise`.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx

from collage_ml.errors import CollageError, ModelError, describe, first_line
from collage_ml.ir.graph import Graph
from collage_ml.ir.normalise import (
    CONVERT_BELOW_OPSET, check_supported, convert_opset, default_opset, normalise, normalise_ir, pin_inputs,
)
from collage_ml.paths import cache_dir


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
    """Builds a Graph from an ONNX model: normalises it, pins inputs, folds constants, infers every shape.

    What the search needs is normalised here, so every emitted subgraph passes
    the checker and runs on the reference: initializers listed among the graph
    inputs (IR version 3 requires that) are constants and leave the input list,
    and the IR version is raised to at least 4; ``Constant`` nodes and
    constant subexpressions (e.g. weights made by ``ConstantOfShape``) become
    initializers; unused initializers are dropped; nodes are sorted; and a
    default-domain opset below :data:`~collage_ml.ir.normalise.CONVERT_BELOW_OPSET` is converted to
    :data:`~collage_ml.ir.normalise.TARGET_OPSET` when the converted model gives the same outputs on
    onnxruntime. Each
    change is listed in ``Graph.import_notes``.
    """
    try:
        return _from_onnx(model, input_shapes, name)
    except CollageError:
        raise
    except Exception as e:  # anything else from onnx or onnxruntime on a strange file: one line, not a traceback
        raise ModelError(f"could not import the model: {describe(e)}") from e


def _from_onnx(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None, name: str) -> Graph:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    notes: list[str] = []
    check_supported(m)
    normalise_ir(m, notes)
    if input_shapes:
        pin_inputs(m, input_shapes)
        # shapes recorded for the old input shapes are stale now
        del m.graph.value_info[:]
        for vi in m.graph.output:
            for d in vi.type.tensor_type.shape.dim:
                d.Clear()
    else:
        pin_inputs(m, {})
    m, tensors = normalise(m, notes)
    opset = default_opset(m)
    if opset is not None and opset < CONVERT_BELOW_OPSET:
        converted = convert_opset(m, opset, notes)
        if converted is not None:
            m, tensors = converted
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        raise ModelError(f"invalid ONNX model: {first_line(e)}") from None
    graph = Graph(m, tensors, name=name)
    graph.import_notes = notes
    return graph


