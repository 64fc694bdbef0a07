"""The public Python API.

Everything the CLI does goes through these functions; ``cli.py`` only parses
arguments and prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from collage_ml.ir import Graph, import_model


def inspect_model(
    model: Any,
    example_inputs: Sequence[Any] | None = None,
    *,
    batch: int = 1,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> dict:
    """A summary of a model: node count, FLOPs, parameter bytes, inputs, outputs and op histogram."""
    g = import_model(model, example_inputs, batch=batch, input_shapes=input_shapes)
    return g.summary()


def export_zoo(name: str, path: str | Path, batch: int = 1, seed: int = 0) -> Graph:
    """Writes zoo model ``name`` as a self-contained ONNX file with static shapes; returns its Graph."""
    import onnx

    g = import_model(name, batch=batch)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(g.model, str(path))
    return g


def place(
    model: Any,
    backends: Sequence[str] | str | None = None,
    mode: str = "exhaustive",
    db: Any = None,
    *,
    example_inputs: Sequence[Any] | None = None,
    batch: int = 1,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    max_region_size: int = 3,
    threads: int | None = None,
    progress: bool = False,
    log=None,
    **kwargs: Any,
):
    """Places ``model`` on the fastest mix of ``backends``; returns a runnable :class:`PlacedModel`.

    ``model`` is anything :func:`import_model` takes. ``backends`` is a list or a
    comma-separated string of backend names (default: the CPU default set).
    ``db`` is a database path or :class:`~collage_ml.db.Database` (default: the
    per-user database, so placing the same model twice hits the cache). The
    placed model's ``report`` holds the measurements, the baselines and the
    search statistics.
    """
    from collage_ml.backends.base import resolve_backends
    from collage_ml.search.tuner import place as _place

    graph = import_model(model, example_inputs, batch=batch, input_shapes=input_shapes)
    family = model if isinstance(model, str) and not str(model).endswith(".onnx") else graph.name
    from collage_ml.errors import BackendError
    from collage_ml.search.dp import NoCoverError

    bks = resolve_backends(backends)
    try:
        res = _place(graph, bks, mode, db, max_region_size=max_region_size, threads=threads,
                     progress=progress, log=log, family=family.removesuffix("-tiny") if isinstance(family, str) else "",
                     **kwargs)
    except NoCoverError as e:  # every candidate of some node was invalid: a fact about the backends, one line
        raise BackendError(f"cannot place {graph.name} on {', '.join(b.name for b in bks)}: {e}") from None
    return res.placed


def collect(*args: Any, **kwargs: Any):
    """Measures candidates into a database; see :func:`collage_ml.collector.collect`. Returns a CollectSummary."""
    from collage_ml.collector import collect as _collect

    return _collect(*args, **kwargs)


def load(path: str | Path, threads: int | None = None):
    """Loads a placed model saved with ``PlacedModel.save(dir)``; its backends are recompiled."""
    from collage_ml.plan import load as _load

    return _load(path, threads=threads)


def backends_info() -> list[dict]:
    """Every registered backend with its availability, version, device and pattern kinds."""
    from collage_ml.backends import all_backends

    return [b.info() for b in all_backends()]


def open_db(path: str | Path, create: bool = False, readonly: bool = False):
    """Opens a measurement database (``DatabaseError`` for a missing, corrupt or foreign file)."""
    from collage_ml.db import Database

    return Database(path, create=create and not readonly, readonly=readonly)


def db_stats(path: str | Path) -> dict:
    with open_db(path, readonly=True) as db:  # reading never changes the file (e.g. a shipped dataset)
        return db.stats()


def db_export_parquet(path: str | Path, out: str | Path) -> int:
    with open_db(path, readonly=True) as db:
        return db.export_parquet(out)


def db_merge(into: str | Path, other: str | Path) -> int:
    """Adds every measurement of ``other`` missing from ``into`` (created if absent); returns rows added."""
    with open_db(into, create=True) as db:
        return db.merge(other)


__all__ = [
    "place", "load", "collect", "import_model", "inspect_model", "export_zoo", "backends_info", "open_db", "db_stats", "db_export_parquet",
    "db_merge",
]
