"""Can a process see the slow episodes of multi-threaded kernels from inside the VM?

    .venv/bin/python benchmarks/noise_detectors.py [--seconds 180] [--json benchmarks/results/noise_detectors.json]

On the 2-vCPU VMs, a 2-thread kernel has slow episodes that last seconds while
1-thread kernels stay steady (docs/results/noise.md). If something a process can read
cheaply tells a slow moment from a fast one, the protocol can re-time a window
taken in a slow moment instead of averaging over it. This times, every
``--spacing`` seconds in one process:

- the kernel: a 2-thread ONNX Runtime 3x3 convolution (64 channels, 28x28,
  spinning off: collage-ml's default), and the same on 1 thread, for 50 ms each;

and, right after, each candidate detector:

- ``steal0``/``steal1``: the hypervisor's steal time of each vCPU over the
  iteration (``/proc/stat``, ticks of 10 ms);
- ``spin0``/``spin1``: a fixed integer loop on one thread pinned to CPU 0 / CPU 1
  (the vCPU's own speed: another tenant on its physical core slows it);
- ``spin_both``: the same loop on two threads at once, one per CPU, the slower
  one's time (both vCPUs running together: what a 2-thread kernel needs);
- ``fma0``/``fma1``: a vector FMA loop on one thread pinned to CPU 0 / CPU 1
  (the FP units, which a busy sibling hyperthread on the host would share);
- ``mem0``/``mem1``: a streaming read of 32 MB from CPU 0 / CPU 1 (memory
  bandwidth, which other tenants share);
- ``pingpong``: a round trip between two busy-waiting threads on the two CPUs
  (no sleeping: the vCPUs' co-scheduling, not the wake-up);
- ``futex``: a round trip that wakes a sleeping thread on the other CPU
  (the wake-up a spinning-off pool pays).

It reports each detector's Spearman correlation with the 2-thread kernel's
time, and how well it separates the slow iterations (over 1.25x the kernel's
10th percentile) from the others (ROC AUC: 0.5 is chance, 1.0 perfect).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DETECT_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>
#include <sys/syscall.h>
static double now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static volatile uint64_t sink;
static double spin_loop(long iters) {
  uint64_t x = 88172645463325252ULL; double a = now_ns();
  for (long i = 0; i < iters; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; }
  sink = x; return now_ns() - a;
}
typedef float v16 __attribute__((vector_size(64)));
static volatile float fsink;
/* a vector FMA loop (8 independent accumulators of 16 floats): the FP units a sibling hyperthread shares */
static double fma_loop(long iters) {
  v16 acc[8], m, c; for (int k = 0; k < 16; k++) { m[k] = 0.999f; c[k] = 0.001f; }
  for (int j = 0; j < 8; j++) for (int k = 0; k < 16; k++) acc[j][k] = (float)(j + k);
  double a = now_ns();
  for (long i = 0; i < iters; i++) for (int j = 0; j < 8; j++) acc[j] = acc[j] * m + c;
  float s = 0; for (int j = 0; j < 8; j++) for (int k = 0; k < 16; k++) s += acc[j][k];
  fsink = s; return now_ns() - a;
}
static char *membuf; static long memlen = 32L << 20;
/* a streaming read of 32 MB (past the L3 share of one core): memory bandwidth */
static double mem_loop(long reps) {
  if (!membuf) { membuf = malloc(memlen); for (long i = 0; i < memlen; i += 64) membuf[i] = (char)i; }
  uint64_t s = 0; double a = now_ns();
  for (long r = 0; r < reps; r++) for (long i = 0; i < memlen; i += 64) s += membuf[i];
  sink = s; return now_ns() - a;
}
struct arg { int cpu; long iters; double ns; int kind; };
static void *spin_thread(void *p) { struct arg *a = p; pin(a->cpu);
  a->ns = a->kind == 1 ? fma_loop(a->iters) : a->kind == 2 ? mem_loop(a->iters) : spin_loop(a->iters); return 0; }
/* ns for the integer (kind 0), FMA (kind 1) or memory (kind 2) loop on one thread pinned to cpu */
double kind_on(int kind, int cpu, long iters) { struct arg a = {cpu, iters, 0, kind}; pthread_t t;
  pthread_create(&t, 0, spin_thread, &a); pthread_join(t, 0); return a.ns; }
/* ns of the slower of two loops run at once, one per cpu */
double spin_both(long iters) { struct arg a = {0, iters, 0, 0}, b = {1, iters, 0, 0}; pthread_t t, u;
  pthread_create(&t, 0, spin_thread, &a); pthread_create(&u, 0, spin_thread, &b);
  pthread_join(t, 0); pthread_join(u, 0); return a.ns > b.ns ? a.ns : b.ns; }
static atomic_int flag; static atomic_int stop_flag; static int use_futex;
static long fx(atomic_int *a, int op, int v) { return syscall(SYS_futex, a, op, v, NULL, NULL, 0); }
static void *echo(void *_) { pin(1);
  while (!atomic_load(&stop_flag)) {
    if (use_futex) { while (atomic_load(&flag) != 1 && !atomic_load(&stop_flag)) fx(&flag, FUTEX_WAIT_PRIVATE, 0); }
    else { while (atomic_load(&flag) != 1 && !atomic_load(&stop_flag)); }
    if (atomic_load(&stop_flag)) break;
    atomic_store(&flag, 0); if (use_futex) fx(&flag, FUTEX_WAKE_PRIVATE, 1); }
  return 0; }
/* median round trip in ns between a thread on cpu 0 and one on cpu 1; futex: the other sleeps between */
double pingpong(int rounds, int futex, double gap_us) {
  static double v[4096]; pthread_t t; if (rounds > 4096) rounds = 4096;
  use_futex = futex; atomic_store(&flag, 0); atomic_store(&stop_flag, 0);
  pthread_create(&t, 0, echo, 0);
  cpu_set_t old; pthread_getaffinity_np(pthread_self(), sizeof old, &old); pin(0);
  for (int n = 0; n < rounds; n++) {
    double g = now_ns() + gap_us * 1e3; while (now_ns() < g);
    double a = now_ns(); atomic_store(&flag, 1);
    if (futex) { fx(&flag, FUTEX_WAKE_PRIVATE, 1); while (atomic_load(&flag) != 0) fx(&flag, FUTEX_WAIT_PRIVATE, 1); }
    else { while (atomic_load(&flag) != 0); }
    v[n] = now_ns() - a; }
  atomic_store(&stop_flag, 1); atomic_store(&flag, 1); fx(&flag, FUTEX_WAKE_PRIVATE, 1); pthread_join(t, 0);
  pthread_setaffinity_np(pthread_self(), sizeof old, &old);
  for (int i = 1; i < rounds; i++) { double x = v[i]; int j = i - 1; while (j >= 0 && v[j] > x) { v[j + 1] = v[j]; j--; } v[j + 1] = x; }
  return v[rounds / 2]; }
"""


def build_lib(tmp: Path) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("noise_detectors: needs a C compiler (cc or gcc) on PATH")
    src, lib = tmp / "detect.c", tmp / "detect.so"
    src.write_text(DETECT_C)
    subprocess.run([cc, "-O2", "-march=native", "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib)], check=True)
    d = ctypes.CDLL(str(lib))
    d.spin_both.restype = d.pingpong.restype = d.kind_on.restype = ctypes.c_double
    d.kind_on.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    d.spin_both.argtypes = [ctypes.c_long]
    d.pingpong.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    return d


def steal_ticks() -> list[int]:
    """The hypervisor's steal of CPU 0 and CPU 1 since boot, in ``/proc/stat`` ticks."""
    from collage_ml.measure.timing import STAT_TICK, steal_seconds

    return [round((steal_seconds([c]) or 0.0) / STAT_TICK) for c in (0, 1)]


def ort_sessions():
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64, 3, 3)).astype(np.float32), "W")
    n = helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()

    def sess(t):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = t, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])

    x = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    s1, s2 = sess(1), sess(2)
    return (lambda: s2.run(None, {"x": x})), (lambda: s1.run(None, {"x": x}))


def time_for(f, dur: float) -> float:
    """Median of 1 ms samples over ``dur`` seconds, in microseconds per call."""
    for _ in range(3):
        f()
    t = time.perf_counter()
    f()
    one = max(time.perf_counter() - t, 1e-6)
    calls = max(1, int(1e-3 / one))
    samples = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < dur:
        a = time.perf_counter()
        for _ in range(calls):
            f()
        samples.append((time.perf_counter() - a) / calls)
    return float(np.median(samples) * 1e6)


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if np.std(ra) > 0 and np.std(rb) > 0 else float("nan")


def auc(score, label) -> float:
    """ROC AUC of ``score`` for ``label`` (Mann-Whitney; ties count half)."""
    score, label = np.asarray(score, float), np.asarray(label, bool)
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    gt = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(gt / (len(pos) * len(neg)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--spacing", type=float, default=0.25, help="idle seconds between iterations")
    ap.add_argument("--json", default="benchmarks/results/noise_detectors.json")
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("noise_detectors: needs two CPUs")
    from collage_ml.measure.hardware import hardware_info

    with tempfile.TemporaryDirectory() as d:
        lib = build_lib(Path(d))
        k2, k1 = ort_sessions()
        iters = 200_000  # about 0.2-0.4 ms of the loop on these CPUs
        rows = []
        end = time.time() + args.seconds
        while time.time() < end:
            s0 = steal_ticks()
            t = time.time()
            r = {"t": t, "kernel_2t_us": time_for(k2, 0.05)}
            r["spin0_us"] = min(lib.kind_on(0, 0, iters) for _ in range(3)) / 1e3
            r["spin1_us"] = min(lib.kind_on(0, 1, iters) for _ in range(3)) / 1e3
            r["spin_both_us"] = min(lib.spin_both(iters) for _ in range(3)) / 1e3
            r["fma0_us"] = min(lib.kind_on(1, 0, 20_000) for _ in range(3)) / 1e3
            r["fma1_us"] = min(lib.kind_on(1, 1, 20_000) for _ in range(3)) / 1e3
            r["mem0_us"] = lib.kind_on(2, 0, 1) / 1e3
            r["mem1_us"] = lib.kind_on(2, 1, 1) / 1e3
            r["pingpong_us"] = lib.pingpong(200, 0, 5.0) / 1e3
            r["futex_us"] = lib.pingpong(100, 1, 20.0) / 1e3
            r["kernel_1t_us"] = time_for(k1, 0.05)
            s1 = steal_ticks()
            r["steal0"], r["steal1"] = s1[0] - s0[0], s1[1] - s0[1]
            rows.append(r)
            time.sleep(args.spacing)
    k = np.array([r["kernel_2t_us"] for r in rows])
    slow = k > 1.25 * np.percentile(k, 10)
    dets = ["kernel_1t_us", "spin0_us", "spin1_us", "spin_both_us", "fma0_us", "fma1_us", "mem0_us", "mem1_us",
            "pingpong_us", "futex_us", "steal0", "steal1"]
    hw = hardware_info(2)
    report = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "hardware": hw, "iterations": len(rows), "slow_share": float(slow.mean()),
              "kernel_2t_us": {"p10": float(np.percentile(k, 10)), "median": float(np.median(k)),
                               "p90": float(np.percentile(k, 90))},
              "detectors": {}, "rows": rows}
    print(f"{hw.get('cpu_model')} {hw.get('cpu_id', '')}: {len(rows)} iterations; 2-thread conv p10/median/p90 "
          f"{report['kernel_2t_us']['p10']:.0f}/{report['kernel_2t_us']['median']:.0f}/"
          f"{report['kernel_2t_us']['p90']:.0f} us, slow (>1.25x p10) {slow.mean():.0%} of iterations")
    print(f"{'detector':14s} {'median':>9s} {'p90/p10':>8s} {'spearman':>9s} {'AUC slow':>9s}")
    for name in dets:
        v = np.array([r[name] for r in rows], float)
        lo = np.percentile(v, 10)
        res = {"median": float(np.median(v)), "p90_over_p10": float(np.percentile(v, 90) / lo) if lo > 0 else None,
               "spearman": spearman(v, k), "auc_slow": auc(v, slow)}
        report["detectors"][name] = res
        ratio = f"{res['p90_over_p10']:.2f}" if res["p90_over_p10"] else "-"
        print(f"{name:14s} {res['median']:9.1f} {ratio:>8s} {res['spearman']:9.2f} {res['auc_slow']:9.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
