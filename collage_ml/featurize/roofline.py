"""What the probes say about a (machine, backend): rates, a fixed cost, and a roofline estimate per candidate.

The probe set (:mod:`collage_ml.measure.probes`) runs each kernel at batch 1
and batch 16. Between the two the work grows by a known factor ``r`` (the
FLOPs, or the bytes for memory-bound kernels), so a straight line through the
two points splits each probe's latency into a fixed per-call cost and a rate:

    latency = overhead + work / rate
    rate = (work_16 - work_1) / (latency_16 - latency_1)
    overhead = (r * latency_1 - latency_16) / (r - 1)

:class:`Rates` keeps, per class of kernel, the median rate over that class's
probes (``conv``: dense and transposed convolutions, FLOPs; ``dw``: the
depthwise convolution, FLOPs; ``mm``: the MatMuls and the attention block,
FLOPs; ``mem``: elementwise, pooling, reduction and LayerNorm, bytes read plus
written), and the median of the overheads (floored at 0).

:func:`estimate` turns a candidate into seconds with those numbers: the
overhead, plus per node the larger of its compute time at its class's rate and
its memory time at the ``mem`` rate (a roofline, node by node, without
fusion). A node that reads only constants (no boundary input reaches it, e.g.
a Gemm of a model's initial state) costs nothing but writing its output, if it
is one: ONNX Runtime and OpenVINO fold it when they compile the subgraph (3.5 and
9 µs for such a Gemm at 0.5 and 4.2 MFLOP alike on the Xeon; docs/results/cost-models.md, "Leave one
family out on the Xeon"). It is a crude model on purpose: its job is to carry the machine's
speed into the features, so that a cost model can learn the *ratio* of a
latency to it, which moves far less between machines than the latency does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from collage_ml.featurize.info import SubgraphInfo, _LRU
from collage_ml.featurize.schema import OP_INDEX
from collage_ml.measure.probes import PROBE_COLUMNS

CLASSES = ("conv", "dw", "mm", "mem")


#: the probe columns (fixed at import; see ``measure.probes.PROBE_COLUMNS``)
PROBE_NAMES: tuple[str, ...] = PROBE_COLUMNS
_CONV_OPS = (OP_INDEX["Conv"], OP_INDEX["ConvTranspose"])
_MM_OPS = (OP_INDEX["MatMul"], OP_INDEX["Gemm"], OP_INDEX["Einsum"])
_KERNEL_CLASS = {
    "conv3x3": "conv", "conv1x1": "conv", "convT4x4s2": "conv", "dwconv3x3": "dw", "matmul": "mm", "attention": "mm",
}


@dataclass(frozen=True)
class Rates:
    overhead: float  # seconds per call
    conv: float  # FLOP/s
    dw: float
    mm: float
    mem: float  # bytes/s

    def vector(self) -> list[float]:
        """Natural logs: overhead (s), then each class's rate."""
        return [math.log(max(self.overhead, 1e-9)), *(math.log(getattr(self, c)) for c in CLASSES)]


def _class_of(kernel: str) -> str:
    return _KERNEL_CLASS.get(kernel.split("-", 1)[0], "mem")


def probe_work() -> dict[str, tuple[str, float]]:
    """{probe name: (class, work)}: work is FLOPs for compute classes, bytes read + written for ``mem``."""
    from collage_ml.measure import probes

    return _probe_work(tuple(p.name for p in probes.PROBES))


@functools.lru_cache(maxsize=4)
def _probe_work(_kernels: tuple[str, ...]) -> dict[str, tuple[str, float]]:
    from collage_ml.featurize.info import subgraph_info
    from collage_ml.measure.probes import probe_graphs

    out = {}
    for name, g in probe_graphs():
        info = subgraph_info(g.whole())
        cls = _class_of(name.split("@", 1)[0])
        v = info.node_values
        work = float(v[:, 1].sum() + v[:, 2].sum()) if cls == "mem" else float(v[:, 0].sum())
        out[name] = (cls, work)
    return out


#: how :func:`rates` fits the probes: "joint" (one overhead for every probe, chosen where the whole set fits best)
#: or "two-point" (a line through each kernel's two batches; feature schema 4 and before)
FIT = "two-point"
_GRID = 48  # overheads tried by the joint fit, log-spaced below the fastest probe (then 33 finer around the best)


def rates(probes: tuple[float | None, ...], fit: str | None = None) -> Rates | None:
    """The :class:`Rates` of one backend's probe latencies (in ``probe_names()`` order); None if too few ran."""
    return _rates(tuple(probes), fit or FIT)


@functools.lru_cache(maxsize=8192)
def _rates(probes: tuple[float | None, ...], fit: str) -> Rates | None:
    if fit == "joint":
        return _joint(probes)
    if fit != "two-point":
        raise ValueError(f"unknown roofline fit {fit!r} (joint, two-point)")
    return _two_point(probes)


def _points(probes: tuple[float | None, ...]) -> list[tuple[str, float, float]]:
    """(class, work, latency) of every probe that ran, in the set's order."""
    if len(probes) != len(PROBE_NAMES):
        return []
    work = probe_work()
    return [(*work[n], float(v)) for n, v in zip(PROBE_NAMES, probes) if v and n in work and work[n][1] > 0]


def _joint(probes: tuple[float | None, ...]) -> Rates | None:
    """One per-call overhead for the backend and one rate per class, fitted to every probe at once.

    For an overhead ``o``, each probe's rate is its work over its latency less ``o``, and a class's rate the
    median of its probes' (both batches); ``o`` is the one, of :data:`_GRID` tried between 0.1% and 95% of
    the fastest probe (then a finer grid around the best), whose rates then predict the set's latencies best
    (the least sum of absolute log errors). Every number so rests on all 26 latencies, none on a difference of
    two: the two-point fit's overhead, ``(r * l1 - l16) / (r - 1)``, multiplied the probes' noise (on one Zen 4
    VM, calibrations 12 minutes apart whose probes agreed within 1% put its estimates 4% apart at the median)."""
    pts = _points(probes)
    if not any(c == "mem" for c, _, _ in pts):
        return None
    cls = np.array([CLASSES.index(c) for c, _, _ in pts])
    w = np.array([x for _, x, _ in pts])
    lat = np.array([x for _, _, x in pts])
    present = [k for k in range(len(CLASSES)) if (cls == k).any()]

    def fit(o: float) -> tuple[float, float, np.ndarray]:
        r = np.log(w / (lat - o))
        rate = np.full(len(CLASSES), np.nan)
        for k in present:
            rate[k] = float(np.exp(np.median(r[cls == k])))
        return float(np.abs(np.log(o + w / rate[cls]) - np.log(lat)).sum()), o, rate

    lo, hi = np.log(np.min(lat) * 1e-3), np.log(np.min(lat) * 0.95)
    grid = np.linspace(lo, hi, _GRID)
    best = min((fit(float(np.exp(x))) for x in grid), key=lambda t: t[0])
    step = grid[1] - grid[0]  # then finer, around the best of the coarse grid
    fine = np.clip(np.log(best[1]) + np.linspace(-step, step, 33), lo, hi)
    _, o, rate = min((fit(float(np.exp(x))) for x in fine), key=lambda t: t[0])
    compute = [rate[k] for k in present if CLASSES[k] != "mem"]
    fallback = float(np.exp(np.median(np.log(compute)))) if compute else None
    vals = {c: float(rate[k]) if k in present else fallback for k, c in enumerate(CLASSES)}
    if any(v is None or not v > 0 for v in vals.values()):
        return None
    return Rates(overhead=o, **vals)


def _two_point(probes: tuple[float | None, ...]) -> Rates | None:
    from collage_ml.measure.probes import BATCHES

    names = PROBE_NAMES
    if len(probes) != len(names):
        return None
    lat = dict(zip(names, probes))
    work = probe_work()
    lo, hi = BATCHES[0], BATCHES[-1]
    per_class: dict[str, list[float]] = {c: [] for c in CLASSES}
    overheads: list[float] = []
    for kernel in sorted({n.split("@", 1)[0] for n in names}):
        a, b = f"{kernel}@b{lo}", f"{kernel}@b{hi}"
        l1, l2 = lat.get(a), lat.get(b)
        if l1 is None or l2 is None or a not in work or b not in work:
            continue
        cls, w1 = work[a]
        w2 = work[b][1]
        if not (w2 > w1 > 0):
            continue
        if l2 > l1:
            per_class[cls].append((w2 - w1) / (l2 - l1))
        r = w2 / w1
        overheads.append(max((r * l1 - l2) / (r - 1), 0.0))
    if not overheads or not per_class["mem"]:
        return None
    compute = [x for c in ("conv", "dw", "mm") for x in per_class[c]]
    fallback = float(np.median(compute)) if compute else None
    vals = {}
    for c in CLASSES:
        xs = per_class[c]
        v = float(np.median(xs)) if xs else fallback
        if v is None or not v > 0:
            return None
        vals[c] = v
    return Rates(overhead=float(np.median(overheads)), **vals)


_SPLIT = _LRU(100_000)


def constant_nodes(info: SubgraphInfo) -> np.ndarray:
    """Per node: True where no boundary input reaches it, so that it reads only constants (initializers, or
    nodes that do); a compiler that folds constants computes it once, before the first call."""
    live = np.asarray(info.is_input_fed, dtype=bool).copy()
    src, dst = info.edges
    for k in np.argsort(dst, kind="stable"):  # local indices are in topological order
        if live[src[k]]:
            live[dst[k]] = True
    return ~live


def _split(info: SubgraphInfo) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: class index (0 conv, 1 dw, 2 mm, 3 mem), FLOPs, bytes read + written; a node of
    :func:`constant_nodes` has no FLOPs, and moves only what it writes as a subgraph output."""

    def compute():
        ops = info.ops.astype(np.int64)
        v = info.node_values
        cls = np.full(len(ops), 3, dtype=np.int64)
        conv = np.isin(ops, _CONV_OPS)
        cls[conv] = 0
        cls[conv & (v[:, 7] > 1)] = 1  # grouped: depthwise-like
        cls[np.isin(ops, _MM_OPS)] = 2
        flops = v[:, 0].astype(np.float64)
        moved = (v[:, 1] + v[:, 2]).astype(np.float64)
        const = constant_nodes(info)
        flops[const] = 0.0
        moved[const] = np.where(np.asarray(info.is_output, dtype=bool), v[:, 2], 0.0)[const]
        return cls, flops, moved

    return _SPLIT.get_or(info.hash, compute)


def estimate(info: SubgraphInfo, r: Rates) -> tuple[float, float, float]:
    """(estimate, compute part, memory part) in seconds for one candidate (see the module docstring)."""
    cls, flops, moved = _split(info)
    rate = np.array([r.conv, r.dw, r.mm, math.inf])
    t_compute = flops / rate[cls]
    t_memory = moved / r.mem
    total = r.overhead + float(np.maximum(t_compute, t_memory).sum())
    return total, float(t_compute.sum()), float(t_memory.sum())


def features(info: SubgraphInfo, probes: Sequence[float | None] | None) -> list[float]:
    """The probe-derived columns of one candidate (see ``flat.HW_PROBE_FEATURES``); NaN without probes."""
    n = len(PROBE_NAMES)
    if probes is None or len(probes) != n:
        return [math.nan] * (len(CLASSES) + 1 + 3 + n)
    r = rates(tuple(probes))
    raw = [math.log(p) if p else math.nan for p in probes]
    if r is None:
        return [math.nan] * (len(CLASSES) + 1 + 3) + raw
    est, comp, mem = estimate(info, r)
    return [*r.vector(), math.log(est), math.log(max(comp, 1e-12)), math.log(max(mem, 1e-12)), *raw]


#: names of :func:`relative_features`' columns, in order
RELATIVE_NAMES: tuple[str, ...] = (
    "rel_log_overhead", *(f"rel_log_rate_{c}" for c in CLASSES), "rel_roof_log_est",
    *(f"rel_probe:{n}" for n in PROBE_NAMES),
)


def relative_features(
    info: SubgraphInfo, probes: Sequence[float | None] | None,
    machine: Sequence[Sequence[float | None]],
) -> list[float]:
    """The candidate's backend against the machine's other probed backends (``machine``: their probe rows,
    this backend's among them): its log overhead, log rates, log roofline estimate and log probe latencies,
    each minus the mean of the same quantity over ``machine``. NaN without probes.

    Absolute probe columns say how fast a machine is; these say which backend it favours for this kind of
    work, which is what flips between CPU kinds (without AVX-512 OpenVINO loses more than ONNX Runtime) and
    what a backend decision needs. A difference of logs on one machine also carries across machines whose
    absolute speed lies outside everything in training, where trees cannot extrapolate."""
    if probes is None or len(probes) != len(PROBE_NAMES):
        return [math.nan] * len(RELATIVE_NAMES)
    own = rates(tuple(probes))
    rows = [p for p in machine if p is not None and len(p) == len(PROBE_NAMES)]
    out: list[float] = []
    all_rates = [r for r in (rates(tuple(p)) for p in rows) if r is not None]
    if own is not None and all_rates:
        vec = np.array(own.vector())
        mean = np.mean([r.vector() for r in all_rates], axis=0)
        est = math.log(estimate(info, own)[0])
        mean_est = float(np.mean([math.log(estimate(info, r)[0]) for r in all_rates]))
        out += [*(vec - mean).tolist(), est - mean_est]
    else:
        out += [math.nan] * (len(CLASSES) + 2)
    for j, p in enumerate(probes):
        others = [math.log(r[j]) for r in rows if r[j]]
        out.append(math.log(p) - float(np.mean(others)) if p and others else math.nan)
    return out


def machine_log_estimate(info: SubgraphInfo, probes_by_backend: Iterable[Sequence[float | None] | None]) -> float:
    """The mean over a machine's probed backends of log(:func:`estimate`) for one candidate: one scale for the
    machine, the same whichever backend runs the candidate (NaN when no backend's probes give rates).

    The mean of several backends' estimates is steadier than any one backend's, whose probes carry their own
    noise; the XGBoost ``roofline-mean`` target takes it as the base margin, and the trees learn each
    backend's ratio to it."""
    logs = []
    for probes in probes_by_backend:
        r = rates(tuple(probes)) if probes is not None and len(probes) == len(PROBE_NAMES) else None
        if r is not None:
            logs.append(math.log(estimate(info, r)[0]))
    return float(np.mean(logs)) if logs else math.nan
