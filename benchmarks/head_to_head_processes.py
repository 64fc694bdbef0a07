"""Does a head-to-head of whole-model plans give the same answer in another process?

    .venv/bin/python benchmarks/head_to_head_processes.py [--models resnext50,resnet50] [--threads 1]
        [--backends onnxruntime,openvino] [--processes 6] [--json PATH]

For each model, the whole model on each backend (``Plan.single``) is timed head to head
(:func:`collage_ml.measure.e2e.measure_head_to_head`: alternating windows in one worker, the median of each
plan's windows) in ``--processes`` fresh worker processes, one after the other. It prints each process's
medians and the ratio of the second plan to the first, and scores decisions against the consensus (the
median over every process of each plan's median):

- one process: how often its winner is the consensus winner;
- two processes: for every pair, each plan's minimum and median of its two per-process medians.

Where the ratio moves more between processes than its windows do within one, the state that decides a
close contest belongs to the process (or to the minutes it ran in), and one process cannot settle it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from collage_ml.backends import get_backend
from collage_ml.ir.importers import import_model
from collage_ml.measure.e2e import measure_head_to_head
from collage_ml.measure.hardware import hardware_info
from collage_ml.measure.runner import Runner
from collage_ml.plan import Plan


def run_model(name: str, backends: list[str], threads: int, processes: int, console: Console) -> dict:
    graph = import_model(name)
    ref = graph.reference()
    plans = {f"all-{b}": Plan.single(graph, get_backend(b)) for b in backends}
    labels = list(plans)
    rows = []
    for p in range(processes):
        order = labels if p % 2 == 0 else labels[::-1]  # which plan the process compiles and times first
        t0 = time.time()
        with Runner(threads=threads) as runner:
            res = measure_head_to_head(runner, graph, {k: plans[k] for k in order}, ref)
        if not all(res[k].get("valid") for k in labels):
            console.print(f"[red]{name}: process {p}: " + "; ".join(
                f"{k}: {res[k].get('error_text')}" for k in labels if not res[k].get("valid")))
            continue
        med = {k: res[k]["median"] * 1e3 for k in labels}
        windows = {k: [w * 1e3 for w in res[k]["samples"]] for k in labels}
        # window-by-window ratio: the windows alternate, so window i of each plan ran seconds apart
        n = min(len(windows[k]) for k in labels)
        wr = [windows[labels[1]][i] / windows[labels[0]][i] for i in range(n)]
        rows.append({"process": p, "order": order, "started": t0, "median_ms": med, "windows_ms": windows,
                     "ratio": med[labels[1]] / med[labels[0]], "window_ratios": wr})
        console.print(f"{name} process {p}: " + ", ".join(f"{k} {med[k]:.2f} ms" for k in labels)
                      + f"; ratio {rows[-1]['ratio']:.3f} (windows {min(wr):.3f}-{max(wr):.3f}, {n} rounds)")
    return {"labels": labels, "processes": rows, **score(labels, rows)}


def score(labels: list[str], rows: list[dict]) -> dict:
    """Decisions of one process and of two, against the consensus over all of them."""
    if len(rows) < 2:
        return {}
    consensus = {k: statistics.median(r["median_ms"][k] for r in rows) for k in labels}
    best = min(labels, key=consensus.get)
    one = [min(labels, key=r["median_ms"].get) == best for r in rows]
    pairs = list(itertools.combinations(rows, 2))
    two_min = [min(labels, key=lambda k: min(a["median_ms"][k], b["median_ms"][k])) == best for a, b in pairs]
    two_med = [min(labels, key=lambda k: a["median_ms"][k] + b["median_ms"][k]) == best for a, b in pairs]
    ratios = [r["ratio"] for r in rows]
    within = [max(r["window_ratios"]) / min(r["window_ratios"]) for r in rows if r["window_ratios"]]
    return {
        "consensus_ms": consensus, "consensus_winner": best,
        "consensus_gap": consensus[labels[1]] / consensus[labels[0]],
        "one_process_agrees": float(np.mean(one)), "two_processes_min_agrees": float(np.mean(two_min)),
        "two_processes_mean_agrees": float(np.mean(two_med)),
        "ratio_between_processes": max(ratios) / min(ratios),
        "ratio_within_process_median": statistics.median(within) if within else None,
        "per_plan_between_processes": {k: max(r["median_ms"][k] for r in rows) / min(r["median_ms"][k] for r in rows)
                                       for k in labels},
    }


def cpu_kind() -> str:
    """Family, model and stepping from /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    fields = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in ("cpu family", "model", "stepping") and k.strip() not in fields:
            fields[k.strip()] = v.strip()
    return ", ".join(f"{k} {v}" for k, v in fields.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnext50,resnet50")
    ap.add_argument("--backends", default="onnxruntime,openvino")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--json", default="benchmarks/results/head_to_head_processes.json")
    args = ap.parse_args()
    backends = args.backends.split(",")
    if len(backends) != 2:
        raise SystemExit("head_to_head_processes: --backends takes exactly two backends")
    console = Console(width=160)
    hw = hardware_info(args.threads)
    hw["cpuinfo"] = cpu_kind()
    console.print(f"CPU: {hw['cpu_model']}, {hw['cpuinfo']}")
    out = {"hardware": hw, "threads": args.threads, "backends": backends, "models": {}}
    for m in args.models.split(","):
        out["models"][m] = run_model(m, backends, args.threads, args.processes, console)
    t = Table(title=f"whole-model head-to-head in {args.processes} fresh processes, {args.threads} thread(s)")
    for c in ("model", "consensus ms", "gap", "ratio between processes (max/min)", "within a process (median)",
              "one process right", "two, min right", "two, mean right"):
        t.add_column(c, justify="right" if c != "model" else "left")
    for m, r in out["models"].items():
        if "consensus_ms" not in r:
            continue
        t.add_row(m, " / ".join(f"{r['consensus_ms'][k]:.2f}" for k in r["labels"]), f"{r['consensus_gap']:.3f}",
                  f"{r['ratio_between_processes']:.3f}", f"{r['ratio_within_process_median']:.3f}",
                  f"{r['one_process_agrees']:.0%}", f"{r['two_processes_min_agrees']:.0%}",
                  f"{r['two_processes_mean_agrees']:.0%}")
    console.print(t)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    console.print(f"saved {args.json}")


if __name__ == "__main__":
    main()
