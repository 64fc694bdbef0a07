"""Compares GNN cost-model architectures with leave-one-family-out validation.

    .venv/bin/python benchmarks/gnn_arch.py datasets/cpu-2core-zen4/measurements.db \
        --holdout nasnet bert mobilenetv2 --convs sage gin gat   # ~2-3 min

For every configuration (conv x hidden) and every held-out family: trains on
the other families, predicts the held-out one and prints

- MAPE: mean |predicted / measured latency - 1|;
- rank: pairwise ranking accuracy among samples sharing a subgraph hash (same
  subgraph, different backends): the fraction of pairs with different
  measured latencies whose order the model gets right;
- cover: fraction of samples whose |log error| is within one predicted sd
  (MC dropout; a calibrated Gaussian would give ~0.68);
- fit: training time in seconds, and predictions per second.

A final table averages over the held-out families. ``--full`` also times a fit
on the whole database with the default parameters (plus any --set, --epochs, --layers).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import defaultdict

import numpy as np


def pair_rank_accuracy(samples, pred_log: np.ndarray) -> float:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.info.hash].append(i)
    right = total = 0
    for idx in groups.values():
        for i, j in itertools.combinations(idx, 2):
            ti, tj = samples[i].latency, samples[j].latency
            if ti == tj:
                continue
            total += 1
            right += (ti < tj) == (pred_log[i] < pred_log[j])
    return right / total if total else float("nan")


def backend_prior(train, test) -> float:
    """Ranking accuracy of a model-free reference: each backend's mean log-latency offset
    from the per-subgraph mean on the training families."""
    groups: dict[str, list] = defaultdict(list)
    for s in train:
        groups[s.info.hash].append(s)
    off: dict[str, list[float]] = defaultdict(list)
    for g in groups.values():
        if len(g) > 1:
            m = np.mean([s.log_latency for s in g])
            for s in g:
                off[s.backend].append(s.log_latency - m)
    prior = {b: float(np.mean(v)) for b, v in off.items()}
    samples = list(test)
    return pair_rank_accuracy(samples, np.array([prior.get(s.backend, 0.0) for s in samples]))


def evaluate(model, test) -> dict[str, float]:
    samples = list(test)
    t = time.perf_counter()
    mu, sd = model.predict_log(samples)
    dt = time.perf_counter() - t
    y = test.y()
    return {
        "mape": float(np.mean(np.abs(np.exp(mu - y) - 1))),
        "medape": float(np.median(np.abs(np.exp(mu - y) - 1))),
        "rank": pair_rank_accuracy(samples, mu),
        "cover": float(np.mean(np.abs(mu - y) <= sd)),
        "sd": float(np.mean(sd)),
        "pred_per_s": len(samples) / dt,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--holdout", nargs="+", default=["nasnet", "bert", "mobilenetv2"])
    ap.add_argument("--convs", nargs="+", default=["sage", "gin", "gat"])
    ap.add_argument("--hidden", nargs="+", type=int, default=[64])
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads for the model (its default: 1)")
    ap.add_argument("--full", action="store_true", help="also time a fit on the whole database")
    ap.add_argument("--set", nargs="*", default=[], metavar="K=V", help="extra model parameters")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(2)
    from collage_ml.models.dataset import Dataset
    from collage_ml.models.gnn import GNNCostModel

    extra = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        extra[k] = json.loads(v) if v.lower() in ("true", "false") or v[:1].isdigit() or v[:1] == "-" else v
    if args.epochs is not None:
        extra["epochs"] = args.epochs
    if args.layers is not None:
        extra["layers"] = args.layers
    if args.threads is not None:
        extra["threads"] = args.threads

    t = time.perf_counter()
    data = Dataset.from_db(args.db)
    print(f"{len(data)} samples from {args.db} in {time.perf_counter() - t:.1f}s; sources {data.sources()}", flush=True)

    print("backend-prior reference rank accuracy: " + ", ".join(
        f"{fam} {backend_prior(*data.split_by_source([fam])):.3f}" for fam in args.holdout), flush=True)
    summary = []
    for conv, hidden in itertools.product(args.convs, args.hidden):
        rows = []
        for fam in args.holdout:
            train, test = data.split_by_source([fam])
            m = GNNCostModel(conv=conv, hidden=hidden, **extra)
            t = time.perf_counter()
            m.fit(train)
            fit_s = time.perf_counter() - t
            r = evaluate(m, test)
            r["fit_s"] = fit_s
            rows.append(r)
            print(
                f"{conv:5s} h={hidden:<4d} holdout={fam:12s} n={len(test):5d}  MAPE {r['mape']:.3f}  "
                f"medAPE {r['medape']:.3f}  rank {r['rank']:.3f}  cover {r['cover']:.2f} (sd {r['sd']:.3f})  "
                f"fit {fit_s:5.1f}s  {r['pred_per_s']:.0f} pred/s",
                flush=True,
            )
        avg = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
        summary.append((conv, hidden, avg))

    print("\nmean over held-out families " + ", ".join(args.holdout) + f"  (params {extra or 'default'})")
    print(f"{'conv':5s} {'hidden':>6s} {'MAPE':>7s} {'medAPE':>7s} {'rank':>6s} {'cover':>6s} {'fit s':>6s} {'pred/s':>8s}")
    for conv, hidden, a in summary:
        print(
            f"{conv:5s} {hidden:6d} {a['mape']:7.3f} {a['medape']:7.3f} {a['rank']:6.3f} {a['cover']:6.2f} "
            f"{a['fit_s']:6.1f} {a['pred_per_s']:8.0f}"
        )

    if args.full:
        m = GNNCostModel(**extra)
        t = time.perf_counter()
        m.fit(data)
        print(f"\nfull fit ({len(data)} samples, params {m.params}): {time.perf_counter() - t:.1f}s", flush=True)
        samples = list(data)
        t = time.perf_counter()
        m.predict_log(samples)
        print(f"predict {len(samples)}: {time.perf_counter() - t:.2f}s ({len(samples) / (time.perf_counter() - t):.0f}/s)")


if __name__ == "__main__":
    main()
