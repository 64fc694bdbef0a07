"""The :class:`Database`: a file opened once, its lock, and one transaction per write, retried while locked.

Its methods come from the mixins beside it, one concern each: :class:`~collage_ml.db.schema.Schema`
(opening, checks, setup, migration), :class:`~collage_ml.db.measurements.MeasurementTables`,
:class:`~collage_ml.db.probes.ProbeTable`, :class:`~collage_ml.db.records.RecordTables` (boundary
costs and plan timings), :class:`~collage_ml.db.merge.Merge` and
:class:`~collage_ml.db.export.ParquetExport`. The rules they keep are in :mod:`collage_ml.db`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

from collage_ml.db.export import ParquetExport
from collage_ml.db.measurements import MeasurementTables
from collage_ml.db.merge import Merge
from collage_ml.db.probes import ProbeTable
from collage_ml.db.records import LEGACY_RANGE, RecordTables
from collage_ml.db.schema import SCHEMA_VERSION, Schema
from collage_ml.db.sql import file_uri, immediate, is_busy
from collage_ml.errors import DatabaseError

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRY_S = 120.0

T = TypeVar("T")


def default_db_path() -> Path:
    """The per-user measurement database: ``<cache_dir()>/measurements.db``
    (``$COLLAGE_ML_CACHE/measurements.db``, else ``~/.cache/collage-ml/measurements.db``)."""
    from collage_ml.paths import cache_dir

    return cache_dir() / "measurements.db"


class Database(Schema, MeasurementTables, ProbeTable, Merge, ParquetExport, RecordTables):
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
                file_uri(self.path, "ro" if readonly else "rwc"),
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
                    if not is_busy(e):
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
            with immediate(c):
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
