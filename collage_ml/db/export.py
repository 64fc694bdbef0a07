"""Exporting the measurements table to Parquet."""

from __future__ import annotations

import os
from pathlib import Path

from collage_ml.db.rows import MEASUREMENT_COLUMNS
from collage_ml.db.schema import SCHEMA_VERSION
from collage_ml.errors import CollageError


class ParquetExport:
    """:meth:`export_parquet`: the part of :class:`~collage_ml.db.Database` that writes Parquet. Needs
    ``path``, ``_read``, ``_where`` and ``_cols`` from the class it is mixed into."""

    def export_parquet(self, path: str | os.PathLike, hardware: str | None = None) -> int:
        """Write the measurements table (optionally one fingerprint's rows) to Parquet; returns the row count.

        ``samples``, ``versions`` and ``extra`` are JSON strings; ``valid`` is boolean. Needs pyarrow.
        """
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise CollageError("exporting to Parquet needs pyarrow, which is not installed: pip install pyarrow") from e
        where, args = self._where(hardware, None, None, None)
        rows = self._read(
            lambda c: c.execute(f"SELECT id, {self._cols} FROM measurements WHERE {where} ORDER BY id", args).fetchall(),
            "export_parquet",
        )
        types = {
            "id": pa.int64(),
            "subgraph_hash": pa.string(),
            "backend": pa.string(),
            "backend_version": pa.string(),
            "hardware": pa.string(),
            "valid": pa.bool_(),
            "median": pa.float64(),
            "spread": pa.float64(),
            "samples": pa.string(),
            "compile_seconds": pa.float64(),
            "max_abs_error": pa.float64(),
            "max_rel_error": pa.float64(),
            "threads": pa.int64(),
            "versions": pa.string(),
            "family": pa.string(),
            "error_text": pa.string(),
            "timestamp": pa.float64(),
            "extra": pa.string(),
            "status": pa.string(),
            "attempts": pa.int64(),
            "protocol": pa.string(),
        }
        names = ["id", *MEASUREMENT_COLUMNS]
        columns = {n: [r[i] for r in rows] for i, n in enumerate(names)}
        columns["valid"] = [bool(v) for v in columns["valid"]]
        schema = pa.schema([(n, types[n]) for n in names]).with_metadata(
            {"collage_ml_schema_version": str(SCHEMA_VERSION), "source": str(self.path)}
        )
        table = pa.Table.from_pydict(columns, schema=schema)
        out = Path(os.fspath(path))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                tmp.unlink()
        return len(rows)
