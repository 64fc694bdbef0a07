"""The candidate measurements: committing them (with their subgraphs and hardware) and reading them."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from collage_ml.cost import MAX_ATTEMPTS, PROTOCOL, CandidateKey, Measurement
from collage_ml.db.records import LEGACY_RANGE, boundary_row, put_boundary
from collage_ml.db.rows import (
    INSERT_MEASUREMENT,
    INSERT_SUBGRAPH,
    KEY_COLUMNS,
    MEASUREMENT_COLUMNS,
    measurement_from_row,
    measurement_row,
    onnx_summary,
)
from collage_ml.db.sql import key_where, overwrite, replace_failed, to_json, where_clause
from collage_ml.measure.records import boundary_from_legacy

_PAGE = 1000  # rows per query when streaming measurements


#: SQL for "this row was timed while another task used the CPUs" (``extra.contended``; 0 where absent)
_CONTENDED = "COALESCE(json_extract(extra, '$.contended'), 0)"


class MeasurementTables:
    """The measurements, subgraphs and hardware tables: the part of :class:`~collage_ml.db.Database` that
    keeps candidate measurements. Needs ``_read``, ``_write``, ``_col``, ``_cols``, ``_legacy``,
    ``commit_boundary`` and ``record_counts`` from the class it is mixed into."""

    # -- writing

    def register_hardware(self, fingerprint: str, info: dict) -> bool:
        """Record what a fingerprint stands for; the first description of a fingerprint is kept. True if new."""
        if not isinstance(fingerprint, str) or not fingerprint:
            raise ValueError(f"a hardware fingerprint must be a non-empty string, got {fingerprint!r}")
        data = to_json(info)
        return self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO hardware (fingerprint, info) VALUES (?, ?)", (fingerprint, data)
            ).rowcount
            == 1,
            "register_hardware",
        )

    def _subgraph_row(self, subgraph_hash: str, onnx_bytes: Any) -> tuple | None:
        if onnx_bytes is None:
            return None
        if not isinstance(onnx_bytes, (bytes, bytearray, memoryview)):
            raise TypeError(f"onnx_bytes must be bytes, got {type(onnx_bytes).__name__}")
        if self._read(
            lambda c: c.execute("SELECT 1 FROM subgraphs WHERE hash = ?", (subgraph_hash,)).fetchone(), "lookup"
        ):
            return None
        data = bytes(onnx_bytes)
        n_nodes, ops = onnx_summary(data)
        return (subgraph_hash, data, n_nodes, ops)

    def add_subgraph(self, subgraph_hash: str, onnx_bytes: bytes) -> bool:
        """Store a subgraph's ONNX once per hash (no measurement needed). True if it was new."""
        row = self._subgraph_row(subgraph_hash, onnx_bytes)
        if row is None:
            return False
        return self._write(lambda c: c.execute(INSERT_SUBGRAPH, row).rowcount == 1, "add_subgraph")

    def commit(self, m: Measurement) -> bool:
        """Commit one measurement now, in its own transaction. True if stored, False if its key existed.

        A stored row is never overwritten, with one exception: a ``failed`` row (timeout, crash) is replaced by
        a later valid or invalid measurement of its key, and a later failure adds one to its ``attempts``.
        ``m.onnx_bytes``, when given, is stored in ``subgraphs`` if that hash has none yet.
        A measurement in the old shape of a boundary cost (subgraph hash ``boundary:<nbytes>``) is stored as a
        boundary cost (:meth:`commit_boundary`), never among the candidates.
        """
        b = boundary_from_legacy(m) if isinstance(m, Measurement) else None
        if b is not None:
            return self.commit_boundary(b)
        row = measurement_row(m)
        sub = self._subgraph_row(m.key.subgraph_hash, m.onnx_bytes)

        def tx(c: sqlite3.Connection) -> bool:
            if sub is not None:
                c.execute(INSERT_SUBGRAPH, sub)
            if c.execute(INSERT_MEASUREMENT, row).rowcount == 1:
                return True
            return self._replace_failed(c, row)

        return self._write(tx, "commit")

    @staticmethod
    def _replace_failed(c: sqlite3.Connection, row: tuple) -> bool:
        """Inside a transaction: ``row``'s key exists; replace it if that row is not settled. True if it changed.

        A ``failed`` row gives way to any later result (a later failure adds one to its attempts), as a failed
        boundary cost does (:func:`~collage_ml.db.sql.replace_failed`). A valid row timed under contention
        (``extra.contended``) with attempts left gives way to a later valid one only; the replaced timing is
        kept in the new row's ``extra["earlier"]``, so nothing measured is lost. A later failure of a contended
        row only counts the attempt."""
        if replace_failed(c, "measurements", MEASUREMENT_COLUMNS, KEY_COLUMNS, row):
            return True
        cols = dict(zip(MEASUREMENT_COLUMNS, row))
        where = key_where(KEY_COLUMNS)
        key = [cols[k] for k in KEY_COLUMNS]
        old = c.execute(f"SELECT attempts, status, extra, median, timestamp FROM measurements WHERE {where}",
                        key).fetchone()
        if old is None:
            return False
        attempts, status, extra_text, median, ts = old
        try:
            extra = json.loads(extra_text or "{}")
        except ValueError:
            return False
        if status != "valid" or not extra.get("contended") or int(attempts) >= MAX_ATTEMPTS:
            return False
        if cols["status"] != "valid":  # a failure after a contended timing: count it, keep the timing
            return c.execute(f"UPDATE measurements SET attempts = ? WHERE {where}",
                             (int(attempts) + 1, *key)).rowcount == 1
        new_extra = json.loads(cols["extra"] or "{}")
        earlier = list(extra.get("earlier", []))
        earlier.append({"median": median, "timestamp": ts, "cpu_pressure": extra.get("cpu_pressure"),
                        "cpu_steal": extra.get("cpu_steal"), "contended": True})
        new_extra["earlier"] = earlier
        cols["extra"] = to_json(new_extra)
        cols["attempts"] = int(attempts) + 1
        return overwrite(c, "measurements", MEASUREMENT_COLUMNS, KEY_COLUMNS, cols)

    def commit_many(self, ms: Iterable[Measurement]) -> int:
        """Commit many measurements in one transaction (all or none). Returns how many were new.
        Old-shaped boundary costs among them are stored as boundary costs (see :meth:`commit`)."""
        ms = list(ms)
        bounds = [boundary_row(b) for b in (boundary_from_legacy(m) for m in ms if isinstance(m, Measurement))
                  if b is not None]
        if bounds:
            ms = [m for m in ms if boundary_from_legacy(m) is None]
        rows = [measurement_row(m) for m in ms]
        subs: dict[str, tuple] = {}
        for m in ms:
            h = m.key.subgraph_hash
            if m.onnx_bytes is not None and h not in subs:
                sub = self._subgraph_row(h, m.onnx_bytes)
                if sub is not None:
                    subs[h] = sub
        if not rows and not bounds:
            return 0

        def tx(c: sqlite3.Connection) -> int:
            if subs:
                c.executemany(INSERT_SUBGRAPH, list(subs.values()))
            n = 0
            for row in bounds:
                n += put_boundary(c, row)
            for row in rows:
                n += c.execute(INSERT_MEASUREMENT, row).rowcount == 1 or self._replace_failed(c, row)
            return n

        return self._write(tx, "commit_many")

    # -- reading

    def _key_where(self, key: CandidateKey, hardware: str, protocol: str | None) -> tuple[str, tuple]:
        return (
            f"subgraph_hash = ? AND backend = ? AND backend_version = ? AND hardware = ? AND {self._col('protocol')} = ?",
            (key.subgraph_hash, key.backend, key.backend_version, hardware, protocol or PROTOCOL),
        )

    def get(self, key: CandidateKey, hardware: str, protocol: str | None = None) -> Measurement | None:
        """The measurement of ``key`` on ``hardware`` under ``protocol`` (default: the current one), valid or not,
        or None. ``onnx_bytes`` is not loaded."""
        where, args = self._key_where(key, hardware, protocol)
        row = self._read(lambda c: c.execute(f"SELECT {self._cols} FROM measurements WHERE {where}", args).fetchone(), "get")
        return None if row is None else measurement_from_row(row)

    def has(self, key: CandidateKey, hardware: str, protocol: str | None = None) -> bool:
        where, args = self._key_where(key, hardware, protocol)
        return self._read(lambda c: c.execute(f"SELECT 1 FROM measurements WHERE {where}", args).fetchone(), "has") is not None

    def known_keys(self, hardware: str, protocol: str | None = None) -> set[tuple[str, str, str]]:
        """Every ``(subgraph_hash, backend, backend_version)`` settled on ``hardware`` under ``protocol``
        (default: the current one): valid, invalid, or failed with no attempts left. A failed key, or a valid
        one timed under contention, with attempts left is not settled: the next run measures it again."""
        status, attempts = self._col("status"), self._col("attempts")
        return self._read(
            lambda c: {
                tuple(r)
                for r in c.execute(
                    f"SELECT subgraph_hash, backend, backend_version FROM measurements WHERE hardware = ? "
                    f"AND {self._col('protocol')} = ? AND (({status} != 'failed' AND NOT ({status} = 'valid' AND "
                    f"{_CONTENDED})) OR {attempts} >= ?)",
                    (hardware, protocol or PROTOCOL, MAX_ATTEMPTS),
                )
            },
            "known_keys",
        )

    def _where(
        self, hardware: str | None, backend: str | None, valid: bool | None, family: str | None,
        protocol: str | None = None, status: str | None = None,
    ) -> tuple[str, list]:
        columns = (("hardware", hardware), ("backend", backend), ("family", family), ("protocol", protocol),
                   ("status", status))
        also = [f"NOT {LEGACY_RANGE}"] if self._legacy else []  # old boundary rows are boundary costs
        return where_clause(((self._col(col), val) for col, val in columns), valid, also)

    def measurements(
        self,
        hardware: str | None = None,
        backend: str | None = None,
        valid: bool | None = None,
        family: str | None = None,
        protocol: str | None = None,
        status: str | None = None,
    ) -> Iterator[Measurement]:
        """Stored measurements in commit order, filtered by whichever arguments are given
        (``protocol=None``: every protocol; ``status``: "valid", "invalid" or "failed").

        Streams in pages; committing while iterating is fine (rows committed meanwhile may appear).
        """
        where, args = self._where(hardware, backend, valid, family, protocol, status)
        last = 0
        while True:
            rows = self._read(
                lambda c: c.execute(
                    f"SELECT id, {self._cols} FROM measurements WHERE {where} AND id > ? ORDER BY id LIMIT {_PAGE}",
                    (*args, last),
                ).fetchall(),
                "measurements",
            )
            for r in rows:
                yield measurement_from_row(r[1:])
            if len(rows) < _PAGE:
                return
            last = rows[-1][0]

    def count(
        self, hardware: str | None = None, backend: str | None = None, valid: bool | None = None,
        family: str | None = None, protocol: str | None = None, status: str | None = None,
    ) -> int:
        where, args = self._where(hardware, backend, valid, family, protocol, status)
        return self._read(lambda c: c.execute(f"SELECT COUNT(*) FROM measurements WHERE {where}", args).fetchone()[0], "count")

    def __len__(self) -> int:
        return self.count()

    def subgraph_onnx(self, subgraph_hash: str) -> bytes | None:
        row = self._read(
            lambda c: c.execute("SELECT onnx FROM subgraphs WHERE hash = ?", (subgraph_hash,)).fetchone(), "subgraph_onnx"
        )
        return None if row is None else bytes(row[0])

    def hardware_info(self, fingerprint: str) -> dict | None:
        """The description registered for a fingerprint, or None."""
        row = self._read(
            lambda c: c.execute("SELECT info FROM hardware WHERE fingerprint = ?", (fingerprint,)).fetchone(),
            "hardware_info",
        )
        return None if row is None else json.loads(row[0])

    # -- counts

    def stats(self, hardware: str | None = None) -> dict[str, Any]:
        """Counts: ``total``, ``valid``, ``invalid``, ``failed``, ``subgraphs`` (distinct hashes measured),
        ``onnx_stored`` (subgraphs with ONNX bytes, whole file), and per-``backends``,
        per-``families``, per-``hardware`` and per-``protocols`` row counts: all of candidate measurements.
        How clean the valid timings are: ``contended`` (valid rows timed while another task used the CPUs;
        kept, but left out of training) and ``retimed`` (rows with at least one timing window taken again
        because the hypervisor or another task disturbed it). The records of other kinds: ``boundaries``
        (boundary costs, any status) and ``plan_timings`` (plans judged end to end), and
        ``boundaries_valid`` and ``plan_timings_valid``; ``calibrations``: per fingerprint, the probe set's
        ``sittings`` and when the ``newest`` was measured."""
        where, args = self._where(hardware, None, None, None)
        records = self.record_counts(hardware=hardware)
        valid_records = self.record_counts(hardware=hardware, valid=True)
        calibrations = {hw: c for hw, c in self.calibration_counts().items() if hardware in (None, hw)}

        def q(c: sqlite3.Connection) -> dict[str, Any]:
            total, n_valid, n_sub = c.execute(
                f"SELECT COUNT(*), COALESCE(SUM(valid), 0), COUNT(DISTINCT subgraph_hash) FROM measurements WHERE {where}",
                args,
            ).fetchone()

            def group(col: str) -> dict[str, int]:
                return dict(
                    c.execute(
                        f"SELECT {col}, COUNT(*) FROM measurements WHERE {where} GROUP BY {col} ORDER BY {col}", args
                    ).fetchall()
                )

            n_failed, n_contended, n_retimed = c.execute(  # one scan for the three per-row conditions
                f"SELECT COALESCE(SUM({self._col('status')} = 'failed'), 0), "
                f"COALESCE(SUM(valid = 1 AND {_CONTENDED} != 0), 0), "
                "COALESCE(SUM(COALESCE(json_extract(extra, '$.retimed'), 0) > 0), 0) "
                f"FROM measurements WHERE {where}", args,
            ).fetchone()
            return {
                "total": total,
                "valid": n_valid,
                "invalid": total - n_valid - n_failed,
                "failed": n_failed,
                "contended": n_contended,
                "retimed": n_retimed,
                "subgraphs": n_sub,
                "onnx_stored": c.execute("SELECT COUNT(*) FROM subgraphs").fetchone()[0],
                "backends": group("backend"),
                "families": group("family"),
                "hardware": group("hardware"),
                "protocols": group(self._col("protocol")),
                "boundaries": records["boundaries"],
                "boundaries_valid": valid_records["boundaries"],
                "plan_timings": records["plan_timings"],
                "plan_timings_valid": valid_records["plan_timings"],
                "calibrations": calibrations,
            }

        return self._read(q, "stats")
