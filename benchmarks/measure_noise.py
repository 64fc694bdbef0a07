"""Measurement noise: the same candidates measured twice, in separate worker processes.

    .venv/bin/python benchmarks/measure_noise.py [--model resnet50-tiny] [--count 20] [--backends ...]

Prints, per backend, the median ratio run2/run1 of the candidates' medians
and the 90th percentile of |ratio - 1|. Target: within 5% on an idle machine.
"""

from __future__ import annotations

import argparse

import numpy as np

from collage_ml.backends import resolve_backends
from collage_ml.candidates import enumerate_candidates
from collage_ml.ir import import_model
from collage_ml.measure.runner import Runner


def pick(graph, backend, count: int, max_size: int, seed: int = 0):
    cands = [c for c in enumerate_candidates(graph, [backend], max_region_size=max_size) if len(c.subgraph) <= max_size]
    uniq = {c.subgraph.hash: c for c in cands}
    rng = np.random.default_rng(seed)
    keys = sorted(uniq)
    return [uniq[keys[i]] for i in rng.choice(len(keys), size=min(count, len(keys)), replace=False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50-tiny")
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--max-size", type=int, default=4)
    ap.add_argument("--backends", default="onnxruntime,openvino,torch")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    graph = import_model(args.model)
    ref = graph.reference()
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"measurement noise, {args.model}, {args.count} candidates per backend, run2/run1")
    for col in ("backend", "valid", "median ratio", "p90 |ratio-1|", "max |ratio-1|"):
        table.add_column(col)
    for backend in resolve_backends(args.backends):
        cands = pick(graph, backend, args.count, args.max_size)
        runs = []
        for _ in range(2):
            with Runner(threads=args.threads) as r:  # a fresh worker process per run
                runs.append(r.measure(cands, ref))
        ratios = np.array([b.median / a.median for a, b in zip(*runs) if a.valid and b.valid])
        dev = np.abs(ratios - 1)
        table.add_row(
            backend.name, f"{len(ratios)}/{len(cands)}", f"{np.median(ratios):.3f}",
            f"{np.percentile(dev, 90):.3f}", f"{dev.max():.3f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
