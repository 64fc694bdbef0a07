"""Controlled experiments on the cause of per-process latency modes, on this machine.

    .venv/bin/python benchmarks/noise_causes.py [--processes 6] [--json benchmarks/results/noise_causes.json]

Each arm times the same kernels in ``--processes`` fresh processes, four 0.2 s
windows per process (samples of 20 back-to-back calls), and reports the
median over windows and processes, the spread between processes
(max/min of the per-process medians) and within them (max/min of one process's
window medians, worst process). The kernels are ONNX Runtime sessions, built
in code: a 3x3 convolution (64 channels, 14x14, ~50 us) and a Relu (~6 us).

Arms (one factor at a time):

- ``1t``: one intra-op thread;
- ``2t-spin-off``: two threads, pool threads sleep between calls (collage-ml's
  ORT default, the safe setting in mixed plans);
- ``2t-spin-on``: two threads, pool threads spin;
- ``2t-spin-off-pinned``: the main thread on CPU 0 and the pool thread on CPU 1;
- ``2t-spin-off-qos``: a PM-QoS CPU-latency request of 0 us held (idle CPUs
  poll instead of halting; needs root);
- ``1t-pinned``: one thread, the process pinned to CPU 1.

It also times a futex ping-pong between two threads on the two CPUs (C,
compiled with ``cc`` when one is on PATH): the cost of waking a sleeping
thread on the other CPU, with and without the QoS request. ``--timescale S``
adds the time structure: one process times a 2-thread and a 1-thread ORT
convolution and a 1-thread torch MatMul every ~0.65 s for S seconds, and
reports the 2-thread kernel's slow episodes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import os, sys, json, time, struct
    import numpy as np
    arm = json.loads(sys.argv[1])
    if arm.get("pin_main") is not None:
        os.sched_setaffinity(0, {arm["pin_main"]})
    qos = None
    if arm.get("qos"):
        try:
            qos = os.open("/dev/cpu_dma_latency", os.O_WRONLY); os.write(qos, struct.pack("i", 0))
        except OSError:
            qos = None
    import onnxruntime as ort
    from onnx import helper, TensorProto, numpy_helper
    rng = np.random.default_rng(0)
    def model(kind):
        if kind == "conv":
            W = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "W")
            n = helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1]); shape = (1, 64, 14, 14); inits = [W]
        else:
            n = helper.make_node("Relu", ["x"], ["y"]); shape = (1, 64, 28, 28); inits = []
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), shape
    out = {"qos_held": qos is not None}
    for kind in ("conv", "relu"):
        m, shape = model(kind)
        so = ort.SessionOptions(); so.intra_op_num_threads = arm["threads"]; so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if arm.get("spin") else "0")
        if arm.get("pool_affinity"):
            so.add_session_config_entry("session.intra_op_thread_affinities", arm["pool_affinity"])
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        x = rng.standard_normal(shape).astype(np.float32)
        f = lambda: s.run(None, {"x": x})
        for _ in range(50):
            f()
        windows = []
        for w in range(4):
            samples = []; t1 = time.perf_counter()
            while time.perf_counter() - t1 < 0.2:
                a = time.perf_counter()
                for _ in range(20):
                    f()
                samples.append((time.perf_counter() - a) / 20)
            windows.append(float(np.median(samples)))
        out[kind] = windows
    print(json.dumps(out))
    """
)

PINGPONG_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <time.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sched.h>
#include <unistd.h>
static atomic_int flag = 0;
static long fx(atomic_int *a, int op, int v) { return syscall(SYS_futex, a, op, v, NULL, NULL, 0); }
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static void *other(void *_) { pin(1); for (;;) { while (atomic_load(&flag) != 1) fx(&flag, FUTEX_WAIT_PRIVATE, 0);
  atomic_store(&flag, 0); fx(&flag, FUTEX_WAKE_PRIVATE, 1); } }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(void) { pthread_t t; pin(0); pthread_create(&t, 0, other, 0); usleep(1000);
  for (int w = 0; w < 6; w++) { static double v[1000]; int n = 0;
    for (; n < 1000; n++) { double g = now() + 20; while (now() < g); double a = now();
      atomic_store(&flag, 1); fx(&flag, FUTEX_WAKE_PRIVATE, 1); while (atomic_load(&flag) != 0) fx(&flag, FUTEX_WAIT_PRIVATE, 1);
      v[n] = now() - a; }
    qsort(v, n, sizeof(double), cmp); printf("%.2f ", v[n / 2]); }
  printf("\n"); return 0; }
"""

TIMESCALE_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import torch
    sys.path.insert(0, sys.argv[2])
    from noise_detectors import ort_sessions  # the same 2-thread and 1-thread convolutions
    conv2, conv1 = ort_sessions()
    torch.set_num_threads(1); a = torch.randn(256, 256)
    def tm(f, dur=0.05):
        for _ in range(3):
            f()
        t0 = time.perf_counter(); k = 0
        while time.perf_counter() - t0 < dur:
            f(); k += 1
        return (time.perf_counter() - t0) / k * 1e6
    rows = []
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        rows.append([time.time(), tm(conv2), tm(conv1), tm(lambda: a @ a)])
        time.sleep(0.5)
    print(json.dumps(rows))
    """
)


def timescale(seconds: float) -> dict:
    """One process times three kernels every ~0.65 s: a 2-thread and a 1-thread ORT conv, a 1-thread torch
    MatMul. Returns their ranges and the 2-thread kernel's slow episodes (over 1.5x its minimum)."""
    import numpy as np

    r = subprocess.run([sys.executable, "-c", TIMESCALE_CHILD, str(seconds), str(Path(__file__).resolve().parent)],
                       capture_output=True, text=True)
    rows = np.array(json.loads(r.stdout))
    out = {"samples": len(rows), "spacing_s": float(np.diff(rows[:, 0]).mean())}
    for i, name in ((1, "ort_conv_2t"), (2, "ort_conv_1t"), (3, "torch_matmul_1t")):
        v = rows[:, i]
        out[name] = {"min_us": float(v.min()), "median_us": float(np.median(v)), "max_us": float(v.max())}
    slow = rows[:, 1] > 1.5 * rows[:, 1].min()
    episodes, run = [], 0
    for flag in slow:
        if flag:
            run += 1
        elif run:
            episodes.append(run)
            run = 0
    if run:
        episodes.append(run)
    out["slow_share"] = float(slow.mean())
    out["slow_episodes_s"] = [round(e * out["spacing_s"], 1) for e in episodes]
    return out


ARMS = {
    "1t": {"threads": 1},
    "1t-pinned": {"threads": 1, "pin_main": 1},
    "2t-spin-off": {"threads": 2},
    "2t-spin-on": {"threads": 2, "spin": True},
    "2t-spin-off-pinned": {"threads": 2, "pin_main": 0, "pool_affinity": "2"},
    "2t-spin-off-qos": {"threads": 2, "qos": True},
}


def pingpong(qos: bool) -> list[float] | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or (os.cpu_count() or 1) < 2:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "pp.c", Path(d) / "pp"
        src.write_text(PINGPONG_C)
        if subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(exe)], capture_output=True).returncode:
            return None
        fd = None
        if qos:
            import struct

            try:
                fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
                os.write(fd, struct.pack("i", 0))
            except OSError:
                return None
        try:
            out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60).stdout
        finally:
            if fd is not None:
                os.close(fd)
    return [float(x) for x in out.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", default="benchmarks/results/noise_causes.json")
    ap.add_argument("--timescale", type=float, default=0.0, metavar="SECONDS",
                    help="also time three kernels every ~0.65 s for this long in one process (slow episodes)")
    args = ap.parse_args()
    import numpy as np

    from collage_ml.measure.hardware import hardware_info

    report = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
              "hardware": hardware_info(2), "arms": {}, "pingpong_us": {}}
    for qos in (False, True):
        report["pingpong_us"]["qos" if qos else "plain"] = pingpong(qos)
    names = args.arms.split(",")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.processes):  # arms interleaved, so drift over time hits them alike
        for n in names:
            r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ARMS[n])], capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"arm {n} failed: {r.stderr.strip().splitlines()[-1:]}")
            runs[n].append(json.loads(r.stdout))
    print(f"{report['hardware']['cpu_model']} {report['hardware']['cpu_id']}; futex round trip across CPUs, "
          f"median us per window: {report['pingpong_us']}")
    print(f"{'arm':22s} {'kernel':6s} {'median us':>10s} {'between processes':>18s} {'within (worst)':>15s}")
    for n in names:
        arm = {}
        for kind in ("conv", "relu"):
            per = [np.median(r[kind]) for r in runs[n]]
            within = max(max(r[kind]) / min(r[kind]) for r in runs[n])
            arm[kind] = {"median_us": float(np.median([w for r in runs[n] for w in r[kind]]) * 1e6),
                         "between": float(max(per) / min(per)), "within_worst": float(within),
                         "per_process_us": [float(p * 1e6) for p in per]}
            print(f"{n:22s} {kind:6s} {arm[kind]['median_us']:10.1f} {arm[kind]['between']:18.2f}x "
                  f"{arm[kind]['within_worst']:14.2f}x")
        arm["qos_held"] = all(r["qos_held"] for r in runs[n]) if ARMS[n].get("qos") else None
        report["arms"][n] = arm
    if args.timescale > 0:
        report["timescale"] = ts = timescale(args.timescale)
        print(f"timescale ({ts['samples']} samples, every {ts['spacing_s']:.2f} s): "
              + ", ".join(f"{k} {v['min_us']:.0f}-{v['max_us']:.0f} us" for k, v in ts.items() if isinstance(v, dict))
              + f"; 2-thread slow {ts['slow_share']:.0%} of the time, episodes of {ts['slow_episodes_s']} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
