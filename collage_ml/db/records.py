"""The database's tables for records of their own kinds: ``boundaries`` and ``plan_timings``.

:class:`~collage_ml.db.Database` inherits :class:`RecordTables`; this module
holds their schema, their rows and their part of opening and merging a file.

- ``boundaries``: one row per :class:`~collage_ml.measure.records.BoundaryCost`,
  ``PRIMARY KEY (hardware, first, first_version, second, second_version, nbytes, tensor, protocol)``.
  As with measurements, the first settled row of a key stays, and a ``failed``
  one gives way to a later settled one (``attempts`` counts the tries).
- ``plan_timings``: one row per :class:`~collage_ml.measure.records.PlanTiming`,
  ``PRIMARY KEY (plan_hash, hardware, protocol)``. Committing a key that exists
  adds the new runs to its ``runs`` (a run already there is not added twice),
  so every judgement of a plan is kept; ``median`` (lowest valid run median),
  ``valid`` and ``n_runs`` are kept in step for queries.

Both tables are created with ``CREATE TABLE IF NOT EXISTS`` on every writable
open. That is additive, so the schema version stays 2: an older collage-ml
opens such a file and ignores them, and a read-only open of a file without
them reads them as empty.

**Old boundary rows.** Before these tables, boundary costs were candidate rows
(subgraph hash ``boundary:<nbytes>``, backend ``A->B``, no ONNX). A writable
open *moves* every such row into ``boundaries``, in one transaction that
checks each one arrived before deleting it from ``measurements`` (a row that
does not parse as a boundary stays where it is). A read-only open cannot move
them, so it reads them as boundaries and leaves them out of the measurements it
returns and counts. :meth:`Database.commit` of such a legacy-shaped measurement
(an old caller) stores it as a boundary too, so no new one appears among the
candidates. :meth:`Database.merge` does the same with the other file's.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Iterable

from collage_ml.cost import PROTOCOL
from collage_ml.db.sql import key_where, no_table, opt_float, replace_failed, to_json, where_clause
from collage_ml.measure.records import (
    LEGACY_BOUNDARY_PREFIX,
    BoundaryCost,
    BoundaryKey,
    PlanTiming,
    boundary_from_legacy,
)

#: the legacy boundary rows among the measurements, as a range over the unique index on subgraph_hash
LEGACY_RANGE = f"(subgraph_hash >= '{LEGACY_BOUNDARY_PREFIX}' AND subgraph_hash < 'boundary;')"

BOUNDARY_COLUMNS = (
    "hardware", "first", "first_version", "second", "second_version", "nbytes", "tensor", "protocol",
    "valid", "status", "attempts", "median", "spread", "samples", "threads", "versions", "error_text", "extra",
    "timestamp",
)
BOUNDARY_KEY = BOUNDARY_COLUMNS[:8]
PLAN_COLUMNS = (
    "plan_hash", "hardware", "protocol", "graph_hash", "model", "valid", "median", "n_runs", "runs", "plan",
    "summary", "threads", "versions", "timestamp", "updated",
)

RECORD_TABLES = """
CREATE TABLE IF NOT EXISTS boundaries (
    hardware TEXT NOT NULL,
    first TEXT NOT NULL,
    first_version TEXT NOT NULL,
    second TEXT NOT NULL,
    second_version TEXT NOT NULL,
    nbytes INT NOT NULL,
    tensor TEXT NOT NULL,
    protocol TEXT NOT NULL,
    valid INT NOT NULL,
    status TEXT NOT NULL,
    attempts INT NOT NULL,
    median REAL,
    spread REAL,
    samples JSON NOT NULL,
    threads INT,
    versions JSON NOT NULL,
    error_text TEXT NOT NULL,
    extra JSON NOT NULL,
    timestamp REAL NOT NULL,
    PRIMARY KEY (hardware, first, first_version, second, second_version, nbytes, tensor, protocol)
);
CREATE TABLE IF NOT EXISTS plan_timings (
    plan_hash TEXT NOT NULL,
    hardware TEXT NOT NULL,
    protocol TEXT NOT NULL,
    graph_hash TEXT NOT NULL,
    model TEXT NOT NULL,
    valid INT NOT NULL,
    median REAL,
    n_runs INT NOT NULL,
    runs JSON NOT NULL,
    plan JSON NOT NULL,
    summary JSON NOT NULL,
    threads INT,
    versions JSON NOT NULL,
    timestamp REAL NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (plan_hash, hardware, protocol)
);
"""
TABLES = ("boundaries", "plan_timings")


# ----------------------------------------------------------------------------- rows


def boundary_row(b: BoundaryCost) -> tuple:
    if not isinstance(b, BoundaryCost):
        raise TypeError(f"expected a BoundaryCost, got {type(b).__name__}")
    k = b.key
    for name, v in (("first", k.first), ("second", k.second), ("hardware", b.hardware)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"a boundary cost needs a non-empty string {name}, got {v!r}")
    return (
        b.hardware, k.first, str(k.first_version), k.second, str(k.second_version), int(k.nbytes), str(k.tensor),
        str(b.protocol), int(bool(b.valid)), b.status, max(1, int(b.attempts)),
        opt_float(b.median), opt_float(b.spread), to_json([float(s) for s in b.samples]),
        None if b.threads is None else int(b.threads), to_json(dict(b.versions)), str(b.error_text or ""),
        to_json(dict(b.extra)), float(b.timestamp),
    )


def boundary_from_row(r: tuple) -> BoundaryCost:
    (hw, first, v1, second, v2, nbytes, tensor, protocol, valid, status, attempts, median, spread, samples, threads,
     versions, err, extra, ts) = r
    return BoundaryCost(
        BoundaryKey(first, v1, second, v2, int(nbytes), tensor), hw, bool(valid), json.loads(samples), median, spread,
        1 if threads is None else int(threads), json.loads(versions), err, ts, json.loads(extra), status == "failed",
        protocol, int(attempts),
    )


def plan_row(p: PlanTiming, updated: float | None = None) -> tuple:
    if not isinstance(p, PlanTiming):
        raise TypeError(f"expected a PlanTiming, got {type(p).__name__}")
    for name, v in (("plan_hash", p.plan_hash), ("hardware", p.hardware), ("protocol", p.protocol)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"a plan timing needs a non-empty string {name}, got {v!r}")
    last = max([float(r.get("timestamp", p.timestamp)) for r in p.runs] or [float(p.timestamp)])
    return (
        p.plan_hash, p.hardware, p.protocol, str(p.graph_hash), str(p.model), int(p.valid), p.median, len(p.runs),
        to_json(list(p.runs)), to_json(dict(p.plan)), to_json(dict(p.summary)), int(p.threads),
        to_json(dict(p.versions)), float(p.timestamp), last if updated is None else updated,
    )


def plan_from_row(r: tuple) -> PlanTiming:
    h, hw, protocol, graph_hash, model, _valid, _median, _n, runs, plan, summary, threads, versions, ts, _up = r
    return PlanTiming(h, hw, protocol, graph_hash, model, json.loads(plan), json.loads(summary), json.loads(runs),
                      1 if threads is None else int(threads), json.loads(versions), ts)


def _run_id(run: dict) -> str:
    return to_json({k: run.get(k) for k in ("timestamp", "process", "status", "median", "samples")})


# ----------------------------------------------------------------------------- writes inside a transaction


def put_boundary(c: sqlite3.Connection, row: tuple, prefix: str = "") -> bool:
    """Inside a transaction: store a boundary row, unless its key holds a settled one. True if it changed.

    A ``failed`` row here is replaced by a settled one, or has its attempts counted by another failure."""
    cols = ", ".join(BOUNDARY_COLUMNS)
    marks = ", ".join("?" * len(BOUNDARY_COLUMNS))
    if c.execute(f"INSERT OR IGNORE INTO {prefix}boundaries ({cols}) VALUES ({marks})", row).rowcount == 1:
        return True
    return replace_failed(c, f"{prefix}boundaries", BOUNDARY_COLUMNS, BOUNDARY_KEY, row)


def put_plan(c: sqlite3.Connection, p: PlanTiming, prefix: str = "") -> int:
    """Inside a transaction: store a plan timing, or add its runs to the stored one. Returns the runs added."""
    cols = ", ".join(PLAN_COLUMNS)
    row = plan_row(p)
    if c.execute(f"INSERT OR IGNORE INTO {prefix}plan_timings ({cols}) VALUES ({', '.join('?' * len(PLAN_COLUMNS))})",
                 row).rowcount == 1:
        return len(p.runs)
    old = plan_from_row(c.execute(
        f"SELECT {cols} FROM {prefix}plan_timings WHERE plan_hash = ? AND hardware = ? AND protocol = ?",
        (p.plan_hash, p.hardware, p.protocol)).fetchone())
    seen = {_run_id(r) for r in old.runs}
    new = [r for r in p.runs if _run_id(r) not in seen]
    if not new:
        return 0
    old.runs = sorted(old.runs + new, key=lambda r: float(r.get("timestamp", 0.0)))
    old.timestamp = min(old.timestamp, p.timestamp)
    r = plan_row(old)
    c.execute(f"UPDATE {prefix}plan_timings SET valid = ?, median = ?, n_runs = ?, runs = ?, timestamp = ?, "
              "updated = ? WHERE plan_hash = ? AND hardware = ? AND protocol = ?",
              (r[5], r[6], r[7], r[8], r[13], r[14], p.plan_hash, p.hardware, p.protocol))
    return len(new)


def create_tables(c: sqlite3.Connection) -> None:
    for stmt in RECORD_TABLES.split(";"):
        if stmt.strip():
            c.execute(stmt)


def move_legacy_boundaries(c: sqlite3.Connection, legacy_rows: list[tuple[int, Any]]) -> int:
    """Inside a transaction: ``legacy_rows`` are (measurement id, Measurement) of old boundary rows; each one
    that parses is stored in ``boundaries`` (unless its key holds a settled one already), checked there, and
    deleted from ``measurements``. Returns how many were moved."""
    moved = 0
    where = key_where(BOUNDARY_KEY)
    for row_id, m in legacy_rows:
        b = boundary_from_legacy(m)
        if b is None:
            continue
        row = boundary_row(b)
        put_boundary(c, row)
        if c.execute(f"SELECT 1 FROM boundaries WHERE {where}", row[: len(BOUNDARY_KEY)]).fetchone() is None:
            raise sqlite3.DatabaseError("moving a boundary row would lose it")  # pragma: no cover
        c.execute("DELETE FROM measurements WHERE id = ?", (row_id,))
        moved += 1
    return moved


# ----------------------------------------------------------------------------- the Database's methods


class RecordTables:
    """Boundary costs and plan timings: the part of :class:`~collage_ml.db.Database` that keeps them.

    Needs ``_read`` and ``_write`` from the class it is mixed into."""

    def _records_read(self, sql: str, args: Iterable[Any], what: str) -> list[tuple]:
        """Rows of a query over the record tables; none when this (read-only, older) file lacks them."""

        def q(c: sqlite3.Connection) -> list[tuple]:
            try:
                return c.execute(sql, tuple(args)).fetchall()
            except sqlite3.OperationalError as e:
                if no_table(e):
                    return []
                raise

        return self._read(q, what)  # type: ignore[attr-defined]

    # -- boundaries

    def commit_boundary(self, b: BoundaryCost) -> bool:
        """Commit one boundary cost in its own transaction. True if stored (or a failed row it replaced)."""
        row = boundary_row(b)
        return self._write(lambda c: put_boundary(c, row), "commit_boundary")  # type: ignore[attr-defined]

    def get_boundary(self, key: BoundaryKey, hardware: str, protocol: str | None = None) -> BoundaryCost | None:
        """The boundary cost of ``key`` on ``hardware`` under ``protocol`` (default: the current one), or None."""
        where = key_where(BOUNDARY_KEY)
        rows = self._records_read(
            f"SELECT {', '.join(BOUNDARY_COLUMNS)} FROM boundaries WHERE {where}",
            (hardware, key.first, key.first_version, key.second, key.second_version, int(key.nbytes), key.tensor,
             protocol or PROTOCOL), "get_boundary")
        if rows:
            return boundary_from_row(rows[0])
        if self._legacy_boundaries():
            for b in self._legacy_boundary_records():
                if b.key == key and b.hardware == hardware and b.protocol == (protocol or PROTOCOL):
                    return b
        return None

    def boundaries(self, hardware: str | None = None, protocol: str | None = None,
                   valid: bool | None = True) -> list[BoundaryCost]:
        """Stored boundary costs, filtered by whichever arguments are given (default: the valid ones).

        A read-only open of a file whose old boundary rows were never moved reads them here too."""
        where, args = where_clause((("hardware", hardware), ("protocol", protocol)), valid)
        rows = self._records_read(
            f"SELECT {', '.join(BOUNDARY_COLUMNS)} FROM boundaries WHERE {where} "
            "ORDER BY hardware, first, second, nbytes", args, "boundaries")
        out = [boundary_from_row(r) for r in rows]
        if self._legacy_boundaries():
            have = {(b.hardware, b.key, b.protocol) for b in out}
            for b in self._legacy_boundary_records():
                if ((hardware is None or b.hardware == hardware) and (protocol is None or b.protocol == protocol)
                        and (valid is None or b.valid == valid) and (b.hardware, b.key, b.protocol) not in have):
                    out.append(b)
        return out

    # -- plan timings

    def commit_plan_timing(self, p: PlanTiming) -> int:
        """Commit a plan timing in its own transaction: a new record, or its runs added to the stored one.
        Returns how many runs were new (0: all of them were stored already)."""
        plan_row(p)  # checks it before the transaction
        return self._write(lambda c: put_plan(c, p), "commit_plan_timing")  # type: ignore[attr-defined]

    def get_plan_timing(self, plan_hash: str, hardware: str, protocol: str | None = None) -> PlanTiming | None:
        rows = self._records_read(
            f"SELECT {', '.join(PLAN_COLUMNS)} FROM plan_timings WHERE plan_hash = ? AND hardware = ? AND protocol = ?",
            (plan_hash, hardware, protocol or PROTOCOL), "get_plan_timing")
        return plan_from_row(rows[0]) if rows else None

    def plan_timings(self, hardware: str | None = None, graph_hash: str | None = None, protocol: str | None = None,
                     valid: bool | None = None) -> list[PlanTiming]:
        """Stored plan timings (oldest first), filtered by whichever arguments are given."""
        where, args = where_clause((("hardware", hardware), ("graph_hash", graph_hash), ("protocol", protocol)), valid)
        rows = self._records_read(
            f"SELECT {', '.join(PLAN_COLUMNS)} FROM plan_timings WHERE {where} "
            "ORDER BY timestamp, plan_hash", args, "plan_timings")
        return [plan_from_row(r) for r in rows]

    # -- counts

    def record_counts(self, hardware: str | None = None, valid: bool | None = None,
                      protocols: Iterable[str] | None = None) -> dict[str, int]:
        """``{"boundaries": n, "plan_timings": n}``, filtered like :meth:`boundaries` and :meth:`plan_timings`."""
        keep = None if protocols is None else set(protocols)
        bs = [b for b in self.boundaries(hardware=hardware, valid=valid) if keep is None or b.protocol in keep]
        where, args = where_clause((("hardware", hardware),), valid)
        rows = self._records_read(
            f"SELECT protocol, COUNT(*) FROM plan_timings WHERE {where} GROUP BY protocol", args, "record_counts")
        return {"boundaries": len(bs), "plan_timings": sum(n for p, n in rows if keep is None or p in keep)}

    # -- old boundary rows (filled in by Database)

    def _legacy_boundaries(self) -> bool:  # pragma: no cover - Database overrides it
        return False

    def _legacy_boundary_records(self) -> list[BoundaryCost]:  # pragma: no cover - Database overrides it
        return []
