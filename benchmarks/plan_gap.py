"""Why an op-level plan runs slower than the sum of its measured parts: each partition alone vs in the plan.

    .venv/bin/python benchmarks/plan_gap.py --model dcgan --batch 16 \\
        --backends 'onnxruntime,onnxruntime[spin=on],openvino,openvino[streams=2],torch,mnn' \\
        --db .cache/e2e-configs.db --json benchmarks/results/plan_gap-dcgan-b16.json

The op-level DP adds up kernel latencies measured one candidate at a time (and
measured hand-off costs). A plan then runs its partitions back to back in one
process. This script places the model with the DP only (cached measurements
make that fast), compiles the op-level plan in this process and times, over
the same calls:

- each partition **alone**: called repeatedly on its own inputs;
- each partition **in the plan**: the time of its call inside a full run;
- the whole plan, and the DP's prediction.

It repeats that for variants of the plan: every ``onnxruntime[spin=on]``
partition switched to spinning off (spinning threads keep the cores busy for
a while after their call returns), and the whole model on the plan's single
fastest backend. A partition much slower in the plan than alone is paying for
its neighbours (threads still spinning, caches, pools fighting for 2 cores).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def step_times(placed, feeds, runs: int) -> tuple[list[float], float]:
    """Median time of each step inside full runs, and the median full run (seconds)."""
    steps = placed._steps
    per = [[] for _ in steps]
    totals = []
    for r in range(runs + 3):
        env = dict(feeds)
        t_run = time.perf_counter()
        for k, ((exe, ins, outs), free) in enumerate(zip(steps, placed._free)):
            t0 = time.perf_counter()
            res = exe(*[env[t] for t in ins])
            dt = time.perf_counter() - t0
            for t, v in zip(outs, res):
                env[t] = v
            for t in free:
                del env[t]
            if r >= 3:
                per[k].append(dt)
        if r >= 3:
            totals.append(time.perf_counter() - t_run)
    return [statistics.median(p) for p in per], statistics.median(totals)


def alone_times(placed, feeds, runs: int) -> list[float]:
    """Median time of each step called repeatedly on its own (inputs from one full run)."""
    env = dict(feeds)
    inputs = []
    for (exe, ins, outs), _ in zip(placed._steps, placed._free):
        args = [env[t] for t in ins]
        inputs.append(args)
        for t, v in zip(outs, exe(*args)):
            env[t] = v
    out = []
    for (exe, _, _), args in zip(placed._steps, inputs):
        for _ in range(3):
            exe(*args)
        ts = []
        for _ in range(runs):
            t0 = time.perf_counter()
            exe(*args)
            ts.append(time.perf_counter() - t0)
        out.append(statistics.median(ts))
    return out


def describe(graph, placed, plan) -> list[str]:
    order = plan.execution_order(graph)
    names = []
    for k in order:
        p = plan.partitions[k]
        ops = [graph.nodes[i].op_type for i in sorted(p.nodes)]
        names.append(f"{p.backend}: {','.join(ops[:4])}{'...' if len(ops) > 4 else ''} ({len(ops)})")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dcgan")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--backends", default="onnxruntime,onnxruntime[spin=on],openvino,openvino[streams=2],torch")
    ap.add_argument("--max-region-size", type=int, default=2)
    ap.add_argument("--db", default=".cache/e2e-configs.db")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    import collage_ml
    from collage_ml.ir.importers import import_model
    from collage_ml.paths import default_threads
    from collage_ml.plan import Plan

    threads = default_threads()
    graph = import_model(args.model, batch=args.batch)
    res = collage_ml.place(args.model, batch=args.batch, backends=args.backends, db=args.db, max_region_size=args.max_region_size,
                           graph_level=False, progress=False, threads=threads)
    report = res.report
    dp_plan = Plan.from_dict(report["op_level_plan"])
    variants = {"op-level": dp_plan}
    if any(p.backend == "onnxruntime[spin=on]" for p in dp_plan.partitions):
        v = copy.deepcopy(dp_plan)
        for p in v.partitions:
            if p.backend == "onnxruntime[spin=on]":
                p.backend, p.backend_spec = "onnxruntime", None
        variants["op-level, spin off"] = v
    feeds = graph.example_inputs()
    out = {"model": args.model, "batch": args.batch, "threads": threads, "backends": args.backends,
           "date": time.strftime("%Y-%m-%d"), "dp_predicted_ms": report["op_level_predicted_ms"],
           "baselines_ms": report["baselines_e2e_ms"], "variants": {}}
    print(f"{args.model} @ batch {args.batch}: DP predicted {report['op_level_predicted_ms']:.2f} ms; "
          f"single backends (end to end) " + ", ".join(f"{k} {v:.2f}" for k, v in report["baselines_e2e_ms"].items()
                                                       if v is not None))
    for label, plan in variants.items():
        placed = plan.compile(graph, threads=threads)  # merged, as the end-to-end measurement runs it
        in_plan, total = step_times(placed, feeds, args.runs)
        alone = alone_times(placed, feeds, args.runs)
        names = describe(graph, placed, placed.plan)
        order = placed.plan.execution_order(graph)
        predicted = [placed.plan.partitions[k].predicted_ms for k in order]
        print(f"\n{label}: {len(names)} partitions, run {total * 1e3:.2f} ms, sum alone {sum(alone) * 1e3:.2f} ms, "
              f"sum in plan {sum(in_plan) * 1e3:.2f} ms")
        print(f"  {'partition':60s} {'predicted':>10s} {'alone':>9s} {'in plan':>9s} {'ratio':>6s}")
        rows = []
        for name, pr, a, ip in zip(names, predicted, alone, in_plan):
            rows.append({"partition": name, "predicted_ms": pr, "alone_ms": a * 1e3, "in_plan_ms": ip * 1e3})
            print(f"  {name[:60]:60s} {(f'{pr:.3f}' if pr is not None else '-'):>10s} {a * 1e3:9.3f} "
                  f"{ip * 1e3:9.3f} {ip / a:6.2f}")
        out["variants"][label] = {"run_ms": total * 1e3, "sum_alone_ms": sum(alone) * 1e3,
                                  "sum_in_plan_ms": sum(in_plan) * 1e3, "partitions": rows}
        for exe, _, _ in placed._steps:
            exe.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
