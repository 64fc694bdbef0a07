"""The measurement store: one SQLite file in WAL mode, the only store.

Rules it keeps:

- **Nothing committed is ever lost.** Every :meth:`Database.commit` is its own
  transaction with ``synchronous=FULL``, so a ``kill -9`` (or a power cut) at
  any moment loses at most the measurement being written. A key that exists
  already is never overwritten (``INSERT OR IGNORE``): the first measurement of
  ``(subgraph hash, backend, backend version, hardware fingerprint)`` stays.
- **Several writers, one file.** Processes may write one database at once; each
  write waits for the lock (``busy_timeout``) and is retried on
  ``database is locked``.
- **Foreign files are left alone.** A file that is not SQLite, an SQLite file of
  another application, a corrupt or truncated file, or a database of a newer
  schema raises :class:`~collage_ml.errors.DatabaseError` with one line naming
  the file. Such a file is only ever opened read-only, so it is never modified.

Schema (version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version`` and in
the ``meta`` table, whose ``magic`` row is :data:`MAGIC`; the SQLite header's
application id is :data:`APPLICATION_ID`):

- ``hardware(fingerprint TEXT PRIMARY KEY, info JSON)`` (see ``measure.hardware``)
- ``subgraphs(hash TEXT PRIMARY KEY, onnx BLOB, n_nodes INT, ops TEXT)``: the
  standalone ONNX of each measured subgraph, once per hash, so featurizers can
  run again without the original model. ``ops`` is the comma-separated op types
  in node order.
- ``measurements(...)``: one row per :class:`~collage_ml.cost.Measurement`,
  ``UNIQUE(subgraph_hash, backend, backend_version, hardware, protocol)``.
  ``samples``, ``versions`` and ``extra`` are JSON text. ``status`` is
  ``valid``, ``invalid`` (a fact about the backend) or ``failed`` (a timeout or
  crash: a fact about one run); a failed row is the one kind a later commit of
  the same key replaces, and ``attempts`` counts the tries. ``protocol`` is the
  measurement protocol (``measure.timing``), so rows timed another way keep
  their own key.

- ``probes(hardware, backend, backend_version, protocol, probe_set, probe, median, subgraph_hash, timestamp)``:
  the probe set's latencies per machine and backend (``measure.probes``), a record of its own kind; ``median``
  is NULL where the backend cannot run that probe.

Schema 1 had neither ``status``, ``attempts``, ``protocol`` nor ``probes``: opening such a
file for writing migrates it in one transaction (every row kept, with protocol
``m1``, and timeouts and crashes classified as ``failed``); opening it
read-only reads it as if migrated, without writing.

- ``boundaries`` and ``plan_timings``: boundary (hand-off) costs per ordered backend pair and tensor size, and
  every plan judged end to end, keyed by plan hash: records of their own kinds (``db.records`` keeps them).
  They were added without a schema bump (the tables are additive). The boundary rows older versions stored
  among the measurements (subgraph hash ``boundary:<nbytes>``, no ONNX) are moved into ``boundaries`` by a
  writable open, and read as boundaries (never as measurements) by a read-only one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Callable, TypeVar

from collage_ml.cost import MAX_ATTEMPTS, PROTOCOL, CandidateKey, Measurement
from collage_ml.db.records import (
    LEGACY_RANGE,
    TABLES as RECORD_TABLES,
    RecordTables,
    boundary_row,
    create_tables as create_record_tables,
    move_legacy_boundaries,
    put_boundary,
    put_plan,
)
from collage_ml.errors import CollageError, DatabaseError
from collage_ml.measure.records import BoundaryCost, boundary_from_legacy

MAGIC = "collage-ml-db"
SCHEMA_VERSION = 2
#: the protocol of rows written before protocols were recorded (schema 1)
LEGACY_PROTOCOL = "m1"
APPLICATION_ID = 0x434C4D4C  # "CLML", in the SQLite header (offset 68)
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRY_S = 120.0

_SQLITE_HEADER = b"SQLite format 3\x00"
_PAGE = 1000  # rows per query when streaming measurements

_MEASUREMENT_COLUMNS = (
    "subgraph_hash",
    "backend",
    "backend_version",
    "hardware",
    "valid",
    "median",
    "spread",
    "samples",
    "compile_seconds",
    "max_abs_error",
    "max_rel_error",
    "threads",
    "versions",
    "family",
    "error_text",
    "timestamp",
    "extra",
    "status",
    "attempts",
    "protocol",
)
_KEY_COLUMNS = ("subgraph_hash", "backend", "backend_version", "hardware", "protocol")
#: how schema-1 rows read: the columns schema 2 added, as expressions over the old ones
_V1_EXPR = {
    "status": "(CASE WHEN valid = 1 THEN 'valid' WHEN error_text LIKE 'timeout%' OR error_text LIKE 'worker crashed%' "
    "THEN 'failed' ELSE 'invalid' END)",
    "attempts": "1",
    "protocol": f"'{LEGACY_PROTOCOL}'",
}
_COLS = ", ".join(_MEASUREMENT_COLUMNS)
_INSERT_MEASUREMENT = (
    f"INSERT OR IGNORE INTO measurements ({_COLS}) VALUES ({', '.join('?' * len(_MEASUREMENT_COLUMNS))})"
)
_INSERT_SUBGRAPH = "INSERT OR IGNORE INTO subgraphs (hash, onnx, n_nodes, ops) VALUES (?, ?, ?, ?)"

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
CREATE TABLE IF NOT EXISTS probes (
    hardware TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    protocol TEXT NOT NULL,
    probe_set INT NOT NULL,
    probe TEXT NOT NULL,
    median REAL,
    subgraph_hash TEXT NOT NULL,
    timestamp REAL NOT NULL,
    PRIMARY KEY (hardware, backend, backend_version, protocol, probe_set, probe)
);
"""
_MEASUREMENTS_TABLE = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS measurements"):_SCHEMA.index("CREATE INDEX")]
_PROBES_TABLE = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS probes"):]

T = TypeVar("T")


# ----------------------------------------------------------------------------- helpers


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy arrays and scalars
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=repr)
    if isinstance(o, (bytes, bytearray)):
        return o.hex()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    return repr(o)  # never lose a measurement over an odd value in ``extra``


def _json(o: Any) -> str:
    return json.dumps(o, default=_json_default, sort_keys=True)


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def _uri(path: Path, mode: str) -> str:
    return f"{path.absolute().as_uri()}?mode={mode}"


def _is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED (and their extended codes)
        return True
    msg = str(e).lower()
    return "database is locked" in msg or "database is busy" in msg or "database table is locked" in msg


@contextlib.contextmanager
def _immediate(c: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, rolled back when it raises."""
    c.execute("BEGIN IMMEDIATE")
    try:
        yield
        c.execute("COMMIT")
    except BaseException:
        if c.in_transaction:
            c.execute("ROLLBACK")
        raise


def _measurement_row(m: Measurement) -> tuple:
    if not isinstance(m, Measurement):
        raise TypeError(f"expected a Measurement, got {type(m).__name__}")
    k = m.key
    for name, v in (("subgraph_hash", k.subgraph_hash), ("backend", k.backend), ("hardware", m.hardware)):
        if not isinstance(v, str) or not v:
            raise ValueError(f"a measurement needs a non-empty string {name}, got {v!r}")
    if not isinstance(k.backend_version, str):
        raise ValueError(f"backend_version must be a string, got {k.backend_version!r}")
    return (
        k.subgraph_hash,
        k.backend,
        k.backend_version,
        m.hardware,
        int(bool(m.valid)),
        _opt_float(m.median),
        _opt_float(m.spread),
        _json([float(s) for s in m.samples]),
        _opt_float(m.compile_seconds),
        _opt_float(m.max_abs_error),
        _opt_float(m.max_rel_error),
        None if m.threads is None else int(m.threads),
        _json(dict(m.versions)),
        str(m.family or ""),
        str(m.error_text or ""),
        float(m.timestamp),
        _json(dict(m.extra)),
        m.status,
        max(1, int(m.attempts)),
        str(m.protocol),
    )


def _measurement_from_row(r: tuple) -> Measurement:
    (h, b, v, hw, valid, median, spread, samples, comp, abs_e, rel_e, threads, versions, family, err, ts, extra,
     status, attempts, protocol) = r
    return Measurement(
        key=CandidateKey(h, b, v),
        hardware=hw,
        valid=bool(valid),
        samples=json.loads(samples),
        median=median,
        spread=spread,
        compile_seconds=comp,
        max_abs_error=abs_e,
        max_rel_error=rel_e,
        threads=1 if threads is None else threads,
        versions=json.loads(versions),
        family=family,
        error_text=err,
        onnx_bytes=None,
        timestamp=ts,
        extra=json.loads(extra),
        failed=status == "failed",
        protocol=protocol,
        attempts=int(attempts),
    )


def _onnx_summary(data: bytes) -> tuple[int | None, str | None]:
    """(node count, comma-separated op types) of an ONNX model; (None, None) when it does not parse."""
    try:
        import onnx

        g = onnx.load_from_string(data).graph
        return len(g.node), ",".join(n.op_type for n in g.node)
    except Exception:
        return None, None


# ----------------------------------------------------------------------------- the database


def default_db_path() -> Path:
    """The per-user measurement database: ``<cache_dir()>/measurements.db``
    (``$COLLAGE_ML_CACHE/measurements.db``, else ``~/.cache/collage-ml/measurements.db``)."""
    from collage_ml.paths import cache_dir

    return cache_dir() / "measurements.db"


class Database(RecordTables):
    """A collage-ml measurement database (SQLite, WAL).

    ``Database(path)`` creates the file when missing (``create=False`` refuses to).
    ``readonly=True`` opens without any write (for shipped datasets).
    ``check=False`` skips ``PRAGMA quick_check`` on open.
    ``timeout`` is how long one attempt waits for another process's lock
    (SQLite's busy timeout); an attempt that still finds the database locked is
    retried, with backoff, and the operation gives up with
    :class:`DatabaseError` after ``retry_s`` seconds in all. ``retries`` counts
    the attempts that were retried.

    It may be shared between threads; each process opens its own.

    Boundary costs and plan timings have their own methods (:class:`~collage_ml.db.records.RecordTables`).
    ``legacy_boundaries_moved`` counts the old boundary rows this open moved out of the measurements.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        create: bool = True,
        *,
        readonly: bool = False,
        check: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        retry_s: float = DEFAULT_RETRY_S,
    ):
        self.path = Path(os.fspath(path))
        self.readonly = readonly
        self._timeout = float(timeout)
        self._retry_s = float(retry_s)
        self.retries = 0
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.schema_version = SCHEMA_VERSION
        self.legacy_boundaries_moved = 0
        self.last_merge: dict[str, int] = {}
        self._legacy = False  # old boundary rows still among the measurements (a read-only open)
        state = self._probe(create=create and not readonly, check=check)
        try:
            self._conn = sqlite3.connect(
                _uri(self.path, "ro" if readonly else "rwc"),
                uri=True,
                timeout=self._timeout,
                isolation_level=None,  # transactions are explicit
                check_same_thread=False,
            )
            if readonly:
                self._conn.execute("PRAGMA query_only = ON")
            else:
                self._retry(lambda: self._setup(new=state == "new"), "open")
            self._legacy = self._retry(
                lambda: self._conn.execute(f"SELECT 1 FROM measurements WHERE {LEGACY_RANGE} LIMIT 1").fetchone(),
                "open") is not None
        except sqlite3.Error as e:
            self.close()
            raise DatabaseError(f"{self.path}: cannot open the database ({e})") from e
        except BaseException:
            self.close()
            raise

    # -- opening

    def _fail(self, why: str) -> DatabaseError:
        return DatabaseError(f"{self.path}: {why}")

    def _probe(self, create: bool, check: bool) -> str:
        """Decide, without writing anything, whether the file is new ("new") or ours ("ours"); raise otherwise."""
        p = self.path
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
            conn = sqlite3.connect(_uri(p, "ro"), uri=True, timeout=self._timeout, isolation_level=None)
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
            if isinstance(e, sqlite3.OperationalError) and not _is_busy(e) and "malformed" not in str(e):
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
                c.execute(_PROBES_TABLE)  # a schema-2 file from before the probes table
            self._setup_records(c)
            return
        with _immediate(c):
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
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
            with _immediate(c):
                create_record_tables(c)
        if c.execute(f"SELECT 1 FROM measurements WHERE {LEGACY_RANGE} LIMIT 1").fetchone() is None:
            return
        with _immediate(c):  # all of them or none; each is checked in its new table before it is deleted
            rows = c.execute(f"SELECT id, {_COLS} FROM measurements WHERE {LEGACY_RANGE} ORDER BY id").fetchall()
            self.legacy_boundaries_moved = move_legacy_boundaries(
                c, [(r[0], _measurement_from_row(tuple(r[1:]))) for r in rows])

    def _legacy_boundaries(self) -> bool:
        return self._legacy

    def _legacy_boundary_records(self) -> list[BoundaryCost]:
        """The old boundary rows still among the measurements (a read-only open of an unmoved file), as records."""
        rows = self._read(
            lambda c: c.execute(f"SELECT {self._cols} FROM measurements WHERE {LEGACY_RANGE} ORDER BY id").fetchall(),
            "boundaries")
        return [b for b in (boundary_from_legacy(_measurement_from_row(tuple(r))) for r in rows) if b is not None]

    def _migrate(self, c: sqlite3.Connection) -> None:
        """Schema 1 -> 2 in one transaction: every row kept; status, attempts and protocol derived."""
        with _immediate(c):
            version = int(c.execute("PRAGMA user_version").fetchone()[0])
            if version < SCHEMA_VERSION:  # another process may have migrated it meanwhile
                old = ", ".join(col for col in _MEASUREMENT_COLUMNS if col not in _V1_EXPR)
                derived = ", ".join(_V1_EXPR[col] for col in _MEASUREMENT_COLUMNS if col in _V1_EXPR)
                n = c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                c.execute(_MEASUREMENTS_TABLE.replace("TABLE IF NOT EXISTS measurements", "TABLE measurements_v2"))
                c.execute(
                    f"INSERT INTO measurements_v2 (id, {_COLS}) SELECT id, {old}, {derived} FROM measurements ORDER BY id"
                )
                if c.execute("SELECT COUNT(*) FROM measurements_v2").fetchone()[0] != n:  # pragma: no cover
                    raise sqlite3.DatabaseError("migration would lose rows")
                c.execute("DROP TABLE measurements")
                c.execute("ALTER TABLE measurements_v2 RENAME TO measurements")
                c.execute("CREATE INDEX IF NOT EXISTS measurements_by_hardware ON measurements (hardware, backend)")
                c.execute(_PROBES_TABLE)
                c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self.schema_version = SCHEMA_VERSION

    def _col(self, name: str) -> str:
        """The SQL for a measurements column in this file (schema-1 files derive the newer ones)."""
        return _V1_EXPR.get(name, name) if self.schema_version < 2 else name

    @property
    def _cols(self) -> str:
        return ", ".join(self._col(c) for c in _MEASUREMENT_COLUMNS)

    # -- plumbing

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise self._fail("the database is closed")
        return self._conn

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` under the lock; retry it while the database is locked by another process."""
        deadline = time.monotonic() + self._retry_s
        delay = 0.005
        while True:
            with self._lock:
                try:
                    return fn()
                except sqlite3.Error as e:
                    if not _is_busy(e):
                        raise self._fail(f"{what} failed ({e})") from e
                    if time.monotonic() > deadline:
                        raise self._fail(f"{what} failed: still locked by another process after {self._retry_s:g} s") from e
                    self.retries += 1
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.25)

    def _write(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction, retried as a whole when locked."""
        if self.readonly:
            raise self._fail(f"{what}: the database was opened read-only")

        def attempt() -> T:
            c = self._connection()
            with _immediate(c):
                return fn(c)

        return self._retry(attempt, what)

    def _read(self, fn: Callable[[sqlite3.Connection], T], what: str) -> T:
        return self._retry(lambda: fn(self._connection()), what)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                finally:
                    self._conn = None

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Database({str(self.path)!r}{', closed' if self._conn is None else ''})"

    # -- writing

    def register_hardware(self, fingerprint: str, info: dict) -> bool:
        """Record what a fingerprint stands for; the first description of a fingerprint is kept. True if new."""
        if not isinstance(fingerprint, str) or not fingerprint:
            raise ValueError(f"a hardware fingerprint must be a non-empty string, got {fingerprint!r}")
        data = _json(info)
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
        n_nodes, ops = _onnx_summary(data)
        return (subgraph_hash, data, n_nodes, ops)

    def add_subgraph(self, subgraph_hash: str, onnx_bytes: bytes) -> bool:
        """Store a subgraph's ONNX once per hash (no measurement needed). True if it was new."""
        row = self._subgraph_row(subgraph_hash, onnx_bytes)
        if row is None:
            return False
        return self._write(lambda c: c.execute(_INSERT_SUBGRAPH, row).rowcount == 1, "add_subgraph")

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
        row = _measurement_row(m)
        sub = self._subgraph_row(m.key.subgraph_hash, m.onnx_bytes)

        def tx(c: sqlite3.Connection) -> bool:
            if sub is not None:
                c.execute(_INSERT_SUBGRAPH, sub)
            if c.execute(_INSERT_MEASUREMENT, row).rowcount == 1:
                return True
            return self._replace_failed(c, row)

        return self._write(tx, "commit")

    @staticmethod
    def _replace_failed(c: sqlite3.Connection, row: tuple) -> bool:
        """Inside a transaction: ``row``'s key exists; replace it if that row is not settled. True if it changed.

        A ``failed`` row gives way to any later result (a later failure adds one to its attempts). A valid row
        timed under contention (``extra.contended``) with attempts left gives way to a later valid one only;
        the replaced timing is kept in the new row's ``extra["earlier"]``, so nothing measured is lost. A
        later failure of a contended row only counts the attempt."""
        cols = dict(zip(_MEASUREMENT_COLUMNS, row))
        where = " AND ".join(f"{k} = ?" for k in _KEY_COLUMNS)
        key = [cols[k] for k in _KEY_COLUMNS]
        old = c.execute(f"SELECT attempts, status, extra, median, timestamp FROM measurements WHERE {where}",
                        key).fetchone()
        if old is None:
            return False
        attempts, status, extra_text, median, ts = old
        if status != "failed":
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
                            "contended": True})
            new_extra["earlier"] = earlier
            cols["extra"] = _json(new_extra)
        cols["attempts"] = int(attempts) + 1
        sets = ", ".join(f"{k} = ?" for k in _MEASUREMENT_COLUMNS if k not in _KEY_COLUMNS)
        vals = [cols[k] for k in _MEASUREMENT_COLUMNS if k not in _KEY_COLUMNS]
        return c.execute(f"UPDATE measurements SET {sets} WHERE {where}", (*vals, *key)).rowcount == 1

    def commit_many(self, ms: Iterable[Measurement]) -> int:
        """Commit many measurements in one transaction (all or none). Returns how many were new.
        Old-shaped boundary costs among them are stored as boundary costs (see :meth:`commit`)."""
        ms = list(ms)
        bounds = [boundary_row(b) for b in (boundary_from_legacy(m) for m in ms if isinstance(m, Measurement))
                  if b is not None]
        if bounds:
            ms = [m for m in ms if boundary_from_legacy(m) is None]
        rows = [_measurement_row(m) for m in ms]
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
                c.executemany(_INSERT_SUBGRAPH, list(subs.values()))
            n = 0
            for row in bounds:
                n += put_boundary(c, row)
            for row in rows:
                n += c.execute(_INSERT_MEASUREMENT, row).rowcount == 1 or self._replace_failed(c, row)
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
        return None if row is None else _measurement_from_row(row)

    def has(self, key: CandidateKey, hardware: str, protocol: str | None = None) -> bool:
        where, args = self._key_where(key, hardware, protocol)
        return self._read(lambda c: c.execute(f"SELECT 1 FROM measurements WHERE {where}", args).fetchone(), "has") is not None

    def known_keys(self, hardware: str, protocol: str | None = None) -> set[tuple[str, str, str]]:
        """Every ``(subgraph_hash, backend, backend_version)`` settled on ``hardware`` under ``protocol``
        (default: the current one): valid, invalid, or failed with no attempts left. A failed key, or a valid
        one timed under contention, with attempts left is not settled: the next run measures it again."""
        status, attempts = self._col("status"), self._col("attempts")
        contended = "COALESCE(json_extract(extra, '$.contended'), 0)"
        return self._read(
            lambda c: {
                tuple(r)
                for r in c.execute(
                    f"SELECT subgraph_hash, backend, backend_version FROM measurements WHERE hardware = ? "
                    f"AND {self._col('protocol')} = ? AND (({status} != 'failed' AND NOT ({status} = 'valid' AND "
                    f"{contended})) OR {attempts} >= ?)",
                    (hardware, protocol or PROTOCOL, MAX_ATTEMPTS),
                )
            },
            "known_keys",
        )

    def _where(
        self, hardware: str | None, backend: str | None, valid: bool | None, family: str | None,
        protocol: str | None = None, status: str | None = None,
    ) -> tuple[str, list]:
        conds, args = [], []
        for col, val in (("hardware", hardware), ("backend", backend), ("family", family), ("protocol", protocol),
                         ("status", status)):
            if val is not None:
                conds.append(f"{self._col(col)} = ?")
                args.append(val)
        if valid is not None:
            conds.append("valid = ?")
            args.append(int(bool(valid)))
        if self._legacy:  # old boundary rows are boundary costs, not measurements
            conds.append(f"NOT {LEGACY_RANGE}")
        return (" AND ".join(conds) or "1"), args

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
                yield _measurement_from_row(r[1:])
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

    # -- probes

    def commit_probe(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int, probe: str,
        median: float | None, subgraph_hash: str,
    ) -> bool:
        """Record one probe result (None: the backend cannot run it); the first one of its key stays. True if new."""
        row = (hardware, backend, backend_version, protocol, int(probe_set), probe, _opt_float(median), subgraph_hash,
               time.time())
        return self._write(
            lambda c: c.execute("INSERT OR IGNORE INTO probes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row).rowcount == 1,
            "commit_probe",
        )

    def probes(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int,
    ) -> dict[str, float | None]:
        """{probe: seconds or None} recorded for that machine, backend, protocol and probe-set version."""

        def q(c: sqlite3.Connection) -> dict[str, float | None]:
            try:
                rows = c.execute(
                    "SELECT probe, median FROM probes WHERE hardware = ? AND backend = ? AND backend_version = ? "
                    "AND protocol = ? AND probe_set = ?",
                    (hardware, backend, backend_version, protocol, int(probe_set)),
                ).fetchall()
            except sqlite3.OperationalError as e:  # a schema-1 file read-only: it has no probes
                if "no such table" in str(e):
                    return {}
                raise
            return dict(rows)

        return self._read(q, "probes")

    def probe_table(self, hardware: str, probe_set: int) -> dict[str, dict[str, float | None]]:
        """{backend: {probe: seconds or None}} recorded for one machine and probe-set version, whatever the
        backend version and protocol; where a backend has several, the group with the newest result wins."""

        def q(c: sqlite3.Connection) -> list[tuple]:
            try:
                return c.execute(
                    "SELECT backend, backend_version, protocol, probe, median, timestamp FROM probes "
                    "WHERE hardware = ? AND probe_set = ?",
                    (hardware, int(probe_set)),
                ).fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return []
                raise

        groups: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for backend, version, protocol, probe, median, ts in self._read(q, "probe_table"):
            g = groups.setdefault(backend, {}).setdefault((version, protocol), {"t": 0.0, "values": {}})
            g["values"][probe] = median
            g["t"] = max(g["t"], float(ts))
        return {b: dict(max(gs.values(), key=lambda g: g["t"])["values"]) for b, gs in groups.items()}

    def stats(self, hardware: str | None = None) -> dict[str, Any]:
        """Counts: ``total``, ``valid``, ``invalid``, ``failed``, ``subgraphs`` (distinct hashes measured),
        ``onnx_stored`` (subgraphs with ONNX bytes, whole file), and per-``backends``,
        per-``families``, per-``hardware`` and per-``protocols`` row counts: all of candidate measurements.
        The records of other kinds: ``boundaries`` (boundary costs, any status) and ``plan_timings``
        (plans judged end to end), and ``boundaries_valid`` and ``plan_timings_valid``."""
        where, args = self._where(hardware, None, None, None)
        records = self.record_counts(hardware=hardware)
        valid_records = self.record_counts(hardware=hardware, valid=True)

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

            n_failed = c.execute(
                f"SELECT COUNT(*) FROM measurements WHERE {where} AND {self._col('status')} = 'failed'", args
            ).fetchone()[0]
            return {
                "total": total,
                "valid": n_valid,
                "invalid": total - n_valid - n_failed,
                "failed": n_failed,
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
            }

        return self._read(q, "stats")

    # -- merge and export

    def merge(self, other_path: str | os.PathLike) -> int:
        """Add every measurement, subgraph, hardware, probe, boundary and plan-timing row of another database
        that this one lacks.

        Returns the number of measurements added or upgraded (``last_merge`` also counts the ``boundaries``
        added or upgraded and the ``plan_runs`` added). Idempotent; on a key clash it keeps the existing row,
        except that a ``failed`` row here gives way to the other file's valid or invalid one, and a plan timing
        gains the other file's runs it lacks. The other file is only read (a schema-1 file is read as if
        migrated; its old boundary rows come across as boundary costs). A foreign, corrupt or newer file raises
        :class:`DatabaseError`.
        """
        other = Path(os.fspath(other_path))
        if self.readonly:
            raise self._fail("merge: the database was opened read-only")
        if other.exists() and self.path.exists() and os.path.samefile(other, self.path):
            return 0
        probe = Database(other, create=False, readonly=True)  # validates it, read-only
        try:
            other_has_probes = probe.schema_version >= 2
            other_cols = ", ".join(
                f"{_V1_EXPR[c]} AS {c}" if probe.schema_version < 2 and c in _V1_EXPR else c
                for c in _MEASUREMENT_COLUMNS
            )
            # the records of other kinds are few: read them (old boundary rows included) before attaching
            other_boundaries = [boundary_row(b) for b in probe.boundaries(valid=None)]
            other_plans = probe.plan_timings()
        finally:
            probe.close()
        c = self._connection()
        with self._lock:
            self._retry(lambda: c.execute("ATTACH DATABASE ? AS other", (_uri(other, "ro"),)), "merge")
            try:

                def tx(c: sqlite3.Connection) -> int:
                    c.execute("INSERT OR IGNORE INTO main.hardware (fingerprint, info) SELECT fingerprint, info FROM other.hardware")
                    c.execute(
                        "INSERT OR IGNORE INTO main.subgraphs (hash, onnx, n_nodes, ops) "
                        "SELECT hash, onnx, n_nodes, ops FROM other.subgraphs"
                    )
                    added = c.execute(
                        f"INSERT OR IGNORE INTO main.measurements ({_COLS}) SELECT {other_cols} FROM other.measurements "
                        f"WHERE NOT {LEGACY_RANGE} ORDER BY id"
                    ).rowcount
                    n_bound = sum(put_boundary(c, row, "main.") for row in other_boundaries)
                    n_runs = sum(put_plan(c, p, "main.") for p in other_plans)
                    self.last_merge = {"measurements": added, "boundaries": n_bound, "plan_runs": n_runs}
                    if other_has_probes:
                        c.execute("INSERT OR IGNORE INTO main.probes SELECT * FROM other.probes")
                    # a failed row here gives way to the other file's settled one
                    failed = c.execute(
                        "SELECT subgraph_hash, backend, backend_version, hardware, protocol FROM main.measurements "
                        "WHERE status = 'failed'"
                    ).fetchall()
                    if failed:
                        sel = f"SELECT {other_cols} FROM other.measurements"
                        cond = " AND ".join(f"{k} = ?" for k in _KEY_COLUMNS)
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
        names = ["id", *_MEASUREMENT_COLUMNS]
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
