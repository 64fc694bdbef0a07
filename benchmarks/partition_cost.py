"""What a plan of many one-node partitions pays beyond its parts timed alone: the executor's dispatch per partition.

    .venv/bin/python benchmarks/partition_cost.py [--k 32] [--threads 1] [--numel 256] [--backends onnxruntime,openvino,torch]

A chain of K Relu nodes on a [1, numel] float tensor (256: 1 KiB): one node compiled alone and called in a tight
loop, the K nodes as K partitions of one backend (not merged), and as one partition, each timed in this process.
The last figure is (K partitions - K x one alone) / K: what a partition costs in a plan beyond its own
measurement, with no weights.
"""

from __future__ import annotations

import argparse

import numpy as np
from onnx import TensorProto, helper

from collage_ml.backends import resolve_backends
from collage_ml.ir.importers import from_onnx
from collage_ml.measure.timing import TimingConfig, time_callable
from collage_ml.plan import Partition, Plan


def chain(k: int, numel: int):
    names = ["x"] + [f"h{i}" for i in range(k - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(k)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, numel])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, numel])])
    return from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), name="chain")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--numel", type=int, default=256)
    ap.add_argument("--backends", default="onnxruntime,openvino,torch")
    args = ap.parse_args()
    graph = chain(args.k, args.numel)
    x = np.random.default_rng(0).random((1, args.numel), dtype=np.float32)
    cfg = TimingConfig(min_repeats=200, max_repeats=20000, time_cap=1.0)
    for b in resolve_backends(args.backends):
        exe = b.compile(graph.subgraph(1), threads=args.threads)
        alone = time_callable(lambda: exe(x), cfg)
        parts = Plan(graph.name, [Partition(b.name, [i], backend_spec=b.spec()) for i in range(args.k)],
                     graph_hash=graph.whole().hash).compile(graph, threads=args.threads, merge=False)
        whole = Plan.single(graph, b).compile(graph, threads=args.threads)
        tk = time_callable(lambda: parts.run({"x": x}), cfg)
        tw = time_callable(lambda: whole.run({"x": x}), cfg)
        per = (tk.median - args.k * alone.median) / args.k
        print(f"{b.name:12s} threads={args.threads} K={args.k}: one node alone {alone.median * 1e6:7.2f} us, "
              f"{args.k} partitions {tk.median * 1e6:8.1f} us, one partition {tw.median * 1e6:7.1f} us; "
              f"beyond the parts {per * 1e6:6.2f} us a partition")


if __name__ == "__main__":
    main()
