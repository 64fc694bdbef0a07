"""Measurement agreement: does a latency repeat in another process, minutes later?

    .venv/bin/python benchmarks/measure_agreement.py [--count 240] [--protocols m1,m2] [--mix] [--abba] [--json FILE]

Draws candidates from several zoo models at batch 1 and 16 (stratified by
model, batch and backend), and measures each twice per protocol, in two
independent runs: fresh worker processes, a different candidate order, the
runs one after another (minutes apart). The protocols are measured side by
side, interleaved (run 1 of each, then run 2 of each), on the same candidates.

Agreement is the share of candidates whose two measurements agree within
+-10% (|log(b/a)| <= log 1.1); the table gives it per latency decade (by the
geometric mean of the two runs) and per backend, with the median |log ratio|.
Targets (the measurement-fidelity issue): >= 90% of candidates of 20 us or
more, >= 80% of all, median |log ratio| < 0.03.

``--json`` keeps every pair, the hardware description and the command, and
``--table-only`` reprints a saved run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

DECADES = ((0, 10e-6, "< 10 us"), (10e-6, 100e-6, "10-100 us"), (100e-6, 1e-3, "0.1-1 ms"), (1e-3, math.inf, ">= 1 ms"))
TOL = math.log(1.1)


def protocols_by_name() -> dict:
    """The stored protocols (``measure.timing.PROTOCOLS``) and the experiment arms, by name."""
    from dataclasses import replace

    from collage_ml.measure.timing import PROTOCOLS, TimingConfig

    return {
        **PROTOCOLS,
        # experiment arms, never stored: the new protocol with idle CPUs polling, and with one process
        "m2q": TimingConfig(hold_cpu_latency=True, name="m2q"),
        "m2x1": TimingConfig(processes=1, max_processes=1, name="m2x1"),
        # m5 with no agreement rule: extra windows only in place of windows the hypervisor stole from
        "m5s": replace(PROTOCOLS["m5"], agree=math.inf, name="m5s"),
        # m3 with passes over 256 candidates, not 64: a candidate's windows lie about 4x further apart, past
        # the ~5 s the host's slow state lasts (benchmarks/noise_detectors.py)
        "m3w": replace(PROTOCOLS["m3"], pass_chunk=256, name="m3w"),
        # m5 with windows of at most 30 ms instead of 0.1 s (the Zen 4's m5 windows averaged 34 ms): does the
        # number of windows, not their length, buy the agreement, at a higher collection rate?
        "m5q": replace(PROTOCOLS["m5"], time_cap=0.03, name="m5q"),
    }


def protocol_config(name: str, processes: int | None = None):
    from dataclasses import replace

    known = protocols_by_name()
    cfg = known.get(name)
    if cfg is None:
        raise SystemExit(f"unknown protocol {name!r}: {', '.join(known)}")
    return replace(cfg, processes=processes, max_processes=max(cfg.max_processes, processes)) if processes else cfg


def pick(models, batches, backends, count: int, max_size: int, seed: int):
    """{(model, batch): (graph, [candidates])}, about ``count`` in all, equal shares per (model, batch, backend)."""
    from collage_ml.candidates import enumerate_candidates
    from collage_ml.ir import import_model

    rng = np.random.default_rng(seed)
    cells = len(models) * len(batches) * len(backends)
    share = max(1, count // cells)
    out = {}
    for model in models:
        for batch in batches:
            g = import_model(model, batch=batch)
            chosen = []
            for b in backends:
                uniq = {}
                for c in enumerate_candidates(g, [b], max_region_size=max_size):
                    if len(c.subgraph) <= max_size:
                        uniq.setdefault(c.subgraph.hash, c)
                keys = sorted(uniq)
                for i in rng.choice(len(keys), size=min(share, len(keys)), replace=False):
                    chosen.append(uniq[keys[int(i)]])
            out[(model, batch)] = (g, chosen)
    return out


def run_once(groups, refs, cfg, threads, seed: int, mix: bool = False) -> dict:
    """One independent run: a fresh Runner (fresh workers), candidates in a shuffled order. {(model, batch, key): m}.

    By default one (model, batch) at a time, as ``collect`` does; ``mix``: every candidate in one call, so
    a chunk of one backend holds candidates of every model and its windows lie further apart."""
    from collage_ml.measure.runner import Runner

    rng = np.random.default_rng(seed)
    res = {}
    t0 = time.time()
    with Runner(threads=threads, timing=cfg) as r:
        order = list(groups)
        rng.shuffle(order)
        batches = [[mb for mb in order]] if mix else [[mb] for mb in order]
        for mbs in batches:
            tagged = [(mb, c) for mb in mbs for c in groups[mb][1]]
            tagged = [tagged[i] for i in rng.permutation(len(tagged))]
            where = {id(c.subgraph.graph): mb for mb, c in tagged}
            cands = [c for _, c in tagged]
            for (mb, c), m in zip(tagged, r.measure(cands, lambda c: refs[where[id(c.subgraph.graph)]])):
                res[(mb[0], mb[1], c.subgraph.hash, c.backend.name)] = m
    return {"results": res, "seconds": time.time() - t0}


def summarise(pairs: list[dict]) -> dict:
    def stats(rows):
        if not rows:
            return {"n": 0}
        lr = np.abs([r["log_ratio"] for r in rows])
        return {"n": len(rows), "agree": float(np.mean(lr <= TOL)), "median_abs_log_ratio": float(np.median(lr))}

    out = {"all": stats(pairs), "ge_20us": stats([p for p in pairs if p["latency"] >= 20e-6])}
    out["decades"] = {name: stats([p for p in pairs if lo <= p["latency"] < hi]) for lo, hi, name in DECADES}
    out["backends"] = {b: stats([p for p in pairs if p["backend"] == b]) for b in sorted({p["backend"] for p in pairs})}
    out["contended_pairs"] = sum(1 for p in pairs if p.get("contended"))
    return out


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    hw = report.get("hardware", {})
    con.print(f"[bold]{hw.get('cpu_model')} {hw.get('cpu_id')}[/], isa {hw.get('isa')}, "
              f"{report.get('threads')} threads, {report.get('date')}")
    protos = list(report["protocols"])
    t = Table(title="agreement within +-10% (median |log ratio|), two independent runs")
    t.add_column("slice")
    for p in protos:
        t.add_column(f"{p} ({report['protocols'][p]['rate_per_min']:.0f}/min)")
    slices = [("all", lambda s: s["all"]), (">= 20 us", lambda s: s["ge_20us"])]
    slices += [(name, lambda s, n=name: s["decades"][n]) for _, _, name in DECADES]
    backends = sorted({b for p in protos for b in report["protocols"][p]["summary"]["backends"]})
    slices += [(b, lambda s, b=b: s["backends"].get(b, {"n": 0})) for b in backends]
    for label, get in slices:
        cells = []
        for p in protos:
            s = get(report["protocols"][p]["summary"])
            cells.append("-" if not s["n"] else f"{s['agree']:.0%} ({s['median_abs_log_ratio']:.3f}) n={s['n']}")
        t.add_row(label, *cells)
    con.print(t)
    for p in protos:
        s = report["protocols"][p]["summary"]
        con.print(f"{p}: {s['contended_pairs']} pairs had a contended run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenetv2,bert,nasrnn,dcgan")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch")
    ap.add_argument("--count", type=int, default=240)
    ap.add_argument("--max-size", type=int, default=2)
    ap.add_argument("--protocols", default="m1,m2")
    ap.add_argument("--processes", type=int, default=None, help="override the protocol's minimum processes")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="benchmarks/results/measure_agreement.json")
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--mix", action="store_true",
                    help="measure each run's candidates in one call (chunks of every model), not model by model")
    ap.add_argument("--abba", action="store_true",
                    help="run the protocols in reverse order in the second round (A B, then B A), so a slow "
                         "period hits the arms more alike")
    args = ap.parse_args()
    if args.table_only:
        print_tables(json.loads(Path(args.json).read_text()))
        return

    from collage_ml.backends import resolve_backends
    from collage_ml.measure.hardware import hardware_info
    from collage_ml.paths import default_threads

    threads = args.threads or default_threads()
    backends = resolve_backends(args.backends)
    groups = pick(args.models.split(","), [int(b) for b in args.batches.split(",")], backends, args.count,
                  args.max_size, args.seed)
    refs = {mb: g.reference() for mb, (g, _) in groups.items()}
    n = sum(len(c) for _, c in groups.values())
    print(f"{n} candidates from {len(groups)} (model, batch) pairs", file=sys.stderr)
    protos = args.protocols.split(",")
    runs: dict[str, list] = {p: [] for p in protos}
    for rnd in range(2):
        for p in (list(reversed(protos)) if args.abba and rnd == 1 else protos):
            cfg = protocol_config(p, args.processes)
            out = run_once(groups, refs, cfg, threads, seed=args.seed * 100 + rnd * 10 + protos.index(p) + 1,
                           mix=args.mix)
            runs[p].append(out)
            print(f"run {rnd + 1} of {p}: {out['seconds']:.0f} s", file=sys.stderr)
    report = {
        "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"), "threads": threads,
        "hardware": hardware_info(threads), "candidates": n, "protocols": {},
    }
    for p in protos:
        a, b = (r["results"] for r in runs[p])
        pairs = []
        for k in a:
            ma, mb = a[k], b[k]
            if not (ma.valid and mb.valid and ma.median and mb.median):
                continue
            pairs.append({
                "model": k[0], "batch": k[1], "hash": k[2], "backend": k[3], "a": ma.median, "b": mb.median,
                "latency": math.sqrt(ma.median * mb.median), "log_ratio": math.log(mb.median / ma.median),
                "contended": bool(ma.extra.get("contended") or mb.extra.get("contended")),
                "processes": [len(ma.extra.get("process_medians", [1])), len(mb.extra.get("process_medians", [1]))],
                "a_process_medians": ma.extra.get("process_medians"), "b_process_medians": mb.extra.get("process_medians"),
                "steal": [ma.extra.get("cpu_steal"), mb.extra.get("cpu_steal")],
                "window_offsets": [ma.extra.get("window_offsets"), mb.extra.get("window_offsets")],
                "contended_windows": [ma.extra.get("contended_windows"), mb.extra.get("contended_windows")],
            })
        secs = sum(r["seconds"] for r in runs[p]) / 2
        report["protocols"][p] = {
            "config": protocol_config(p, args.processes).__dict__, "seconds_per_run": secs,
            "rate_per_min": 60 * n / secs if secs else 0.0, "summary": summarise(pairs), "pairs": pairs,
        }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print_tables(report)


if __name__ == "__main__":
    main()
