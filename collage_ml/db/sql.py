"""SQLite plumbing shared by the store's modules: JSON text, URIs, lock errors and transactions."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def to_json(o: Any) -> str:
    """``o`` as JSON text (keys sorted); a value JSON has no type for is stored as near as it can be."""
    return json.dumps(o, default=_json_default, sort_keys=True)


def opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def file_uri(path: Path, mode: str) -> str:
    return f"{path.absolute().as_uri()}?mode={mode}"


def is_busy(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED (and their extended codes)
        return True
    msg = str(e).lower()
    return "database is locked" in msg or "database is busy" in msg or "database table is locked" in msg


@contextlib.contextmanager
def immediate(c: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, rolled back when it raises."""
    c.execute("BEGIN IMMEDIATE")
    try:
        yield
        c.execute("COMMIT")
    except BaseException:
        if c.in_transaction:
            c.execute("ROLLBACK")
        raise
