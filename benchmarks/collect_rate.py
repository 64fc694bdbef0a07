"""Candidates per minute of `collect` itself, under the old and the new measurement protocol, side by side.

    .venv/bin/python benchmarks/collect_rate.py [--models resnet50,bert] [--max-candidates 150] [--rounds 2]

Runs `collage_ml.collect(..., sampler="enumerate")` on the default CPU backends
into a fresh database per protocol and round, on the same candidates (the
same models, seed and budget), alternating the protocols, and prints the
candidates measured per minute of wall time (imports, reference runs,
compiles and timing included) for each. Target (the measurement-fidelity
issue): at least 300 per minute under the new protocol.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert")
    ap.add_argument("--backends", default=None)
    ap.add_argument("--max-candidates", type=int, default=150)
    ap.add_argument("--max-region-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--protocols", default="m1,m2",
                    help="protocols to compare, by name (measure.timing.PROTOCOLS, or an experiment arm of "
                         "benchmarks/measure_agreement.py); NAMExN: at least N windows")
    ap.add_argument("--json", default="benchmarks/results/collect_rate.json")
    args = ap.parse_args()

    import collage_ml
    from collage_ml.measure.hardware import hardware_info
    from collage_ml.paths import default_threads
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure_agreement import protocol_config, protocols_by_name  # the protocols and experiment arms

    protocols = {}
    known = protocols_by_name()
    for spec in args.protocols.split(","):
        # "m3x3": m3 with at least 3 windows below its long_seconds; a name that holds an x ("m2x1") is a name
        name, _, windows = (spec, "", "") if spec in known else spec.partition("x")
        protocols[spec] = protocol_config(name, int(windows) if windows else None)
    rows: dict[str, list[dict]] = {p: [] for p in protocols}
    for rnd in range(args.rounds):
        order = list(protocols) if rnd % 2 == 0 else list(reversed(protocols))
        for p in order:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                s = collage_ml.collect(
                    models=args.models, backends=args.backends, db=str(Path(tmp) / "m.db"),
                    max_candidates=args.max_candidates, sampler="enumerate", max_region_size=args.max_region_size,
                    progress=False, timing=protocols[p], recalibrate_hours=None,  # candidates only: no probe set
                )
                wall = time.perf_counter() - t0
            n = s.measured
            rows[p].append({"measured": n, "seconds": wall, "per_minute": 60 * n / wall if wall else 0.0})
            print(f"round {rnd + 1} {p}: {n} measured in {wall:.0f} s = {60 * n / wall:.0f}/min", file=sys.stderr)
    threads = default_threads()
    report = {
        "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"), "hardware": hardware_info(threads),
        "threads": threads, "rounds": rows,
        "per_minute": {p: sum(r["measured"] for r in v) * 60 / sum(r["seconds"] for r in v) for p, v in rows.items()},
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    hw = report["hardware"]
    print(f"{hw['cpu_model']} {hw['cpu_id']}, {threads} threads: " + ", ".join(
        f"{p} {v:.0f} candidates/min" for p, v in report["per_minute"].items()))


if __name__ == "__main__":
    main()
