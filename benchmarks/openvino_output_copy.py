"""OpenVINO outputs: always copied out of the request (the old executable) vs the current rule (large ones in place).

    .venv/bin/python benchmarks/openvino_output_copy.py

One distinct single node per op type (plus the whole model) of resnet50,
mobilenetv2, dcgan and bert at batch 16 and resnet50 at batch 1; each compiled
twice (one executable per variant, so no request ever holds a freed output
array), timed side by side in three alternating rounds of 0.5 s. Prints each
kernel's median for both variants and the geometric mean of new/old. "new" is
``OpenVinoExecutable.__call__``: outputs of ``ZERO_COPY_MIN_BYTES`` or more
are written in place, smaller ones copied (writing every output in place cost
2-25 us per call on tiny kernels). Numbers: docs/results/placement.md, "More kernel libraries".
"""

import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_ml.backends import get_backend  # noqa: E402
from collage_ml.backends.openvino_backend import OpenVinoExecutable
from collage_ml.ir.importers import import_model
from collage_ml.backends.patterns import RegionPattern
b = get_backend("openvino")
def old_call(self, *inputs):
    ov = self._ov
    for i, x in enumerate(inputs):
        self.request.set_input_tensor(i, ov.Tensor(np.ascontiguousarray(x), shared_memory=True))
    self.request.infer()
    return [np.array(self.request.get_output_tensor(i).data, copy=True) for i in range(len(self._outputs))]
new_call = OpenVinoExecutable.__call__
rows = []
for model, batch in [("resnet50", 16), ("mobilenetv2", 16), ("dcgan", 16), ("bert", 16), ("resnet50", 1)]:
    g = import_model(model, batch=batch); ref = g.reference()
    masks = [m for m in RegionPattern("r", max_size=1, max_regions=400).matches(g, lambda n: b.supports(g, n)) if m != g.all_mask]
    seen = set(); picks = []
    for m in masks:
        op = g.nodes[(m & -m).bit_length() - 1].op_type
        if op not in seen: seen.add(op); picks.append(m)
    picks.append(g.all_mask)
    for m in picks:
        sg = g.subgraph(m); exe = b.compile(sg, threads=2); exe_old = b.compile(sg, threads=2); feeds, _ = sg.reference_io(ref)
        args = [feeds[n] for n in exe.input_names]
        res = {}
        for rnd in range(3):
            for name, fn in (("old", old_call), ("new", new_call)) if rnd % 2 == 0 else (("new", new_call), ("old", old_call)):
                e = exe_old if name == "old" else exe
                for _ in range(3): fn(e, *args)
                ts = []
                t_end = time.perf_counter() + 0.5
                while time.perf_counter() < t_end or len(ts) < 5:
                    t0 = time.perf_counter(); fn(e, *args); ts.append(time.perf_counter() - t0)
                res.setdefault(name, []).append(statistics.median(ts))
        o, n = statistics.median(res["old"]), statistics.median(res["new"])
        label = "whole" if m == g.all_mask else sg.nodes[0].op_type
        outb = sum(int(np.prod(tuple(o.get_shape()))) * 4 for o in exe._outputs)
        rows.append((f"{model}@b{batch}", label, o * 1e3, n * 1e3, n / o, outb / 1e6))
        print(f"{model}@b{batch:<3} {label:22s} old {o*1e3:8.3f} ms new {n*1e3:8.3f} ms  new/old {n/o:5.2f}  out {outb/1e6:6.1f} MB", flush=True)
print("geomean new/old", math.exp(statistics.fmean(math.log(r[4]) for r in rows)))
