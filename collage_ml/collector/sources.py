"""The source graphs of a collection: zoo names and ONNX files, their family, batch sizes and import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

def parse_batch_sizes(batch_sizes: Any) -> tuple[int, ...] | None:
    if batch_sizes is None:
        return None
    items = batch_sizes.split(",") if isinstance(batch_sizes, str) else list(batch_sizes)
    try:
        out = tuple(sorted({int(str(b).strip()) for b in items if str(b).strip()}))
    except ValueError:
        raise ValueError(f"bad batch sizes {batch_sizes!r}: expected positive integers, e.g. 1,2,4") from None
    if not out or out[0] < 1:
        raise ValueError(f"bad batch sizes {batch_sizes!r}: expected positive integers, e.g. 1,2,4")
    return out


def resolve_models(models: str | Sequence[str] | None) -> list[str]:
    """Zoo names and ONNX paths, in order, without duplicates.

    ``"all"`` (or None) is every full-size zoo model; ``"tiny"`` every ``-tiny`` one; ``"synthetic:N"``
    the synthetic networks ``synthetic-0`` to ``synthetic-<N-1>`` (``"synthetic:A-B"``: seeds A to B-1;
    :mod:`collage_ml.ir.zoo.synthetic`). A comma-separated string is split. Unknown names raise
    ``UnknownModelError``.
    """
    from collage_ml.errors import ModelError
    from collage_ml.ir import zoo

    if models is None:
        models = "all"
    items = [m.strip() for m in models.split(",")] if isinstance(models, str) else [os.fspath(m) for m in models]
    out: list[str] = []
    for m in items:
        if not m:
            continue
        if m == "all":
            names = zoo.names(include_tiny=False)
        elif m in ("tiny", "all-tiny"):
            names = [n for n in zoo.names() if zoo.get(n).tiny]
        elif m.startswith("synthetic:"):
            names = [f"synthetic-{i}" for i in _seed_range(m)]
        elif _is_path(m):
            if not Path(m).is_file():
                raise ModelError(f"{m}: no such ONNX file")
            names = [m]
        else:
            zoo.get(m)  # UnknownModelError with suggestions
            names = [m]
        out.extend(n for n in names if n not in out)
    if not out:
        raise ValueError("no models given")
    return out


def _seed_range(m: str) -> range:
    """``synthetic:N`` -> range(N); ``synthetic:A-B`` -> range(A, B)."""
    spec = m.split(":", 1)[1].strip()
    try:
        lo, hi = (int(x) for x in spec.split("-", 1)) if "-" in spec else (0, int(spec))
    except ValueError:
        lo, hi = 0, -1
    if not 0 <= lo < hi:
        raise ValueError(f"bad synthetic range {m!r}: expected synthetic:N or synthetic:A-B with 0 <= A < B")
    return range(lo, hi)


def _is_path(m: str) -> bool:
    return m.endswith(".onnx") or os.path.sep in m or os.path.exists(m)


def _is_zoo(m: str) -> bool:
    return not _is_path(m)


def model_family(model: str) -> str:
    """The family recorded for a model: the zoo entry's family, or an ONNX file's stem."""
    if _is_zoo(model):
        from collage_ml.ir import zoo

        return zoo.get(model).family
    return Path(model).stem


def _import(model: str, batch: int):
    from collage_ml.ir.importers import import_model

    return import_model(model, batch=batch) if _is_zoo(model) else import_model(model)


def _activation_bytes(graph) -> int:
    return sum(t.nbytes for n, t in graph.tensors.items() if n not in graph.initializers)
