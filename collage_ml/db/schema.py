"""What makes a file a collage-ml database: the schema, the checks on opening, setup and migration.

Opening never writes to a file before it is known to be ours: :meth:`Schema._probe` reads the header
and the ``meta`` table read-only, and raises :class:`~collage_ml.errors.DatabaseError` (one line naming
the file) for a foreign, corrupt, truncated or newer one.
"""

from __future__ import annotations

import sqlite3
import time

from collage_ml.db.records import (
    LEGACY_RANGE,
    TABLES as RECORD_TABLES,
    create_tables as create_record_tables,
    move_legacy_boundaries,
)
from collage_ml.db.probes import PROBE_CHECKS_TABLE, PROBE_NODES_TABLE, PROBES_TABLE, RECALIBRATIONS_TABLE
from collage_ml.db.rows import COLS, MEASUREMENT_COLUMNS, measurement_from_row
from collage_ml.db.sql import file_uri, immediate, is_busy
from collage_ml.errors import DatabaseError
from collage_ml.measure.records import BoundaryCost, boundary_from_legacy

MAGIC = "collage-ml-db"
SCHEMA_VERSION = 2
#: the protocol of rows written before protocols were recorded (schema 1)
LEGACY_PROTOCOL = "m1"
APPLICATION_ID = 0x434C4D4C  # "CLML", in the SQLite header (offset 68)

_SQLITE_HEADER = b"SQLite format 3\x00"

#: how schema-1 rows read: the columns schema 2 added, as expressions over the old ones
V1_EXPR = {
    "status": "(CASE WHEN valid = 1 THEN 'valid' WHEN error_text LIKE 'timeout%' OR error_text LIKE 'worker crashed%' "
    "THEN 'failed' ELSE 'invalid' END)",
    "attempts": "1",
    "protocol": f"'{LEGACY_PROTOCOL}'",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS hardware (
    fingerprint TEXT PRIMARY KEY,
    info JSON NOT NULL
);
CREATE TABLE IF NOT EXISTS subgraphs (
    hash TEXT PRIMARY KEY,
    onnx BLOB NOT NULL,
    n_nodes INT,
    ops TEXT
);
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    subgraph_hash TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    hardware TEXT NOT NULL,
    valid INT NOT NULL,
    median REAL,
    spread REAL,
    samples JSON NOT NULL,
    compile_seconds REAL,
    max_abs_error REAL,
    max_rel_error REAL,
    threads INT,
    versions JSON NOT NULL,
    family TEXT NOT NULL,
    error_text TEXT NOT NULL,
    timestamp REAL NOT NULL,
    extra JSON NOT NULL,
    status TEXT NOT NULL,
    attempts INT NOT NULL,
    protocol TEXT NOT NULL,
    UNIQUE (subgraph_hash, backend, backend_version, hardware, protocol)
);
CREATE INDEX IF NOT EXISTS measurements_by_hardware ON measurements (hardware, backend);
"""
_MEASUREMENTS_TABLE = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS measurements"):_SCHEMA.index("CREATE INDEX")]


class Schema:
    """Opening a file: its checks, its setup and its migration; the columns as this file's schema has them.

    The part of :class:`~collage_ml.db.Database` that knows the schema. Needs ``path``, ``schema_version``,
    ``_timeout``, ``_conn``, ``_legacy``, ``legacy_boundaries_moved`` and ``_read`` from the class it is mixed
    into."""

    def _fail(self, why: str) -> DatabaseError:
        return DatabaseError(f"{self.path}: {why}")

    def _probe(self, create: bool, check: bool) -> str:
        """Decide, without writing anything, whether the file is new ("new") or ours ("ours"); raise otherwise."""
        p = self.path
        if str(p) == ":memory:":  # sqlite's name for an in-memory database; here it would be a file of that name
            raise self._fail("an in-memory database is not supported (measurements are kept: give a file path)")
        if p.is_dir():
            raise self._fail("is a directory, not a collage-ml database")
        if not p.exists():
            if not create:
                raise self._fail("no such collage-ml database")
            p.parent.mkdir(parents=True, exist_ok=True)
            return "new"
        try:
            with open(p, "rb") as f:
                header = f.read(100)
        except OSError as e:
            raise self._fail(f"cannot read the file ({e.strerror})") from e
        if not header:
            if not create:
                raise self._fail("is an empty file, not a collage-ml database")
            return "new"
        if not header.startswith(_SQLITE_HEADER):
            raise self._fail("is not a collage-ml database (not an SQLite file)")
        if len(header) < 100:
            raise self._fail("is a truncated SQLite file (shorter than its header)")
        app_id = int.from_bytes(header[68:72], "big")
        if app_id not in (0, APPLICATION_ID):
            raise self._fail(f"is an SQLite database of another application (application id {app_id:#010x}), not collage-ml's")

        try:
            conn = sqlite3.connect(file_uri(p, "ro"), uri=True, timeout=self._timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise self._fail(f"cannot open the database ({e})") from e
        try:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            if not tables:
                if not create:
                    raise self._fail("is an empty SQLite database, not a collage-ml database")
                return "new"
            magic = None
            if "meta" in tables:
                try:
                    row = conn.execute("SELECT value FROM meta WHERE key = 'magic'").fetchone()
                    magic = row[0] if row else None
                except sqlite3.OperationalError:
                    magic = None
            if magic != MAGIC:
                shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
                raise self._fail(f"is an SQLite database of another application (tables: {shown}), not a collage-ml database")
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            try:
                version = max(version, int(row[0]) if row else 0)
            except ValueError:
                raise self._fail(f"has an unreadable schema version {row[0]!r}") from None
            if version > SCHEMA_VERSION:
                raise self._fail(
                    f"was written by a newer collage-ml (database schema {version}, this version reads up to "
                    f"{SCHEMA_VERSION}); upgrade collage-ml"
                )
            self.schema_version = version
            if check:
                problems = [r[0] for r in conn.execute("PRAGMA quick_check(3)")]
                if problems != ["ok"]:
                    detail = "; ".join(" ".join(p.split()) for p in problems)
                    raise self._fail(f"is corrupt or truncated (quick_check: {detail})")
            return "ours"
        except sqlite3.DatabaseError as e:  # "file is not a database", "database disk image is malformed", ...
            if isinstance(e, sqlite3.OperationalError) and not is_busy(e) and "malformed" not in str(e):
                raise self._fail(f"cannot read the database ({' '.join(str(e).split())})") from e
            raise self._fail(f"is corrupt or truncated ({' '.join(str(e).split())})") from e
        finally:
            conn.close()

    def _setup(self, new: bool) -> None:
        c = self._conn
        assert c is not None
        if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = FULL")
        if not new:
            if self.schema_version < SCHEMA_VERSION:
                self._migrate(c)
            elif not c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'probes'").fetchone():
                c.execute(PROBES_TABLE)  # a schema-2 file from before the probes table
            if not c.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'recalibrations'").fetchone():
                c.execute(RECALIBRATIONS_TABLE)  # a file from before the recalibrations table (additive, no bump)
            c.execute(PROBE_NODES_TABLE)  # likewise for the probe results' nodes (IF NOT EXISTS)
            c.execute(PROBE_CHECKS_TABLE)  # and the calibrations' checks
            self._setup_records(c)
            return
        with immediate(c):
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.execute(PROBES_TABLE)
            c.execute(RECALIBRATIONS_TABLE)
            c.execute(PROBE_NODES_TABLE)
            c.execute(PROBE_CHECKS_TABLE)
            create_record_tables(c)
            c.executemany(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                [("magic", MAGIC), ("schema_version", str(SCHEMA_VERSION)), ("created", repr(time.time()))],
            )
            c.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        # put the header (application id) into the main file now, so the file identifies itself
        c.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _setup_records(self, c: sqlite3.Connection) -> None:
        """An existing file: add the record tables it lacks, then move its old boundary rows into them."""
        have = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not set(RECORD_TABLES) <= have:
            with immediate(c):
                create_record_tables(c)
        if c.execute(f"SELECT 1 FROM measurements WHERE {LEGACY_RANGE} LIMIT 1").fetchone() is None:
            return
        with immediate(c):  # all of them or none; each is checked in its new table before it is deleted
            rows = c.execute(f"SELECT id, {COLS} FROM measurements WHERE {LEGACY_RANGE} ORDER BY id").fetchall()
            self.legacy_boundaries_moved = move_legacy_boundaries(
                c, [(r[0], measurement_from_row(tuple(r[1:]))) for r in rows])

    def _legacy_boundaries(self) -> bool:
        return self._legacy

    def _legacy_boundary_records(self) -> list[BoundaryCost]:
        """The old boundary rows still among the measurements (a read-only open of an unmoved file), as records."""
        rows = self._read(
            lambda c: c.execute(f"SELECT {self._cols} FROM measurements WHERE {LEGACY_RANGE} ORDER BY id").fetchall(),
            "boundaries")
        return [b for b in (boundary_from_legacy(measurement_from_row(tuple(r))) for r in rows) if b is not None]

    def _migrate(self, c: sqlite3.Connection) -> None:
        """Schema 1 -> 2 in one transaction: every row kept; status, attempts and protocol derived."""
        with immediate(c):
            version = int(c.execute("PRAGMA user_version").fetchone()[0])
            if version < SCHEMA_VERSION:  # another process may have migrated it meanwhile
                old = ", ".join(col for col in MEASUREMENT_COLUMNS if col not in V1_EXPR)
                derived = ", ".join(V1_EXPR[col] for col in MEASUREMENT_COLUMNS if col in V1_EXPR)
                n = c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                c.execute(_MEASUREMENTS_TABLE.replace("TABLE IF NOT EXISTS measurements", "TABLE measurements_v2"))
                c.execute(
                    f"INSERT INTO measurements_v2 (id, {COLS}) SELECT id, {old}, {derived} FROM measurements ORDER BY id"
                )
                if c.execute("SELECT COUNT(*) FROM measurements_v2").fetchone()[0] != n:  # pragma: no cover
                    raise sqlite3.DatabaseError("migration would lose rows")
                c.execute("DROP TABLE measurements")
                c.execute("ALTER TABLE measurements_v2 RENAME TO measurements")
                c.execute("CREATE INDEX IF NOT EXISTS measurements_by_hardware ON measurements (hardware, backend)")
                c.execute(PROBES_TABLE)
                c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self.schema_version = SCHEMA_VERSION

    def _col(self, name: str) -> str:
        """The SQL for a measurements column in this file (schema-1 files derive the newer ones)."""
        return V1_EXPR.get(name, name) if self.schema_version < 2 else name

    @property
    def _cols(self) -> str:
        return ", ".join(self._col(c) for c in MEASUREMENT_COLUMNS)
