"""ONNX Runtime's alternative execution providers on this CPU, against plain ORT and OpenVINO.

The PyPI ``onnxruntime`` wheel (1.32) ships two providers: ``CPUExecutionProvider``
(MLAS, what the ``onnxruntime`` backend runs) and ``AzureExecutionProvider``
(remote inference, no local kernels). The other CPU providers on PyPI come in
their own wheels that replace the ``onnxruntime`` module, so they cannot share
collage-ml's venv: ``onnxruntime-openvino`` (1.24.1, OpenVINO EP) is the one
for x86 Linux; there is no ``onnxruntime-dnnl`` wheel. This script therefore
runs each provider in a **separate interpreter**, one fresh process per
(round, provider), on subgraphs exported by ``benchmarks/kernel_libraries.py
--export DIR``::

    python3 -m venv /tmp/ortov && /tmp/ortov/bin/pip install onnxruntime-openvino==1.24.1 onnx
    .venv/bin/python benchmarks/kernel_libraries.py --export /tmp/kl-export
    .venv/bin/python benchmarks/ort_execution_providers.py /tmp/kl-export \\
        --provider ort-cpu=.venv/bin/python --provider ort-cpu-spin=.venv/bin/python \\
        --provider openvino=.venv/bin/python --provider ort-openvino-ep=/tmp/ortov/bin/python \\
        --json benchmarks/results/ort_execution_providers.json

Providers: ``ort-cpu`` (CPU EP, spinning off, as the ``onnxruntime`` backend),
``ort-cpu-spin`` (spinning on), ``openvino`` (OpenVINO's own runtime, as the
``openvino`` backend) and ``ort-openvino-ep`` (ORT with the OpenVINO EP,
``device_type=CPU``, ``precision=FP32``, ``num_of_threads``). Outputs are
checked against the exported reference (rtol 1e-3, atol 1e-4 x max|ref|).
The worker (``--worker``) imports nothing from collage-ml, so it runs under any
venv that has numpy, onnx and the provider's package.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _time(fn, cap=1.0, n_min=10, n_max=200):
    for _ in range(3):
        fn()
    samples, begin = [], time.perf_counter()
    while len(samples) < n_max and (len(samples) < n_min or time.perf_counter() - begin < cap):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def worker(directory: Path, provider: str, threads: int) -> dict:
    import numpy as np

    out = {}
    for path in sorted(directory.glob("*.onnx")):
        data = np.load(path.with_suffix(".npz"))
        feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
        out_keys = sorted(k for k in data.files if k.startswith("out:"))  # out:<index>:<name>
        expected = [data[k] for k in out_keys]
        names = [k.split(":", 2)[2] for k in out_keys]
        try:
            if provider == "openvino":
                import openvino as ov

                c = ov.Core().compile_model(str(path), "CPU", {
                    "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                    "INFERENCE_PRECISION_HINT": "f32"})
                req = c.create_infer_request()
                order = [i.get_any_name() for i in c.inputs]
                outs_by = {o.get_any_name(): i for i, o in enumerate(c.outputs)}

                def run():
                    req.infer([feeds[n] for n in order])
                    return [np.array(req.get_output_tensor(outs_by[n]).data) for n in names]
            else:
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
                so.add_session_config_entry("session.intra_op.allow_spinning",
                                            "1" if provider == "ort-cpu-spin" else "0")
                if provider == "ort-openvino-ep":
                    providers = [("OpenVINOExecutionProvider", {"device_type": "CPU", "precision": "FP32",
                                                                "num_of_threads": str(threads)})]
                else:
                    providers = ["CPUExecutionProvider"]
                s = ort.InferenceSession(str(path), so, providers=providers)
                wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
                if s.get_providers()[0] != wanted:
                    raise RuntimeError(f"session fell back to {s.get_providers()}")

                def run():
                    return s.run(names, feeds)
            got = run()
            ok = all(np.all(np.abs(g - w) <= 1e-4 * max(1.0, float(np.abs(w).max(initial=0))) + 1e-3 * np.abs(w))
                     for g, w in zip(got, expected))
            out[path.stem] = {"valid": bool(ok), "median": _time(run)} if ok else {"valid": False,
                                                                                  "error": "wrong numbers"}
        except Exception as e:  # a provider that cannot run a subgraph
            out[path.stem] = {"valid": False, "error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
    return out


def _cell(c: dict) -> str:
    ratio = f"{c['ratio']:.2f}" if c["ratio"] else "n/a"
    bad = f", {c['bad']} bad" if c["bad"] else ""
    return f"{ratio} ({c['n']}{bad})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path, help="subgraphs exported by kernel_libraries.py --export")
    ap.add_argument("--provider", action="append", default=[], metavar="NAME=PYTHON",
                    help="a provider and the interpreter to run it with (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.directory, args.worker, args.threads)))
        return 0
    providers = dict(p.split("=", 1) for p in args.provider)
    if not providers:
        ap.error("name at least one --provider NAME=PYTHON")
    kinds = json.loads((args.directory / "index.json").read_text())
    results: dict[str, list[dict]] = {p: [] for p in providers}
    for r in range(args.rounds):
        order = list(providers)[r % len(providers):] + list(providers)[: r % len(providers)]
        for p in order:
            proc = subprocess.run([providers[p], __file__, str(args.directory), "--worker", p,
                                   "--threads", str(args.threads)], capture_output=True, text=True)
            if proc.returncode:
                print(f"{p}: worker failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                results[p].append({})
                continue
            results[p].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {p}: {sum(v['valid'] for v in results[p][-1].values())} valid", flush=True)
    # per subgraph: median over rounds; per kind: geomean of provider / best of the others' baseline
    base = [p for p in providers if p in ("ort-cpu", "ort-cpu-spin", "openvino")]
    table: dict[str, dict[str, list]] = {}
    for sid, meta in kinds.items():
        med = {}
        for p in providers:
            vals = [rr[sid]["median"] for rr in results[p] if rr.get(sid, {}).get("valid")]
            med[p] = statistics.median(vals) if len(vals) == args.rounds else None
        ref = [med[p] for p in base if med[p] is not None]
        if not ref:
            continue
        for p in providers:
            cell = table.setdefault(meta["kind"], {}).setdefault(p, [])
            cell.append(med[p] / min(ref) if med[p] is not None else None)
    summary = {}
    print(f"\n{'kind':28s}" + "".join(f"{p:>18s}" for p in providers))
    for kind in sorted(table):
        row = {}
        for p in providers:
            xs = [x for x in table[kind][p] if x is not None]
            bad = len(table[kind][p]) - len(xs)
            g = math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None
            row[p] = {"ratio": g, "n": len(xs), "bad": bad}
        summary[kind] = row
        print(f"{kind:28s}" + "".join(f"{_cell(c):>18s}" for c in row.values()))
    if args.json:
        args.json.write_text(json.dumps({"command": "benchmarks/ort_execution_providers.py " + " ".join(sys.argv[1:]),
                                         "date": time.strftime("%Y-%m-%d"), "threads": args.threads,
                                         "rounds": args.rounds, "summary": summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
