"""Does ONNX Runtime's Add + LayerNorm fusion decide which backend wins a stored subgraph?

    .venv/bin/python benchmarks/ort_fusion_labels.py [--db PATH ...] [--json benchmarks/results/ort_fusion_labels.json]

For every stored subgraph of each ``--db`` (default: the Zen 3 datasets) that holds an ``Add`` and a
``LayerNormalization`` and has a valid row on both ``onnxruntime`` and ``openvino`` (same machine and
protocol), it asks onnxruntime's optimiser (the ``all`` level, as the plain backend compiles) whether it
fuses them into ``SkipLayerNormalization``, and groups the ORT / OpenVINO latency ratios by fused or not
and by region size (up to 3 nodes, or more). Nothing is timed: the databases are opened read-only, and
the ratios are the stored labels.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ZEN3 = ("zen3-m5", "zen3-t1-m5", "zen3-t1-synth-m5", "zen3-synth-m5", "zen3-synth-v2-m5", "zen3-synth-rnn-m5",
        "zen3-synth-b1-m5", "zen3-synth-enc-m5")
QUERY = """select s.onnx, s.n_nodes, o.median, v.median from subgraphs s
    join measurements o on o.subgraph_hash = s.hash and o.backend = 'onnxruntime' and o.valid = 1
    join measurements v on v.subgraph_hash = s.hash and v.backend = 'openvino' and v.valid = 1
        and v.hardware = o.hardware and v.protocol = o.protocol
    where s.ops like '%LayerNormalization%' and s.ops like '%Add%'"""


def fused_pairs(model_bytes: bytes, path: str) -> int | None:
    """How many SkipLayerNormalization nodes onnxruntime makes of the subgraph (None: it did not build)."""
    import onnx

    from collage_ml.backends.onnxruntime_backend import make_session

    try:
        make_session(model_bytes, 1, False, "all", optimized_path=path)
    except Exception:
        return None
    return sum(n.op_type == "SkipLayerNormalization" for n in onnx.load(path).graph.node)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", default=[], help="a dataset database (repeatable)")
    ap.add_argument("--json", default="benchmarks/results/ort_fusion_labels.json")
    args = ap.parse_args()
    dbs = args.db or [f"datasets/cpu-2core-{n}/measurements.db" for n in ZEN3]
    path = os.path.join(tempfile.mkdtemp(), "optimised.onnx")
    groups: dict[str, list[float]] = defaultdict(list)
    per_db = {}
    for db in dbs:
        if not Path(db).exists():
            raise SystemExit(f"ort_fusion_labels: no database at {db}")
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        rows = defaultdict(list)
        for blob, n_nodes, ort_s, ov_s in con.execute(QUERY):
            n = fused_pairs(bytes(blob), path)
            if n is None:
                continue
            key = f"{'fused' if n else 'not fused'}, {'<=3' if n_nodes <= 3 else '>3'} nodes"
            rows[key].append(ort_s / ov_s)
            groups["fused" if n else "not fused"].append(ort_s / ov_s)
        con.close()
        per_db[db] = {k: summary(v) for k, v in sorted(rows.items())}
        print(db)
        for k, v in per_db[db].items():
            print(f"  {k:22s} n {v['n']:4d}  ORT/OV median {v['median']:.3f}  ORT faster {v['ort_faster']:.0%}")
    total = {k: summary(v) for k, v in groups.items()}
    for k, v in total.items():
        print(f"all, {k}: n {v['n']}, ORT/OV median {v['median']:.3f}, ORT faster {v['ort_faster']:.0%}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"per_db": per_db, "total": total}, indent=1))
    print(f"saved {args.json}")


def summary(ratios: list[float]) -> dict:
    return {"n": len(ratios), "median": statistics.median(ratios), "ort_faster": sum(r < 1 for r in ratios) / len(ratios)}


if __name__ == "__main__":
    main()
