"""Executor overhead: the whole model on one backend, natively and through a PlacedModel.

    .venv/bin/python benchmarks/executor_overhead.py [--models resnet50,bert,resnet50-tiny] [--backends ...]

Both are timed in this process, alternating, three rounds; the ratio
placed/native per round is printed. Target: within 3% (ratio <= 1.03).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from collage_ml.backends import resolve_backends
from collage_ml.ir import import_model
from collage_ml.measure.timing import TimingConfig, time_callable
from collage_ml.plan import Plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,bert,resnet50-tiny")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg = TimingConfig(min_repeats=20, max_repeats=2000, time_cap=1.0)
    t = Table(title="placed / native, whole model on one backend (3 rounds)")
    for c in ("model", "backend", "native ms", "placed ms", "ratio r1", "r2", "r3"):
        t.add_column(c)
    for name in args.models.split(","):
        g = import_model(name)
        ref = g.reference()
        feeds = {n: ref[n] for n in g.input_names}
        for b in resolve_backends(args.backends):
            exe = b.compile(g.whole(), threads=args.threads)
            xs = [feeds[n] for n in exe.input_names]
            pm = Plan.single(g, b).compile(g, threads=args.threads)
            ratios = []
            for _ in range(3):
                native = time_callable(lambda: exe(*xs), cfg).median
                placed = time_callable(lambda: pm.run(feeds), cfg).median
                ratios.append(placed / native)
            t.add_row(name, b.name, f"{native * 1e3:.3f}", f"{placed * 1e3:.3f}", *(f"{r:.3f}" for r in ratios))
    Console().print(t)


if __name__ == "__main__":
    main()
