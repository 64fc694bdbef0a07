"""Kernel libraries against the default backend-configurations, per region kind, in separate processes.

    .venv/bin/python benchmarks/kernel_libraries.py --quick                       # smoke test, ~2 min
    .venv/bin/python benchmarks/kernel_libraries.py --json benchmarks/results/kernel_libraries.json
    .venv/bin/python benchmarks/kernel_libraries.py --table-only                  # reprint --json

The adoption rule (issue #9): a library joins the default set only where it
wins a region kind by more than 5% in repeated, separate-process measurements.

Subgraphs: single nodes and 2-3 node regions of the full-size zoo models, at
each ``--batches``, grouped into region kinds by their heaviest op (conv >
conv-transpose > matmul > normalization/reduction > pool > elementwise > data
movement); ``--per-kind`` distinct subgraphs per kind and batch, spread over
the models. Reference outputs come from onnxruntime on the whole model.

Measurement: ``--rounds`` rounds; in each, every backend gets a **fresh worker
process** (:class:`collage_ml.measure.runner.Worker`) that compiles, checks
against the reference (the fp32 gate of :mod:`collage_ml.measure.timing`) and
times every subgraph it supports; the backend order rotates between rounds.
A subgraph's latency on a backend is the median of its round medians.

Verdict per (library, kind): ``ratio`` is the geometric mean over the kind's
subgraphs of library / best baseline (best of the baseline configurations,
per subgraph, from the same rounds); ``wins`` when that ratio is below 0.95
in the pooled medians **and** in every single round. Candidates that fail the
gate (wrong numbers) or do not compile count in ``bad`` and are left out of
the ratio, so a library cannot win a kind by failing its hard cases: a kind
with any ``bad`` subgraph is reported as not won.

``tvm+msN`` is TVM with N MetaSchedule trials per task, measured on
elementwise and normalization/reduction kinds only (issue #9's question);
tuning happens in the first round's compile and is reused from the tuning
database afterwards. Results are cached per (round, backend) in ``--json`` as
they arrive, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = "resnet50,mobilenetv2,bert,nasrnn,dcgan,nasnet,resnext50"
DEFAULT_BASELINES = "onnxruntime,onnxruntime[spin=on],openvino"
DEFAULT_CANDIDATES = "mnn,mnn[winograd=high],tinygrad,tvm+ms32"
TVM_KINDS = ("elementwise", "normalization/reduction")
WIN = 0.95

KIND_OPS = (
    ("conv", {"Conv"}),
    ("conv-transpose", {"ConvTranspose"}),
    ("matmul", {"MatMul", "Gemm"}),
    ("normalization/reduction", {"Softmax", "LayerNormalization", "BatchNormalization", "ReduceMean",
                                 "ReduceSum", "ReduceMax", "InstanceNormalization"}),
    ("pool", {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}),
    ("elementwise", {"Add", "Mul", "Sub", "Div", "Relu", "Sigmoid", "Tanh", "Clip", "Gelu", "Erf", "Pow",
                     "Sqrt", "Exp", "Neg", "HardSigmoid", "HardSwish", "LeakyRelu"}),
)


def kind_of(op_types: list[str]) -> str:
    ops = set(op_types)
    for kind, members in KIND_OPS:
        if ops & members:
            return kind
    return "data movement"


def make_backend(name: str):
    """A backend by name; ``tvm+msN`` is TVM tuned with N MetaSchedule trials per task."""
    from collage_ml.backends import get_backend

    if name.startswith("tvm+ms"):
        from collage_ml.backends.tvm_backend import TVMBackend

        b = TVMBackend(trials=int(name[len("tvm+ms"):]))
        b.name = name
        return b
    return get_backend(name)


def pick_subgraphs(models: list[str], batches: list[int], per_kind: int, seed: int):
    """[(id, kind, batch, model, ops, onnx bytes, feeds, expected)], deterministic for a seed."""
    from collage_ml.backends.patterns import RegionPattern
    from collage_ml.ir.importers import import_model

    pool: dict[tuple[str, int], list] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    for batch in batches:
        for model in models:
            g = import_model(model, batch=batch)
            masks = list(RegionPattern("r", max_size=3, max_regions=4000).matches(g, lambda n: True))
            random.Random(f"{seed}-{model}-{batch}").shuffle(masks)
            for mask in masks:
                sg = g.subgraph(mask)
                if mask == g.all_mask or (sg.hash, batch) in seen:
                    continue
                seen.add((sg.hash, batch))
                ops = [n.op_type for n in sg.nodes]
                pool[(kind_of(ops), batch)].append((model, g, mask, ops))
    chosen = []
    refs: dict[tuple[str, int], dict] = {}
    for (kind, batch), items in sorted(pool.items()):
        # round-robin over models and sizes, so a kind is not all one model's single nodes
        by_key = defaultdict(list)
        for it in items:
            by_key[(it[0], len(it[3]) > 1)].append(it)
        keys = sorted(by_key)
        picked = []
        while len(picked) < per_kind and any(by_key[k] for k in keys):
            for k in keys:
                if by_key[k] and len(picked) < per_kind:
                    picked.append(by_key[k].pop(0))
        for model, g, mask, ops in picked:
            if (model, batch) not in refs:
                refs[(model, batch)] = g.reference()
            sg = g.subgraph(mask)
            feeds, expected = sg.reference_io(refs[(model, batch)])
            chosen.append({
                "id": f"{sg.hash[:12]}@b{batch}", "kind": kind, "batch": batch, "model": model, "ops": ops,
                "onnx": sg.to_onnx().SerializeToString(), "feeds": feeds, "expected": expected,
                "sg": sg,
            })
    return chosen


def measure_round(backend, subgraphs, threads: int, timeout: float) -> dict:
    """{subgraph id: result dict} from one fresh worker process for ``backend``."""
    from collage_ml.measure.runner import Worker
    from collage_ml.measure.tasks import Task

    out = {}
    worker = Worker(threads)
    worker.start()
    try:
        for s in subgraphs:
            if backend.name.startswith("tvm+ms") and s["kind"] not in TVM_KINDS:
                continue
            if not backend.supports_subgraph(s["sg"]):
                out[s["id"]] = {"valid": False, "unsupported": True, "error_text": "unsupported"}
                continue
            task = Task(backend.spec(), s["onnx"], s["feeds"], s["expected"], threads)
            r = worker.run(task, timeout)
            r.pop("samples", None)
            out[s["id"]] = r
    finally:
        worker.stop()
    return out


def geomean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def analyse(results: dict, subgraphs: list[dict], baselines: list[str], candidates: list[str], rounds: int):
    """Per (kind@batch, backend): ratio to the best baseline, per-round ratios, counts."""
    meta = {s["id"]: s for s in subgraphs}

    def med(backend, sid, r=None):
        rs = range(rounds) if r is None else [r]
        vals = [results.get(f"{k}|{backend}", {}).get(sid) for k in rs]
        vals = [v["median"] for v in vals if v and v.get("valid")]
        return statistics.median(vals) if vals else None

    table = {}
    for sid, s in meta.items():
        group = f"{s['kind']}@b{s['batch']}"
        base = [m for b in baselines if (m := med(b, sid)) is not None]
        if not base:
            continue
        best = min(base)
        for b in baselines + candidates:
            row = table.setdefault((group, b), {"ratios": [], "rounds": [[] for _ in range(rounds)], "bad": 0,
                                                "unsupported": 0, "errors": []})
            res = [results.get(f"{k}|{b}", {}).get(sid) for k in range(rounds)]
            res = [x for x in res if x is not None]
            if not res:
                continue
            if any(x.get("unsupported") for x in res):
                row["unsupported"] += 1
                continue
            m = med(b, sid)
            if m is None or any(not x.get("valid") for x in res):
                row["bad"] += 1
                row["errors"].append(next(x.get("error_text", "") for x in res if not x.get("valid"))[:160])
                continue
            row["ratios"].append(m / best)
            for r in range(rounds):
                base_r = [v for bb in baselines if (v := med(bb, sid, r)) is not None]
                mr = med(b, sid, r)
                if base_r and mr is not None:
                    row["rounds"][r].append(mr / min(base_r))
    out = {}
    for (group, b), row in table.items():
        ratio = geomean(row["ratios"])
        per_round = [geomean(rr) for rr in row["rounds"] if rr]
        wins = (b in candidates and ratio is not None and ratio < WIN and row["bad"] == 0
                and all(x < WIN for x in per_round))
        out.setdefault(group, {})[b] = {
            "ratio": ratio, "round_ratios": per_round, "n": len(row["ratios"]), "bad": row["bad"],
            "unsupported": row["unsupported"], "wins": wins, "errors": row["errors"][:3],
        }
    return out


def print_table(analysis: dict, backends: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="geomean latency / best default backend-configuration, per region kind "
                    "(n valid, bad = wrong numbers or failed, * = wins by >5% in every round)")
    t.add_column("kind @ batch")
    for b in backends:
        t.add_column(b, justify="right", no_wrap=True)
    for group in sorted(analysis):
        cells = []
        for b in backends:
            c = analysis[group].get(b)
            if not c or (c["ratio"] is None and not c["bad"]):
                cells.append("-")
                continue
            txt = f"{c['ratio']:.2f}" if c["ratio"] is not None else "n/a"
            txt += f" ({c['n']}" + (f", {c['bad']} bad" if c["bad"] else "") + ")"
            cells.append(("*" if c["wins"] else "") + txt)
        t.add_row(group, *cells)
    Console(width=200).print(t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--baselines", default=DEFAULT_BASELINES)
    ap.add_argument("--candidates", default=DEFAULT_CANDIDATES)
    ap.add_argument("--per-kind", type=int, default=6, help="subgraphs per region kind and batch")
    ap.add_argument("--rounds", type=int, default=3, help="separate-process rounds per backend")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per subgraph (TVM tuning included)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write (and resume from) this results file")
    ap.add_argument("--table-only", action="store_true", help="print the table from --json without measuring")
    ap.add_argument("--export", type=Path, default=None, metavar="DIR",
                    help="write the picked subgraphs (ONNX + reference .npz + index.json) to DIR and stop; "
                         "benchmarks/ort_execution_providers.py times them under other venvs")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 models, batch 1, 2 per kind, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.batches, args.per_kind, args.rounds = "mobilenetv2,bert", "1", 2, 2
        args.candidates = args.candidates.replace("tvm+ms32", "tvm+ms4")

    from collage_ml.backends.base import split_backend_names
    from collage_ml.paths import default_threads

    baselines = split_backend_names(args.baselines)
    candidates = split_backend_names(args.candidates)
    if args.table_only:
        if not args.json or not args.json.exists():
            ap.error("--table-only needs an existing --json file")
        saved = json.loads(args.json.read_text())
        print_table(saved["analysis"], saved["baselines"] + saved["candidates"])
        return 0
    threads = args.threads or default_threads()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    t0 = time.perf_counter()
    subgraphs = pick_subgraphs(models, batches, args.per_kind, args.seed)
    print(f"{len(subgraphs)} subgraphs over {len({s['kind'] for s in subgraphs})} kinds, "
          f"picked in {time.perf_counter() - t0:.0f} s", flush=True)

    if args.export:
        export(args.export, subgraphs)
        print(f"wrote {len(subgraphs)} subgraphs to {args.export}")
        return 0
    saved = {}
    if args.json and args.json.exists():
        old = json.loads(args.json.read_text())
        if old.get("ids") == [s["id"] for s in subgraphs] and old.get("threads") == threads:
            saved = old.get("results", {})
            print(f"resuming: {len(saved)} (round, backend) results from {args.json}", flush=True)
    results = dict(saved)
    names = baselines + candidates
    backends = {}
    for n in names:
        try:
            b = make_backend(n)
        except Exception as e:  # an unknown name, a malformed configuration
            print(f"skipping {n}: {e}", flush=True)
            continue
        if not b.available():
            print(f"skipping {n}: {b.unavailable_reason()}", flush=True)
            continue
        backends[n] = b
    for r in range(args.rounds):
        order = list(backends)
        order = order[r % len(order):] + order[: r % len(order)]
        for n in order:
            key = f"{r}|{n}"
            if key in results:
                continue
            t1 = time.perf_counter()
            results[key] = measure_round(backends[n], subgraphs, threads, args.timeout)
            ok = sum(1 for v in results[key].values() if v.get("valid"))
            print(f"round {r + 1}/{args.rounds} {n}: {ok}/{len(results[key])} valid, "
                  f"{time.perf_counter() - t1:.0f} s", flush=True)
            if args.json:
                _write(args.json, subgraphs, results, threads, baselines, candidates, args, None)
    analysis = analyse(results, subgraphs, baselines, [c for c in candidates if c in backends], args.rounds)
    print_table(analysis, [n for n in names if n in backends])
    won = sorted({(b, g) for g, row in analysis.items() for b, c in row.items() if c["wins"]})
    print("wins by more than 5% in every round:", ", ".join(f"{b} on {g}" for b, g in won) or "none")
    if args.json:
        _write(args.json, subgraphs, results, threads, baselines, candidates, args, analysis)
        print(f"wrote {args.json}")
    return 0


def export(directory: Path, subgraphs) -> None:
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    index = {}
    for s in subgraphs:
        stem = s["id"].replace("@", "_")
        (directory / f"{stem}.onnx").write_bytes(s["onnx"])
        arrays = {f"in:{k}": v for k, v in s["feeds"].items()}
        arrays.update({f"out:{i:03d}:{k}": v for i, (k, v) in enumerate(s["expected"].items())})
        np.savez(directory / f"{stem}.npz", **arrays)
        index[stem] = {"kind": f"{s['kind']}@b{s['batch']}", "model": s["model"], "ops": s["ops"]}
    (directory / "index.json").write_text(json.dumps(index, indent=1))


def _write(path: Path, subgraphs, results, threads, baselines, candidates, args, analysis) -> None:
    from collage_ml.measure.hardware import fingerprint

    doc = {
        "command": "benchmarks/kernel_libraries.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "hardware": fingerprint(threads), "threads": threads,
        "rounds": args.rounds, "baselines": baselines, "candidates": candidates,
        "ids": [s["id"] for s in subgraphs],
        "subgraphs": {s["id"]: {"kind": s["kind"], "batch": s["batch"], "model": s["model"], "ops": s["ops"]}
                      for s in subgraphs},
        "results": results, "analysis": analysis,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=float))
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
