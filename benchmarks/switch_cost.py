"""What switching backends costs inside one process, hand-off aside: the two steps of a two-backend plan, timed
alone and alternating, on fixed inputs (no tensor crosses between them).

    .venv/bin/python benchmarks/switch_cost.py [--model dcgan] [--split 6] [--first openvino --second onnxruntime]

The plan runs nodes [0, split) on ``--first`` and the rest on ``--second`` (the zoo model's topological order).
Printed per round (medians of 400 calls, after 50 warm-up calls): each step alone, each step timed right after
the other, and the full plan (with the hand-off). A step that is slower right after the other backend ran pays
for the other backend's threads (waking its own pool, or the other's still spinning), which no boundary
measurement of a tensor hand-off sees.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_ml.ir.importers import import_model  # noqa: E402
from collage_ml.placed import PlacedModel  # noqa: E402
from collage_ml.plan import Partition, Plan  # noqa: E402


def median_ms(fn, n: int = 400, warmup: int = 50) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def after_ms(before, timed, n: int = 400) -> float:
    ts = []
    for _ in range(n):
        before()
        t = time.perf_counter()
        timed()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dcgan")
    ap.add_argument("--split", type=int, default=6)
    ap.add_argument("--first", default="openvino")
    ap.add_argument("--second", default="onnxruntime")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    g = import_model(args.model)
    n = len(g.nodes)
    if not 0 < args.split < n:
        raise SystemExit(f"--split must be between 1 and {n - 1} for {args.model} ({n} nodes)")
    plan = Plan(args.model, [Partition(args.first, list(range(args.split))), Partition(args.second, list(range(args.split, n)))])
    ref = g.reference()
    placed = PlacedModel(g, plan, threads=args.threads)
    inputs = {k: ref[k] for k in g.input_names}
    env, step_args = dict(inputs), []
    for exe, ins, outs in placed._steps:
        a = [env[t] for t in ins]
        step_args.append(a)
        env.update(zip(outs, exe(*a)))
    if len(step_args) != 2:
        raise SystemExit(f"the plan compiled to {len(step_args)} steps, not 2: choose another --split")
    (x, _, _), (y, _, _) = placed._steps
    ax, ay = step_args

    def run_x():
        x(*ax)

    def run_y():
        y(*ay)

    print(f"{args.model}: nodes 0-{args.split - 1} on {args.first}, {args.split}-{n - 1} on {args.second}, "
          f"{args.threads} threads")
    for r in range(args.rounds):
        alone_x, alone_y = median_ms(run_x), median_ms(run_y)
        ax_after, ay_after = after_ms(run_y, run_x), after_ms(run_x, run_y)
        both = median_ms(lambda: (run_x(), run_y()))
        full = median_ms(lambda: placed.run(inputs))
        print(f"round {r}: {args.first} alone {alone_x:.3f} ms, after {args.second} {ax_after:.3f} ms; "
              f"{args.second} alone {alone_y:.3f} ms, after {args.first} {ay_after:.3f} ms; "
              f"both steps {both:.3f} ms (alone they sum to {alone_x + alone_y:.3f}); full plan {full:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
