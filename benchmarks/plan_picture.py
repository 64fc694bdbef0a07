"""The README's plan picture: a tiny model's op-level plan on two backends, drawn by `collage_ml.show`.

    .venv/bin/python benchmarks/plan_picture.py [--model mobilenetv2-tiny] [--backends onnxruntime,openvino,torch] \\
        [--db .cache/plan-picture.db] [--svg docs/placed-example.svg] [--out DIR]

On this CPU placement keeps every zoo model on one backend (docs/results/placement.md:
fusion inside one runtime beats any per-subgraph mix), so the chosen plan is a
single cluster. To show
what a mixed plan looks like, this script places the model, then *forces* a mix:
the op-level DP over the same measured candidates of up to --max-region-size
nodes (not the whole-model regions), with the hand-off costs left out, merged
where adjacent regions share a backend (as ``Plan.compile`` does). It times that
plan end to end and draws it. Partition latencies and hand-off
costs come from the database the placement wrote. Which ops end up where
depends on this machine's measurements (with other models or backends the DP
may keep every op on one backend; the script says so and exits 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenetv2-tiny")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch")
    ap.add_argument("--max-region-size", type=int, default=2)
    ap.add_argument("--db", default=str(ROOT / ".cache" / "plan-picture.db"))
    ap.add_argument("--svg", default=str(ROOT / "docs" / "placed-example.svg"))
    ap.add_argument("--out", default=None, metavar="DIR", help="also save the forced placed model here")
    args = ap.parse_args()

    import collage_ml
    from collage_ml.backends.base import resolve_backends
    from collage_ml.candidates import enumerate_candidates
    from collage_ml.db import Database
    from collage_ml.measure.timing import TimingConfig, time_callable
    from collage_ml.plan import Plan
    from collage_ml.search.dp import solve
    from collage_ml.search.evolutionary import EvoConfig

    pm = collage_ml.place(args.model, backends=args.backends, db=args.db, max_region_size=args.max_region_size,
                          evo_config=EvoConfig(generations=1), progress=True)
    rep = pm.report
    graph, hw = pm.graph, rep["hardware"]
    backends = resolve_backends(args.backends)
    # the maximal regions (the whole model on one backend) would win the DP outright: leave them out
    cands = [c for c in enumerate_candidates(graph, backends, max_region_size=args.max_region_size)
             if len(c.subgraph) <= args.max_region_size]
    with Database(args.db, create=False, readonly=True) as db:
        ms = [db.get(c.key, hw) for c in cands]
    costs = [m.median if m is not None and m.valid else None for m in ms]
    dp = solve(graph, cands, costs)  # no boundary function: hand-offs cost nothing to the DP
    op = Plan.from_candidates(graph, dp.choice, dp.per_candidate, hardware=hw, threads=rep["threads"])
    if len(op.backends_used()) < 2:
        print(f"even without hand-off costs, {args.model}'s op-level plan uses one backend ({op.backends_used()})")
        return 1
    forced = op.compile(graph, threads=rep["threads"])  # merges adjacent same-backend regions
    # the lower of three medians, as the tuner judges plans (a loaded 2-core VM makes single medians jumpy)
    feeds = graph.example_inputs()
    runs = [time_callable(lambda: forced.run(feeds), TimingConfig()).median * 1e3 for _ in range(3)]
    forced.plan.measured_ms = min(runs)
    print("forced mixed plan, median of each timing:", ", ".join(f"{r:.3f} ms" for r in runs))
    forced.report = {"model": rep["model"], "hardware": rep["hardware"], "plan_latency_ms": forced.plan.measured_ms,
                     "chosen": "forced mix: the DP without hand-off costs"}
    view = collage_ml.show(forced, args.svg, db=args.db)
    if args.out:
        forced.save(args.out)
    from rich.console import Console

    Console().print(view.table())
    print(f"chosen plan: {rep['chosen']} {rep['plan_latency_ms']:.3f} ms; forced mixed plan "
          f"{forced.plan.measured_ms:.3f} ms (DP without hand-offs predicted {dp.cost * 1e3:.3f} ms); wrote {args.svg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
