"""GPU check: list the backends, then measure a dozen candidates of a -tiny zoo model on each CUDA backend.

    python benchmarks/gpu_check.py [--model resnet50-tiny] [--count 12]

Each candidate is compiled, checked against the onnxruntime reference and
timed in a worker process (the same Runner as everything else). Prints the
backend list and one table row per candidate. Exits 1 when no CUDA backend
is available.
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
