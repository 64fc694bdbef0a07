"""GPU check and headroom study: the CUDA backends, per-kind latencies, and exhaustive placement.

    python benchmarks/gpu_check.py [--model resnet50-tiny] [--count 12] [--study] [--place a-tiny,b-tiny]

1. Lists the backends, then measures ``--count`` candidates of a -tiny zoo
   model on each CUDA backend: each one compiled, checked against the
   onnxruntime reference and timed in a worker process (the same Runner as
   everything else).
2. ``--study`` (default on): random convex subgraphs (1-4 nodes) of the
   ``--study-models`` on every CUDA backend that can run them; prints, per op
   type (single nodes) and per region kind (2-, 3-, 4-node regions), each
   backend's median latency relative to the best backend for that subgraph
   (torch-cuda = cuDNN/cuBLAS, inductor-cuda = Triton, tvm-cuda = dlight).
3. ``--place``: exhaustive placement of two -tiny zoo models over the CUDA
   backends; prints the placed plan against the best single backend, end to end.

Everything is written as one short script for a lent GPU machine; it exits 1
when no CUDA backend is available. ``--json PATH`` saves the tables.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from collage_ml.backends import all_backends
from collage_ml.candidates import enumerate_candidates
from collage_ml.ir import import_model
from collage_ml.measure.runner import Runner


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50-tiny")
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--max-size", type=int, default=4)
    ap.add_argument("--study", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--study-models", default="resnet50-tiny,bert-tiny,mobilenetv2-tiny")
    ap.add_argument("--samples", type=int, default=25, help="random subgraphs per study model")
    ap.add_argument("--place", default="resnet50-tiny,bert-tiny", help="models to place exhaustively ('' skips)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    console = Console()
    backends = all_backends()
    t = Table(title="backends")
    for c in ("name", "device", "available", "version", "note"):
        t.add_column(c)
    for b in backends:
        t.add_row(b.name, b.device, str(b.available()), b.version, b.unavailable_reason() or "")
    console.print(t)
    cuda = [b for b in backends if b.device == "cuda" and b.available()]
    if not cuda:
        console.print("[red]no CUDA backend is available[/]")
        return 1
    graph = import_model(args.model)
    ref = graph.reference()
    res = Table(title=f"{args.model} on CUDA backends")
    for c in ("backend", "nodes", "ops", "valid", "median us", "max abs err", "compile s", "error"):
        res.add_column(c)
    with Runner(timeout=300) as runner:
        for b in cuda:
            cands = []
            for c in enumerate_candidates(graph, [b], max_region_size=args.max_size):
                if len(c.subgraph) <= args.max_size or len(c.subgraph) == len(graph):
                    cands.append(c)
                if len(cands) >= args.count:
                    break
            for c, m in zip(cands, runner.measure(cands, ref)):
                ops = ",".join(n.op_type for n in c.subgraph.nodes[:3]) + ("..." if len(c.subgraph) > 3 else "")
                res.add_row(
                    b.name, str(len(c.subgraph)), ops, str(m.valid),
                    f"{m.median * 1e6:.1f}" if m.valid else "-",
                    f"{m.max_abs_error:.2e}" if m.max_abs_error is not None else "-",
                    f"{m.compile_seconds:.2f}" if m.compile_seconds is not None else "-",
                    m.error_text[:60],
                )
    console.print(res)
    out: dict = {}
    if args.study:
        out["study"] = study(cuda, args, console)
    if args.place:
        out["place"] = place(cuda, args, console)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


def _kind(sg) -> str:
    return sg.nodes[0].op_type if len(sg) == 1 else (f"{len(sg)}-node regions" if len(sg) < 4 else "4+-node regions")


def study(cuda, args, console) -> dict:
    import statistics

    from collage_ml.candidates import Candidate
    from collage_ml.collector.sampling import sample_subgraphs

    rel: dict[str, dict[str, list[float]]] = {}
    with Runner(timeout=300) as runner:
        for model in args.study_models.split(","):
            graph = import_model(model)
            ref = graph.reference()
            sgs = sample_subgraphs(graph, args.samples, args.max_size, 0, label=model)
            for sg in sgs:
                cands = [Candidate(sg, b, "study") for b in cuda if b.supports_subgraph(sg)]
                if len(cands) < 2:
                    continue
                ms = runner.measure(cands, ref)
                got = {c.backend.name: m.median for c, m in zip(cands, ms) if m.valid}
                if len(got) < 2:
                    continue
                best = min(got.values())
                for name, v in got.items():
                    rel.setdefault(_kind(sg), {}).setdefault(name, []).append(v / best)
    names = [b.name for b in cuda]
    t = Table(title="CUDA backends: median latency relative to the best backend per subgraph (1.00 = best)")
    t.add_column("kind")
    t.add_column("n")
    for n in names:
        t.add_column(n)
    rows = {}
    for kind, by in sorted(rel.items()):
        n = max(len(v) for v in by.values())
        rows[kind] = {b: statistics.median(v) for b, v in by.items()}
        t.add_row(kind, str(n), *[f"{rows[kind][b]:.2f}" if b in rows[kind] else "-" for b in names])
    console.print(t)
    return rows


def place(cuda, args, console) -> dict:
    import collage_ml
    from collage_ml.search.evolutionary import EvoConfig

    out = {}
    t = Table(title="exhaustive placement over the CUDA backends (end to end, ms)")
    for c in ("model", *[b.name for b in cuda], "placed", "speed-up", "partitions"):
        t.add_column(c)
    for model in [m for m in args.place.split(",") if m]:
        pm = collage_ml.place(model, backends=[b.name for b in cuda], db=".cache/gpu-check.db", max_region_size=3,
                              evo_config=EvoConfig(generations=3))
        r = pm.report
        out[model] = {k: r[k] for k in ("baselines_e2e_ms", "plan_latency_ms", "speedup_vs_best_single", "partitions")}
        t.add_row(model, *[f"{r['baselines_e2e_ms'].get(b.name) or float('nan'):.3f}" for b in cuda],
                  f"{r['plan_latency_ms']:.3f}", f"{r['speedup_vs_best_single'] or float('nan'):.2f}x",
                  str(len(r["partitions"])))
    console.print(t)
    return out


if __name__ == "__main__":
    sys.exit(main())
