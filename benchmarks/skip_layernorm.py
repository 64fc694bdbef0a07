"""ONNX Runtime's SkipLayerNormalization fusion against the two kernels it replaces, and against OpenVINO.

    .venv/bin/python benchmarks/skip_layernorm.py [--threads 2,1] [--batches 1,2,8,16]
        [--backends onnxruntime,onnxruntime[skipln=off],openvino] [--json benchmarks/results/skip_layernorm.json]
    .venv/bin/python benchmarks/skip_layernorm.py --table-only     # reprint --json

ORT's ``all`` level fuses a residual ``Add`` (and a bias ``Add``) followed by
``LayerNormalization`` into ``com.microsoft.SkipLayerNormalization``;
``onnxruntime[skipln=off]`` turns only that fusion off. Two kinds of graph:

- **kernels**: ``x + y`` then ``LayerNormalization`` over the last axis, at
  shapes of encoder activations (tokens x hidden), which ORT fuses; and
  ``(x + y) + bias`` then ``LayerNormalization``, which onnxruntime 1.32 does
  not fuse in that order (its bias pattern is ``(x + bias) + y``): the same
  kernels on both ORT configurations, a control for the contest's noise;
- **models**: the zoo's ``bert`` at ``--batches``, whole model on each backend.

Each graph's whole-model plans (``Plan.single``) are timed head to head in one
worker (:func:`collage_ml.measure.e2e.measure_head_to_head`: alternating
windows, outputs checked against the reference first), at each ``--threads``.
The table gives each backend's median and the ratio fused / unfused
(``onnxruntime`` / ``onnxruntime[skipln=off]``); above 1 the fusion costs time.
Results go to ``--json`` as they arrive, and a rerun skips what it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.head_to_head_processes import cpu_kind  # noqa: E402

KERNEL_SHAPES = ((1, 64, 256), (16, 64, 256), (1, 64, 768), (4, 96, 512), (1, 8, 384))
FUSED, UNFUSED = "onnxruntime", "onnxruntime[skipln=off]"


def add_layernorm(shape: tuple[int, ...], bias: bool):
    """``x + y`` (``+ bias`` when ``bias``), then LayerNormalization over the last axis, as an ONNX model."""
    from onnx import TensorProto, helper, numpy_helper

    d = shape[-1]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), n) for n in ("gamma", "beta", "b")]
    nodes = [helper.make_node("Add", ["x", "y"], ["s"])]
    if bias:
        nodes.append(helper.make_node("Add", ["s", "b"], ["sb"]))
    else:
        inits = inits[:2]
    nodes.append(helper.make_node("LayerNormalization", [nodes[-1].output[0], "gamma", "beta"], ["out"],
                                  axis=-1, epsilon=1e-5))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    outs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, list(shape))]
    graph = helper.make_graph(nodes, "addln", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def graphs(batches: list[int], only: str | None = None):
    from collage_ml.ir import from_onnx, import_model

    for shape in (KERNEL_SHAPES if only != "models" else ()):
        for bias in (False, True):
            key = f"add{'+bias' if bias else ''}+ln {list(shape)}"
            yield key, lambda s=shape, b=bias: from_onnx(add_layernorm(s, b), name="addln")
    for b in (batches if only != "kernels" else ()):
        yield f"bert b{b}", lambda b=b: import_model("bert", batch=b)


def contest(graph, backends: list[str], threads: int) -> dict:
    from collage_ml.backends import get_backend
    from collage_ml.measure.e2e import measure_head_to_head
    from collage_ml.measure.runner import Runner
    from collage_ml.plan import Plan

    ref = graph.reference()
    plans = {b: Plan.single(graph, get_backend(b)) for b in backends}
    with Runner(threads=threads) as runner:
        res = measure_head_to_head(runner, graph, plans, ref)
    return {b: ({"median_ms": res[b]["median"] * 1e3, "windows": len(res[b]["samples"])} if res[b].get("valid")
                else {"error": res[b].get("error_text")}) for b in backends}


def table(out: dict, console: Console) -> None:
    backends = out["backends"]
    for threads, rows in out["results"].items():
        t = Table(title=f"head to head, {threads} thread(s), ms (median of alternating windows); "
                        f"{out['hardware']['cpu_model']}, {out['hardware']['cpuinfo']}")
        t.add_column("graph")
        for b in backends:
            t.add_column(escape(b), justify="right")
        t.add_column("fused / unfused", justify="right")
        if "openvino" in backends:
            t.add_column("unfused / openvino", justify="right")
        for key, r in rows.items():
            ms = {b: r[b].get("median_ms") for b in backends}
            cells = [f"{ms[b]:.3f}" if ms[b] else "[red]" + escape(str(r[b].get("error", "?"))[:30]) for b in backends]
            ratio = f"{ms[FUSED] / ms[UNFUSED]:.2f}" if ms.get(FUSED) and ms.get(UNFUSED) else "-"
            cells.append(ratio)
            if "openvino" in backends:
                cells.append(f"{ms[UNFUSED] / ms['openvino']:.2f}" if ms.get(UNFUSED) and ms.get("openvino") else "-")
            t.add_row(key, *cells)
        console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="2,1")
    ap.add_argument("--batches", default="1,2,8,16")
    ap.add_argument("--backends", default=f"{FUSED},{UNFUSED},openvino")
    ap.add_argument("--json", default="benchmarks/results/skip_layernorm.json")
    ap.add_argument("--only", choices=("kernels", "models"), help="run one kind of graph only")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    console = Console(width=170)
    path = Path(args.json)
    backends = [b.strip() for b in args.backends.split(",")]
    if args.table_only:
        table(json.loads(path.read_text()), console)
        return
    from collage_ml.measure.hardware import hardware_info

    threads_list = [int(t) for t in args.threads.split(",")]
    hw = hardware_info(threads_list[0])
    hw["cpuinfo"] = cpu_kind()
    out = json.loads(path.read_text()) if path.exists() else {}
    if out.get("hardware", {}).get("fingerprint") != hw["fingerprint"] or out.get("backends") != backends:
        out = {"hardware": hw, "backends": backends, "results": {}}
    console.print(f"CPU: {hw['cpu_model']}, {hw['cpuinfo']}; ISA {hw['isa']}")
    for threads in threads_list:
        rows = out["results"].setdefault(str(threads), {})
        for key, make in graphs([int(b) for b in args.batches.split(",")], args.only):
            if key in rows:
                continue
            rows[key] = contest(make(), backends, threads)
            console.print(escape(f"{threads}t {key}: " + ", ".join(
                f"{b} {r['median_ms']:.3f} ms" if "median_ms" in r else f"{b} ERROR {r['error']}"
                for b, r in rows[key].items())))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(out, indent=1, default=str))
    table(out, console)
    console.print(f"saved {path}")


if __name__ == "__main__":
    main()
