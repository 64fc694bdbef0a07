"""The probe set's results per machine and backend (``measure.probes``), a record of their own kind."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from collage_ml.db.sql import no_table, opt_float

#: the WHERE clause of one machine, backend, backend version, protocol and probe-set version
_KEY = "hardware = ? AND backend = ? AND backend_version = ? AND protocol = ? AND probe_set = ?"


class ProbeTable:
    """The ``probes`` table: the part of :class:`~collage_ml.db.Database` that keeps probe results.
    Needs ``_read`` and ``_write`` from the class it is mixed into."""

    def commit_probe(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int, probe: str,
        median: float | None, subgraph_hash: str,
    ) -> bool:
        """Record one probe result (None: the backend cannot run it); the first one of its key stays. True if new."""
        row = (hardware, backend, backend_version, protocol, int(probe_set), probe, opt_float(median), subgraph_hash,
               time.time())
        return self._write(
            lambda c: c.execute("INSERT OR IGNORE INTO probes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row).rowcount == 1,
            "commit_probe",
        )

    def _select(self, sql: str, params: tuple, what: str) -> list[tuple]:
        """The rows of a query on the ``probes`` table; none from a file without it (a schema-1 file read-only)."""

        def q(c: sqlite3.Connection) -> list[tuple]:
            try:
                return c.execute(sql, params).fetchall()
            except sqlite3.OperationalError as e:
                if no_table(e):
                    return []
                raise

        return self._read(q, what)

    def probes(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int,
    ) -> dict[str, float | None]:
        """{probe: seconds or None} recorded for that machine, backend, protocol and probe-set version."""
        return dict(self._select(f"SELECT probe, median FROM probes WHERE {_KEY}",
                                 (hardware, backend, backend_version, protocol, int(probe_set)), "probes"))

    def probe_time(self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int) -> float | None:
        """When that machine and backend's stored probes were measured (the newest result's time), or None."""
        rows = self._select(f"SELECT MAX(timestamp) FROM probes WHERE {_KEY}",
                            (hardware, backend, backend_version, protocol, int(probe_set)), "probe_time")
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def probe_table(self, hardware: str, probe_set: int) -> dict[str, dict[str, float | None]]:
        """{backend: {probe: seconds or None}} recorded for one machine and probe-set version, whatever the
        backend version and protocol; where a backend has several, the group with the newest result wins."""
        rows = self._select("SELECT backend, backend_version, protocol, probe, median, timestamp FROM probes "
                            "WHERE hardware = ? AND probe_set = ?", (hardware, int(probe_set)), "probe_table")
        groups: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        for backend, version, protocol, probe, median, ts in rows:
            g = groups.setdefault(backend, {}).setdefault((version, protocol), {"t": 0.0, "values": {}})
            g["values"][probe] = median
            g["t"] = max(g["t"], float(ts))
        return {b: dict(max(gs.values(), key=lambda g: g["t"])["values"]) for b, gs in groups.items()}
