"""The measurements table's row: its columns, its key, and the conversion to and from a
:class:`~collage_ml.cost.Measurement`."""

from __future__ import annotations

import json

from collage_ml.cost import CandidateKey, Measurement
from collage_ml.db.sql import opt_float, to_json

MEASUREMENT_COLUMNS = (
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
KEY_COLUMNS = ("subgraph_hash", "backend", "backend_version", "hardware", "protocol")

COLS = ", ".join(MEASUREMENT_COLUMNS)
INSERT_MEASUREMENT = (
    f"INSERT OR IGNORE INTO measurements ({COLS}) VALUES ({', '.join('?' * len(MEASUREMENT_COLUMNS))})"
)
INSERT_SUBGRAPH = "INSERT OR IGNORE INTO subgraphs (hash, onnx, n_nodes, ops) VALUES (?, ?, ?, ?)"


def measurement_row(m: Measurement) -> tuple:
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
        opt_float(m.median),
        opt_float(m.spread),
        to_json([float(s) for s in m.samples]),
        opt_float(m.compile_seconds),
        opt_float(m.max_abs_error),
        opt_float(m.max_rel_error),
        None if m.threads is None else int(m.threads),
        to_json(dict(m.versions)),
        str(m.family or ""),
        str(m.error_text or ""),
        float(m.timestamp),
        to_json(dict(m.extra)),
        m.status,
        max(1, int(m.attempts)),
        str(m.protocol),
    )


def measurement_from_row(r: tuple) -> Measurement:
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


def onnx_summary(data: bytes) -> tuple[int | None, str | None]:
    """(node count, comma-separated op types) of an ONNX model; (None, None) when it does not parse."""
    try:
        import onnx

        g = onnx.load_from_string(data).graph
        return len(g.node), ",".join(n.op_type for n in g.node)
    except Exception:
        return None, None
