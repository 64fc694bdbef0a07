"""SQLite plumbing shared by the store's modules: JSON text, URIs, lock errors, transactions, WHERE clauses,
and the one rule for replacing a ``failed`` row."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


def no_table(e: sqlite3.OperationalError) -> bool:
    """Whether ``e`` says a table is missing (a read-only open of an older file that lacks it)."""
    return "no such table" in str(e)


def where_clause(columns: Iterable[tuple[str, Any]], valid: bool | None = None,
                 also: Iterable[str] = ()) -> tuple[str, list[Any]]:
    """A WHERE clause and its arguments: ``column = value`` for each value given, ``valid`` when given, and
    the conditions ``also``."""
    conds, args = [], []
    for col, v in columns:
        if v is not None:
            conds.append(f"{col} = ?")
            args.append(v)
    if valid is not None:
        conds.append("valid = ?")
        args.append(int(bool(valid)))
    conds.extend(also)
    return " AND ".join(conds) or "1", args


def key_where(key_columns: Iterable[str]) -> str:
    """``a = ? AND b = ? ...``: the row of one key."""
    return " AND ".join(f"{k} = ?" for k in key_columns)


def overwrite(c: sqlite3.Connection, table: str, columns: Sequence[str], key_columns: Sequence[str],
              values: Mapping[str, Any]) -> bool:
    """Inside a transaction: set every column but the key's of ``table``'s row of ``values``' key to
    ``values``. True if it changed."""
    rest = [k for k in columns if k not in key_columns]
    sets = ", ".join(f"{k} = ?" for k in rest)
    return c.execute(f"UPDATE {table} SET {sets} WHERE {key_where(key_columns)}",
                     (*[values[k] for k in rest], *[values[k] for k in key_columns])).rowcount == 1


def replace_failed(c: sqlite3.Connection, table: str, columns: Sequence[str], key_columns: Sequence[str],
                   row: tuple) -> bool:
    """Inside a transaction: where the stored row of ``row``'s key is ``failed``, ``row`` replaces it, with
    one more attempt counted (so a later failure counts an attempt, and a settled result takes its place).
    True if it changed; False when that key holds no failed row. ``table`` has ``status`` and ``attempts``."""
    values = dict(zip(columns, row))
    old = c.execute(f"SELECT attempts FROM {table} WHERE {key_where(key_columns)} AND status = 'failed'",
                    [values[k] for k in key_columns]).fetchone()
    if old is None:
        return False
    values["attempts"] = int(old[0]) + 1
    return overwrite(c, table, columns, key_columns, values)
