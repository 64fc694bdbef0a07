"""Merging another database into this one: every row this one lacks, nothing committed lost."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from collage_ml.db.probes import merge_calibrations
from collage_ml.db.records import LEGACY_RANGE, boundary_row, put_boundary, put_plan
from collage_ml.db.rows import COLS, KEY_COLUMNS, MEASUREMENT_COLUMNS
from collage_ml.db.schema import V1_EXPR
from collage_ml.db.sql import file_uri, key_where


class Merge:
    """:meth:`merge`: the part of :class:`~collage_ml.db.Database` that merges files. Needs ``path``,
    ``readonly``, ``last_merge``, ``_lock``, ``_fail``, ``_connection``, ``_retry``, ``_write`` and
    ``_replace_failed`` from the class it is mixed into."""

    def merge(self, other_path: str | os.PathLike) -> int:
        """Add every measurement, subgraph, hardware, calibration, boundary and plan-timing row of another
        database that this one lacks (a calibration of a machine this one has calibrated already comes across as
        a later sitting's: :func:`~collage_ml.db.probes.merge_calibrations`).

        Returns the number of measurements added or upgraded (``last_merge`` also counts the ``boundaries``
        added or upgraded, the ``plan_runs`` added and the ``calibrations`` new here). Idempotent; on a key
        clash it keeps the existing row, except that a ``failed`` row here gives way to the other file's valid or invalid one, and a plan timing
        gains the other file's runs it lacks. The other file is only read (a schema-1 file is read as if
        migrated; its old boundary rows come across as boundary costs). A foreign, corrupt or newer file raises
        :class:`DatabaseError`.
        """
        other = Path(os.fspath(other_path))
        if self.readonly:
            raise self._fail("merge: the database was opened read-only")
        if other.exists() and self.path.exists() and os.path.samefile(other, self.path):
            return 0
        from collage_ml.db.database import Database  # the class this is mixed into

        probe = Database(other, create=False, readonly=True)  # validates it, read-only
        try:
            other_has_probes = probe.schema_version >= 2
            other_cols = ", ".join(
                f"{V1_EXPR[c]} AS {c}" if probe.schema_version < 2 and c in V1_EXPR else c
                for c in MEASUREMENT_COLUMNS
            )
            # the records of other kinds are few: read them (old boundary rows included) before attaching
            other_boundaries = [boundary_row(b) for b in probe.boundaries(valid=None)]
            other_plans = probe.plan_timings()
        finally:
            probe.close()
        c = self._connection()
        with self._lock:
            self._retry(lambda: c.execute("ATTACH DATABASE ? AS other", (file_uri(other, "ro"),)), "merge")
            try:

                def tx(c: sqlite3.Connection) -> int:
                    c.execute("INSERT OR IGNORE INTO main.hardware (fingerprint, info) SELECT fingerprint, info FROM other.hardware")
                    c.execute(
                        "INSERT OR IGNORE INTO main.subgraphs (hash, onnx, n_nodes, ops) "
                        "SELECT hash, onnx, n_nodes, ops FROM other.subgraphs"
                    )
                    added = c.execute(
                        f"INSERT OR IGNORE INTO main.measurements ({COLS}) SELECT {other_cols} FROM other.measurements "
                        f"WHERE NOT {LEGACY_RANGE} ORDER BY id"
                    ).rowcount
                    n_bound = sum(put_boundary(c, row, "main.") for row in other_boundaries)
                    n_runs = sum(put_plan(c, p, "main.") for p in other_plans)
                    self.last_merge = {"measurements": added, "boundaries": n_bound, "plan_runs": n_runs,
                                       "calibrations": 0}
                    if other_has_probes:  # every sitting's calibration, the first ones included
                        self.last_merge["calibrations"] = merge_calibrations(c)
                    # a failed row here gives way to the other file's settled one
                    failed = c.execute(
                        "SELECT subgraph_hash, backend, backend_version, hardware, protocol FROM main.measurements "
                        "WHERE status = 'failed'"
                    ).fetchall()
                    if failed:
                        sel = f"SELECT {other_cols} FROM other.measurements"
                        cond = key_where(KEY_COLUMNS)
                        for key in failed:
                            row = c.execute(f"SELECT * FROM ({sel}) WHERE {cond} AND status != 'failed'", key).fetchone()
                            if row is not None:
                                added += self._replace_failed(c, tuple(row))
                    self.last_merge["measurements"] = added
                    return added

                return self._write(tx, f"merge of {other}")
            finally:
                try:
                    c.execute("DETACH DATABASE other")
                except sqlite3.Error:
                    pass
