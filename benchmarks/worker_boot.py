"""What a measurement worker's start costs, and whether importing torch in it changes what it measures.

Until 2026-12-02 every worker imported torch at start, whatever its backend. This benchmark times a worker's
boot imports in a fresh interpreter with and without torch, and measures the same onnxruntime and OpenVINO
candidates in workers without torch and in workers that ran a torch candidate first (torch imported, its
threads set and started: more than the old boot did), side by side: each round starts one worker of each
kind, in alternating order, and times every candidate once in each (one window of the default protocol's
rules, compiled afresh).
Reported: the start times, and per backend the geometric mean of the per-candidate ratio "with torch / without",
next to the same ratio between two rounds of workers without torch (what noise alone gives).

    python benchmarks/worker_boot.py [--model resnet50] [--count 24] [--rounds 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from collage_ml.backends.base import get_backend
from collage_ml.candidates import enumerate_candidates
from collage_ml.measure.hardware import hardware_info
from collage_ml.ir.importers import import_model
from collage_ml.measure.runner import reference_of
from collage_ml.measure.tasks import Task
from collage_ml.measure.timing import TimingConfig
from collage_ml.measure.worker import Worker
from collage_ml.paths import default_threads


def _tasks(model: str, backends: list[str], count: int, threads: int, seed: int):
    g = import_model(model)
    ref = g.reference()
    bs = [get_backend(b) for b in backends]
    cands = [c for c in enumerate_candidates(g, bs, max_region_size=2) if c.pattern != "whole-model"]
    rng = random.Random(seed)
    rng.shuffle(cands)
    timing = TimingConfig(keep_compiled=False)

    def task_of(c) -> Task:  # as measure.runner.Runner builds one
        feeds, expected = c.subgraph.reference_io(reference_of(ref, c))
        return Task(c.backend.spec(), c.subgraph.to_onnx(check=False).SerializeToString(), feeds, expected,
                    threads, timing)

    out = []
    per = {b: 0 for b in backends}
    for c in cands:
        if per[c.backend.name] >= count // len(backends):
            continue
        per[c.backend.name] += 1
        out.append((c.backend.name, task_of(c)))
    # a torch task: what made a worker import torch (and set its threads) before 2026-12-02
    return out, task_of(next(iter(enumerate_candidates(g, [get_backend("torch")], max_region_size=1))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--backends", default="onnxruntime,openvino")
    ap.add_argument("--count", type=int, default=24, help="candidates in all, split between the backends")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--starts", type=int, default=5, help="worker starts timed per kind")
    ap.add_argument("--json", default="benchmarks/results/worker_boot.json")
    args = ap.parse_args()
    threads = default_threads()
    console = Console()
    tasks, torch_task = _tasks(args.model, args.backends.split(","), args.count, threads, 0)

    # a worker's start is a fresh interpreter and its boot imports; the old boot imported torch first
    boot = "import collage_ml.ir.importers, collage_ml.measure.tasks"
    old = f"import torch; torch.set_num_threads({threads}); " + boot
    starts: dict[str, list[float]] = {"plain": [], "torch imported": []}
    for i in range(args.starts):
        for kind in (("plain", "torch imported") if i % 2 == 0 else ("torch imported", "plain")):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", boot if kind == "plain" else old], check=True)
            starts[kind].append(time.perf_counter() - t0)

    lat: dict[str, list[list[float | None]]] = {"plain": [], "torch imported": []}
    for r in range(args.rounds):
        for kind in (("plain", "torch imported") if r % 2 == 0 else ("torch imported", "plain")):
            w = Worker(threads)
            w.start()
            if kind != "plain":
                w.run(torch_task, 120)
            row = []
            for _, t in tasks:
                res = w.run(t, 120)
                row.append(res["median"] if res.get("valid") else None)
            lat[kind].append(row)
            w.kill()
        console.print(f"round {r + 1}/{args.rounds} done")

    def best(kind, rounds):  # per candidate: the minimum over the given rounds
        return [min((lat[kind][r][i] for r in rounds if lat[kind][r][i]), default=None) for i in range(len(tasks))]

    half = list(range(0, args.rounds, 2)), list(range(1, args.rounds, 2))
    plain_all, torch_all = best("plain", range(args.rounds)), best("torch imported", range(args.rounds))
    plain_a, plain_b = best("plain", half[0]), best("plain", half[1])
    hw = hardware_info(threads)
    table = Table(title=f"worker start and candidate latency, {hw['cpu_model']} {hw['cpu_id']}, {threads} threads")
    for col in ("backend", "candidates", "with torch / without (geomean)", "p10-p90",
                "without / without, other rounds (noise)", "p10-p90 "):
        table.add_column(col)
    summary = {}
    for b in args.backends.split(","):
        idx = [i for i, (bn, _) in enumerate(tasks) if bn == b and plain_all[i] and torch_all[i]
               and plain_a[i] and plain_b[i]]
        r1 = np.log([torch_all[i] / plain_all[i] for i in idx])
        r0 = np.log([plain_a[i] / plain_b[i] for i in idx])
        summary[b] = {"n": len(idx), "torch_over_plain_geomean": float(np.exp(r1.mean())),
                      "torch_over_plain_p10_p90": [float(np.exp(np.percentile(r1, 10))), float(np.exp(np.percentile(r1, 90)))],
                      "noise_geomean": float(np.exp(r0.mean())),
                      "noise_p10_p90": [float(np.exp(np.percentile(r0, 10))), float(np.exp(np.percentile(r0, 90)))]}
        s = summary[b]
        table.add_row(b, str(len(idx)), f"{s['torch_over_plain_geomean']:.3f}",
                      "{:.2f}-{:.2f}".format(*s["torch_over_plain_p10_p90"]), f"{s['noise_geomean']:.3f}",
                      "{:.2f}-{:.2f}".format(*s["noise_p10_p90"]))
    console.print(table)
    med = {k: float(np.median(v)) for k, v in starts.items()}
    console.print(f"worker start (median of {args.starts}): without torch {med['plain']:.2f} s, "
                  f"with torch imported {med['torch imported']:.2f} s")
    out = {"command": "benchmarks/worker_boot.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "hardware": hw,
           "threads": threads, "start_seconds": starts, "start_median": med, "latency": summary,
           "raw": {k: v for k, v in lat.items()}, "candidates": [b for b, _ in tasks]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    console.print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
