"""How far a plan's sum of parts is from what it runs in, with and without the in-context costs.

    .venv/bin/python benchmarks/in_context.py [--models nasrnn,bert,resnet50] [--backends onnxruntime,openvino]
        [--threads 1] [--json OUT]

Each model is cut into one-node partitions on one backend, compiled without merging (so the partitions stay
separate sessions, as a many-part op-level plan of several backends does) and run end to end. Its parts are
the same compiled partitions, each timed alone on its reference inputs in a tight loop, as the protocol
times a candidate. The in-context costs are measured here (:class:`~collage_ml.measure.context.ContextTask`)
and charged per partition as the DP charges them. Printed per model and backend: the plan end to end, the sum
of its parts, the sum plus the in-context charge, and the two ratios end-to-end / priced. Everything is timed
in this one process, side by side.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from collage_ml.backends import resolve_backends
from collage_ml.ir.importers import from_onnx, zoo_onnx
from collage_ml.measure.context import ContextTable, context_tasks
from collage_ml.measure.hardware import hardware_info
from collage_ml.measure.records import BoundaryCost
from collage_ml.measure.timing import TimingConfig, time_callable
from collage_ml.plan import Partition, Plan


def context_table(backend, threads: int) -> ContextTable:
    recs = []
    for key, task in context_tasks(backend, threads, TimingConfig(time_cap=0.5)):
        r = task.execute()
        if not r.get("valid"):
            raise SystemExit(f"{backend.name}: in-context measurement failed: {r.get('error_text')}")
        recs.append(BoundaryCost(key, "here", True, r["samples"], r["median"], r["spread"]))
    return ContextTable(recs)


def one(model: str, backend, threads: int, table: ContextTable) -> dict:
    g = from_onnx(zoo_onnx(model), name=model)
    ref = g.reference(seed=0)
    plan = Plan(model, [Partition(backend.name, [i], backend_spec=backend.spec()) for i in range(len(g))],
                graph_hash=g.whole().hash)
    placed = plan.compile(g, threads=threads, merge=False)
    feeds = {k: ref[k] for k in g.input_names}
    e2e = time_callable(lambda: placed.run(feeds), TimingConfig(min_repeats=20, max_repeats=400, time_cap=3.0)).median
    cfg = TimingConfig(min_repeats=20, max_repeats=2000, time_cap=0.2)
    parts = charge = 0.0
    for (exe, ins, _), k in zip(placed._steps, plan.execution_order(g)):
        args = [ref[t] for t in ins]
        parts += time_callable(lambda: exe(*args), cfg).median
        charge += table.partition_seconds(g, backend.name, g.subgraph(plan.partitions[k].mask))
    return {"model": model, "backend": backend.name, "threads": threads, "partitions": len(g),
            "e2e_ms": e2e * 1e3, "parts_ms": parts * 1e3, "in_context_ms": charge * 1e3,
            "ratio_parts": e2e / parts, "ratio_in_context": e2e / (parts + charge)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="nasrnn,bert,resnet50")
    ap.add_argument("--backends", default="onnxruntime,openvino")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    hw = hardware_info(args.threads)
    console = Console(width=160)
    rows = []
    for b in resolve_backends(args.backends):
        table = context_table(b, args.threads)
        for m in args.models.split(","):
            rows.append(one(m, b, args.threads, table))
            console.print(rows[-1])
    t = Table(title=f"one-node partitions, unmerged, {args.threads} thread(s), {hw['cpu_model']} ({hw['cpu_id']})")
    for c in ("model", "backend", "parts", "end to end ms", "sum of parts ms", "+ in context ms",
              "e2e / parts", "e2e / (parts + in context)"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["model"], r["backend"], str(r["partitions"]), f"{r['e2e_ms']:.3f}", f"{r['parts_ms']:.3f}",
                  f"{r['in_context_ms']:.3f}", f"{r['ratio_parts']:.2f}", f"{r['ratio_in_context']:.2f}")
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": hw, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
