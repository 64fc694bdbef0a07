"""The probe set's results per machine and backend (``measure.probes``), records of their own kind.

A *calibration* is the probe set measured once, in one sitting. The first calibration of a (machine,
backend, backend version, protocol, probe-set version) lives in ``probes``, where it also marks the machine
as calibrated; each later one, measured because the first grew old (``measure.probes.recalibrate``) or
brought in by ``db merge``, lives in ``recalibrations`` under its own ``sitting`` (when it started).
:meth:`ProbeTable.calibrations` lists them all, so a row can be read against the calibration of its own
sitting (``models.dataset``), and :meth:`ProbeTable.probes` / :meth:`ProbeTable.probe_table` give the
newest, the one that describes the machine now. ``probe_nodes`` says which machine (``measure.hardware.node_id``:
one boot of one VM) measured each probe result, where that was recorded: machines of one kind share a
fingerprint, so a row measured on one of them is read against that one's calibration.
"""

from __future__ import annotations

import sqlite3
import time
from typing import NamedTuple

from collage_ml.db.sql import no_table, opt_float


_COLUMNS = """
    hardware TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    protocol TEXT NOT NULL,
    probe_set INT NOT NULL,
    probe TEXT NOT NULL,
    median REAL,
    subgraph_hash TEXT NOT NULL,
    timestamp REAL NOT NULL,"""
_KEY = "hardware, backend, backend_version, protocol, probe_set"
PROBES_TABLE = f"CREATE TABLE IF NOT EXISTS probes ({_COLUMNS}\n    PRIMARY KEY ({_KEY}, probe)\n)"
RECALIBRATIONS_TABLE = (f"CREATE TABLE IF NOT EXISTS recalibrations ({_COLUMNS}\n    sitting REAL NOT NULL,\n"
                        f"    PRIMARY KEY ({_KEY}, sitting, probe)\n)")
#: which machine measured a probe result: the result's key and time (as ``probes`` and ``recalibrations`` keep
#: them, through ``db merge`` too) and the node (additive: a file without it reads as "node unknown")
PROBE_NODES_TABLE = ("CREATE TABLE IF NOT EXISTS probe_nodes (\n    hardware TEXT NOT NULL,\n    backend TEXT NOT NULL,\n"
                     "    backend_version TEXT NOT NULL,\n    protocol TEXT NOT NULL,\n    probe_set INT NOT NULL,\n"
                     "    probe TEXT NOT NULL,\n    timestamp REAL NOT NULL,\n    node TEXT NOT NULL,\n"
                     f"    PRIMARY KEY ({_KEY}, probe, timestamp)\n)")
#: each calibration's check (``measure.probes``: the probe set measured twice): per backend, how many passes it
#: took and the second pass / the first at the median over the backend's probes (additive, like ``probe_nodes``)
PROBE_CHECKS_TABLE = ("CREATE TABLE IF NOT EXISTS probe_checks (\n    hardware TEXT NOT NULL,\n    backend TEXT NOT NULL,\n"
                      "    backend_version TEXT NOT NULL,\n    protocol TEXT NOT NULL,\n    probe_set INT NOT NULL,\n"
                      "    timestamp REAL NOT NULL,\n    node TEXT,\n    passes INT NOT NULL,\n    ratio REAL,\n"
                      f"    PRIMARY KEY ({_KEY}, timestamp)\n)")
#: a first calibration's row and a later one's (``main.``: the file itself, also while another is attached)
_INSERT_FIRST = f"INSERT OR IGNORE INTO main.probes VALUES ({', '.join('?' * 9)})"
_INSERT_LATER = f"INSERT OR IGNORE INTO main.recalibrations VALUES ({', '.join('?' * 10)})"
_INSERT_NODE = f"INSERT OR IGNORE INTO main.probe_nodes VALUES ({', '.join('?' * 8)})"


class Calibration(NamedTuple):
    """One backend's probe set as measured in one sitting."""

    backend: str
    backend_version: str
    protocol: str
    time: float  # when its newest result was recorded
    values: dict  # {probe: seconds, or None where the backend cannot run it}
    sitting: float | None  # None: the first calibration (the ``probes`` table)
    node: str | None = None  # the machine that measured it (``measure.hardware.node_id``); None: not recorded


class ProbeTable:
    """The ``probes`` and ``recalibrations`` tables: the part of :class:`~collage_ml.db.Database` that keeps
    probe results. Needs ``_read`` and ``_write`` from the class it is mixed into."""

    def commit_probe(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int, probe: str,
        median: float | None, subgraph_hash: str, sitting: float | None = None, node: str | None = None,
    ) -> bool:
        """Record one probe result (None: the backend cannot run it) of the first calibration, or, with
        ``sitting`` (when that calibration started), of a later one, and the ``node`` that measured it. The
        first result of a key stays. True if new."""
        now = time.time()
        row = (hardware, backend, backend_version, protocol, int(probe_set), probe, opt_float(median), subgraph_hash,
               now)
        if sitting is None:
            sql = _INSERT_FIRST
        else:
            sql, row = _INSERT_LATER, (*row, float(sitting))

        def write(c: sqlite3.Connection) -> bool:
            new = c.execute(sql, row).rowcount == 1
            if new and node is not None:
                c.execute(_INSERT_NODE, (*row[:6], now, str(node)))
            return new

        return self._write(write, "commit_probe")

    def commit_probe_check(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int, passes: int,
        ratio: float | None, node: str | None = None,
    ) -> None:
        """Record how one backend's calibration checked out: ``passes`` over the probe set, and the second pass /
        the first (the median over its probes; None: one pass)."""
        row = (hardware, backend, backend_version, protocol, int(probe_set), time.time(), node, int(passes),
               opt_float(ratio))
        self._write(lambda c: c.execute(f"INSERT OR IGNORE INTO main.probe_checks VALUES ({', '.join('?' * 9)})", row),
                    "commit_probe_check")

    def probe_checks(self, hardware: str | None = None) -> list[dict]:
        """Every calibration check recorded (of one machine where given), oldest first."""
        cond, params = ("WHERE hardware = ?", (hardware,)) if hardware else ("", ())
        cols = ("hardware", "backend", "backend_version", "protocol", "probe_set", "timestamp", "node", "passes", "ratio")
        rows = self._select(f"SELECT {', '.join(cols)} FROM probe_checks {cond} ORDER BY timestamp", params,
                            "probe_checks")
        return [dict(zip(cols, r)) for r in rows]

    def _select(self, sql: str, params: tuple, what: str) -> list[tuple]:
        """The rows of a query; none from a file without the table (an older file opened read-only)."""

        def q(c: sqlite3.Connection) -> list[tuple]:
            try:
                return c.execute(sql, params).fetchall()
            except sqlite3.OperationalError as e:
                if no_table(e):
                    return []
                raise

        return self._read(q, what)

    def calibrations(
        self, hardware: str, probe_set: int, backend: str | None = None, backend_version: str | None = None,
        protocol: str | None = None,
    ) -> list[Calibration]:
        """Every calibration of one machine and probe-set version (narrowed to a backend, version and protocol
        where given), oldest first."""
        cond, params = "hardware = ? AND probe_set = ?", [hardware, int(probe_set)]
        for col, v in (("backend", backend), ("backend_version", backend_version), ("protocol", protocol)):
            if v is not None:
                cond += f" AND {col} = ?"
                params.append(v)
        cols = "backend, backend_version, protocol, probe, median, timestamp"
        rows = [(*r, None) for r in self._select(f"SELECT {cols} FROM probes WHERE {cond}", tuple(params), "calibrations")]
        rows += self._select(f"SELECT {cols}, sitting FROM recalibrations WHERE {cond}", tuple(params), "calibrations")
        nodes = {(b, v, p, probe, float(ts)): node for b, v, p, probe, ts, node in self._select(
            f"SELECT backend, backend_version, protocol, probe, timestamp, node FROM probe_nodes WHERE {cond}",
            tuple(params), "calibrations")}
        groups: dict[tuple, dict] = {}
        for b, version, proto, probe, median, ts, sitting in rows:
            g = groups.setdefault((b, version, proto, sitting), {"t": 0.0, "values": {}, "nodes": set()})
            g["values"][probe] = median
            g["t"] = max(g["t"], float(ts))
            g["nodes"].add(nodes.get((b, version, proto, probe, float(ts))))
        # a calibration's node: the one every result names (a first calibration completed on another boot: None)
        out = [Calibration(b, v, p, g["t"], g["values"], s, next(iter(g["nodes"])) if len(g["nodes"]) == 1 else None)
               for (b, v, p, s), g in groups.items()]
        return sorted(out, key=lambda c: (c.time, c.backend))

    def calibration_counts(self) -> dict[str, dict[str, float]]:
        """{fingerprint: {"sittings": calibrations of any backend, "newest": when the newest ended, "checked":
        backends' calibrations checked by a second pass, "third_pass": of them measured a third time}}."""
        out: dict[str, dict[str, float]] = {}
        for table, sittings in (("probes", "1"), ("recalibrations", "COUNT(DISTINCT sitting)")):
            for hw, n, t in self._select(f"SELECT hardware, {sittings}, MAX(timestamp) FROM {table} GROUP BY hardware",
                                         (), "calibration_counts"):
                c = out.setdefault(hw, {"sittings": 0, "newest": 0.0, "checked": 0, "third_pass": 0})
                c["sittings"] += int(n)
                c["newest"] = max(c["newest"], float(t))
        for hw, checked, third in self._select("SELECT hardware, SUM(passes >= 2), SUM(passes >= 3) FROM probe_checks "
                                               "GROUP BY hardware", (), "calibration_counts"):
            if hw in out:
                out[hw].update(checked=int(checked or 0), third_pass=int(third or 0))
        return out

    def probes(
        self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int,
    ) -> dict[str, float | None]:
        """{probe: seconds or None} of that machine, backend, protocol and probe-set version: the newest
        calibration's, over the first one's where a later calibration lacks a probe."""
        out: dict[str, float | None] = {}
        for cal in self.calibrations(hardware, probe_set, backend, backend_version, protocol):
            out.update(cal.values)
        return out

    def probe_time(self, hardware: str, backend: str, backend_version: str, protocol: str, probe_set: int) -> float | None:
        """When that machine and backend were last calibrated (the newest result's time), or None."""
        cals = self.calibrations(hardware, probe_set, backend, backend_version, protocol)
        return cals[-1].time if cals else None

    def probe_table(self, hardware: str, probe_set: int) -> dict[str, dict[str, float | None]]:
        """{backend: {probe: seconds or None}} of one machine and probe-set version, whatever the backend
        version and protocol: each backend's newest calibration."""
        out: dict[str, dict[str, float | None]] = {}
        for cal in self.calibrations(hardware, probe_set):  # oldest first: the newest stays
            out[cal.backend] = dict(cal.values)
        return out


def merge_calibrations(c: sqlite3.Connection, other: str = "other") -> int:
    """Copies the calibrations of the attached database ``other`` into ``main`` (inside the caller's
    transaction); returns how many calibrations (key and sitting) were new here.

    A first calibration whose key ``main`` lacks stays a first calibration; one whose key ``main`` has already
    becomes a recalibration, its sitting the time of its first result, so a merged database keeps every
    sitting's calibration (the rows collected in it are read against it). Later calibrations come across as
    they are. A calibration ``main`` holds already (the same results, at the same times) is not copied twice.
    """
    have_tables = {r[0] for r in c.execute(f"SELECT name FROM {other}.sqlite_master WHERE type = 'table'")}
    if "probes" not in have_tables:
        return 0
    firsts = c.execute(f"SELECT * FROM {other}.probes").fetchall()
    laters = c.execute(f"SELECT * FROM {other}.recalibrations").fetchall() if "recalibrations" in have_tables else []
    main_first = {tuple(r) for r in c.execute("SELECT hardware, backend, backend_version, protocol, probe_set, probe, "
                                              "timestamp FROM main.probes")}
    main_keys = {r[:5] for r in main_first}
    groups: dict[tuple, list[tuple]] = {}
    for r in firsts:
        groups.setdefault(tuple(r[:5]), []).append(tuple(r))
    new: set[tuple] = set()
    for key, rows in groups.items():
        if key not in main_keys:
            for r in rows:
                if c.execute(_INSERT_FIRST, r).rowcount:
                    new.add((*key, None))
        else:
            sitting = min(float(r[8]) for r in rows)
            laters += [(*r, sitting) for r in rows]
    for r in laters:
        if (*r[:6], r[8]) in main_first:  # main's own first calibration, come back
            continue
        if c.execute(_INSERT_LATER, r).rowcount:
            new.add((*r[:5], r[9]))
    if "probe_nodes" in have_tables:  # keyed by each result's own key and time, which the copies above keep
        c.execute(f"INSERT OR IGNORE INTO main.probe_nodes SELECT * FROM {other}.probe_nodes")
    if "probe_checks" in have_tables:
        c.execute(f"INSERT OR IGNORE INTO main.probe_checks SELECT * FROM {other}.probe_checks")
    return len(new)
