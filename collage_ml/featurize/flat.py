"""Flat feature rows for XGBoost: one fixed-length float32 vector per (subgraph, backend, hardware).

The subgraph part is computed once per structural hash (:func:`subgraph_part`)
and the backend and hardware columns are appended per candidate, so a
subgraph offered to four backends is analysed once.

The hardware columns (:data:`HW_FEATURES`) are the static descriptor (cores,
threads, GPU, ISA flags) and, where the machine was calibrated, the
candidate's backend's probe columns (:data:`HW_PROBE_FEATURES`, from
:mod:`~collage_ml.featurize.roofline`): log overhead and rates, the roofline
estimate of this candidate and its compute and memory parts, and the log
latency of every probe. Without probes those are NaN (XGBoost's missing value).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from collage_ml.featurize import roofline
from collage_ml.featurize.hardware import ISA_FLAGS, HardwareDesc
from collage_ml.featurize.info import SubgraphInfo, _LRU
from collage_ml.featurize.schema import (
    BACKENDS, N_BACKENDS, N_OPS, OPS, OP_INDEX, backend_base, backend_options, backend_slot,
)

_CONV = np.array([OP_INDEX["Conv"], OP_INDEX["ConvTranspose"]], dtype=np.int16)
_MATMUL = np.array([OP_INDEX["MatMul"], OP_INDEX["Gemm"], OP_INDEX["Einsum"]], dtype=np.int16)
_MOVE = np.array(
    [OP_INDEX[o] for o in "Reshape Transpose Concat Split Slice Gather Squeeze Unsqueeze Flatten Expand Pad Tile Identity".split()],
    dtype=np.int16,
)

SUBGRAPH_FEATURES: tuple[str, ...] = (
    *(f"op:{o}" for o in OPS),
    "op:other",
    "log_flops",
    "log_bytes_read",
    "log_bytes_written",
    "log_intensity",
    "log_weight_bytes",
    "log_max_input_bytes",
    "log_max_output_bytes",
    "log_total_input_bytes",
    "log_total_output_bytes",
    "n_inputs",
    "n_outputs",
    "n_nodes",
    "n_edges",
    "depth",
    "log_conv_flops",
    "log_matmul_flops",
    "log_other_flops",
    "log_move_bytes",
    "conv_max_kernel",
    "conv_max_stride",
    "conv_log_max_groups",
    "conv_depthwise",
    "log_mm_m",
    "log_mm_n",
    "log_mm_k",
    "log_max_node_flops",
    "max_node_flops_share",
    "log_flops_per_node",
    "n_residual_add_ln",
    "log_residual_add_ln_bytes",
)
HW_PROBE_FEATURES: tuple[str, ...] = (
    "hw_log_overhead", *(f"hw_log_rate_{c}" for c in roofline.CLASSES),
    "roof_log_est", "roof_log_compute", "roof_log_memory",
    *(f"probe:{n}" for n in roofline.PROBE_NAMES),
    *roofline.RELATIVE_NAMES,
)
HW_FEATURES: tuple[str, ...] = (
    "hw_cores",
    "hw_threads",
    "hw_gpu",
    *(f"hw_isa_{f}" for f in ISA_FLAGS),
    "log_flops_per_thread",
    *HW_PROBE_FEATURES,
)
FEATURES: tuple[str, ...] = (
    *SUBGRAPH_FEATURES,
    *(f"backend:{b}" for b in BACKENDS),
    "backend:other",
    *HW_FEATURES,
)
#: index of the roofline estimate's column (the ``roofline`` target of the XGBoost model subtracts it)
ROOF_EST = FEATURES.index("roof_log_est")
N_FEATURES = len(FEATURES)
_N_SUB = len(SUBGRAPH_FEATURES)

_CACHE = _LRU(100_000)
_LN = OP_INDEX["LayerNormalization"]
_ADD = OP_INDEX["Add"]


def residual_add_ln(info: SubgraphInfo) -> tuple[int, float]:
    """(count, bytes written) of the LayerNormalization nodes fed by a residual Add inside the subgraph: an Add
    of two activations (no constant input). ONNX Runtime fuses that pair into SkipLayerNormalization, whose
    kernel ran 1.2-7.2x slower than the pair on the Zen 3 (docs/results/placement.md); an Add of a constant
    (a bias) is not the residual and is not fused in that position, nor is an Add whose sum leaves the
    subgraph."""
    if info.n_edges == 0:
        return 0, 0.0
    ops, weight = info.ops, info.column("weight_bytes")
    src, dst = info.edges
    # onnxruntime 1.32 leaves the pair alone when the sum is also an output of the graph
    hit = (ops[dst] == _LN) & (ops[src] == _ADD) & (weight[src] == 0) & ~info.is_output[src]
    lns = np.unique(dst[hit])
    return int(len(lns)), float(info.column("bytes_written")[lns].sum())


_FUSED_PAIRS = ("n_residual_add_ln", "log_residual_add_ln_bytes")
#: configurations that change the graph a backend runs, as the subgraph columns that then read 0: ONNX Runtime
#: fuses no Add + LayerNorm pair with ``skipln=off`` (backends.configs), nor below its extended optimisation
#: level (``opt=basic``, ``opt=none``), so the pairs it would fuse are none. Keyed by (base backend, option,
#: value); the tests check each against ORT's optimised graph.
CONFIG_ZEROES: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("onnxruntime", "skipln", "off"): _FUSED_PAIRS,
    ("onnxruntime", "opt", "basic"): _FUSED_PAIRS,
    ("onnxruntime", "opt", "none"): _FUSED_PAIRS,
}
_CONFIG_COLS: dict[str, np.ndarray | None] = {}


def config_zeroed(backend: str) -> np.ndarray | None:
    """The subgraph columns that ``backend``'s configuration zeroes (:data:`CONFIG_ZEROES`), or None."""
    if backend not in _CONFIG_COLS:
        base, opts = backend_base(backend), backend_options(backend)
        names = list(dict.fromkeys(c for (b, k, v), cs in CONFIG_ZEROES.items() if b == base and opts.get(k) == v
                                   for c in cs))
        _CONFIG_COLS[backend] = np.array([SUBGRAPH_FEATURES.index(c) for c in names], dtype=np.int64) if names else None
    return _CONFIG_COLS[backend]


def backend_subgraph_part(info: SubgraphInfo, backend: str) -> np.ndarray:
    """:func:`subgraph_part` as ``backend`` runs it: its configuration's effects applied (:func:`config_zeroed`)."""
    sub = subgraph_part(info)
    cols = config_zeroed(backend)
    if cols is None:
        return sub
    out = sub.copy()
    out[cols] = 0.0
    return out


def _l(x: float) -> float:
    return float(np.log1p(max(float(x), 0.0)))


def subgraph_part(info: SubgraphInfo) -> np.ndarray:
    return _CACHE.get_or(info.hash, lambda: _compute(info))


def _compute(info: SubgraphInfo) -> np.ndarray:
    v = info.node_values
    ops = info.ops
    flops, read, written, weight = v[:, 0], v[:, 1], v[:, 2], v[:, 11]
    hist = np.bincount(ops, minlength=N_OPS).astype(np.float64)
    conv = np.isin(ops, _CONV)
    mm = np.isin(ops, _MATMUL)
    move = np.isin(ops, _MOVE)
    total_flops = float(flops.sum())
    # bytes that cross the subgraph boundary or are weights: what a fused region really moves
    moved = float(sum(info.in_bytes) + sum(info.out_bytes) + weight.sum())
    max_node = float(flops.max()) if len(flops) else 0.0
    conv_kernel = float(v[conv, 5].max()) if conv.any() else 0.0
    conv_stride = float(v[conv, 6].max()) if conv.any() else 0.0
    conv_groups = float(v[conv, 7].max()) if conv.any() else 0.0
    depthwise = 0.0
    if conv.any():
        # depthwise: groups equal to output channels, i.e. weight [C, 1, k...]; a large group count is the tell
        depthwise = float((v[conv, 7] > 1).any() and conv_groups >= 16)
    n_res_ln, res_ln_bytes = residual_add_ln(info)
    out = np.empty(_N_SUB, dtype=np.float64)
    out[:N_OPS] = hist
    out[N_OPS:] = (
        _l(total_flops),
        _l(read.sum()),
        _l(written.sum()),
        float(np.log((total_flops + 1.0) / (moved + 1.0))),
        _l(weight.sum()),
        _l(max(info.in_bytes, default=0)),
        _l(max(info.out_bytes, default=0)),
        _l(sum(info.in_bytes)),
        _l(sum(info.out_bytes)),
        float(len(info.in_bytes)),
        float(len(info.out_bytes)),
        float(info.n_nodes),
        float(info.n_edges),
        float(info.depth),
        _l(flops[conv].sum()),
        _l(flops[mm].sum()),
        _l(flops[~(conv | mm)].sum()),
        _l((read[move] + written[move]).sum()),
        conv_kernel,
        conv_stride,
        _l(conv_groups),
        depthwise,
        _l(v[mm, 8].max() if mm.any() else 0.0),
        _l(v[mm, 9].max() if mm.any() else 0.0),
        _l(v[mm, 10].max() if mm.any() else 0.0),
        _l(max_node),
        max_node / total_flops if total_flops > 0 else 0.0,
        _l(total_flops / max(info.n_nodes, 1)),
        float(n_res_ln),
        _l(res_ln_bytes),
    )
    out.flags.writeable = False
    return out


def flat_row(info: SubgraphInfo, backend: str, hw: HardwareDesc) -> np.ndarray:
    """One row; see :func:`flat_matrix`."""
    return flat_matrix([(info, backend, hw)])[0]


def flat_matrix(items: Sequence[tuple[SubgraphInfo, str, HardwareDesc]]) -> np.ndarray:
    """Rows for many (info, backend, hardware) triples, as a float32 matrix [len(items), N_FEATURES]."""
    out = np.zeros((len(items), N_FEATURES), dtype=np.float32)
    tail = _N_SUB + N_BACKENDS
    n_static = 3 + len(ISA_FLAGS)
    machines: dict[int, list] = {}
    for i, (info, backend, hw) in enumerate(items):
        sub = backend_subgraph_part(info, backend)
        out[i, :_N_SUB] = sub
        out[i, _N_SUB + backend_slot(backend)] = 1.0
        out[i, tail : tail + n_static] = hw.static_vector()
        out[i, tail + n_static] = sub[N_OPS] - np.log(max(hw.threads, 1))
        own = hw.probes_of(backend)
        machine = machines.get(id(hw))
        if machine is None:
            machine = machines[id(hw)] = machine_probes(hw)
        out[i, tail + n_static + 1 :] = [
            *roofline.features(info, own), *roofline.relative_features(info, own, machine),
        ]
    return out


def machine_probes(hw: HardwareDesc) -> list[tuple[float | None, ...] | None]:
    """The probe rows of a machine's plain backends (the configured variants, ``name[...]``, left out where a
    plain backend is probed): what a candidate's backend is compared with, and averaged over."""
    names = [b for b, _ in hw.probes]
    plain = [b for b in names if "[" not in b] or names
    return [hw.probes_of(b) for b in plain]


def machine_log_estimates(items: Sequence[tuple[SubgraphInfo, HardwareDesc]]) -> np.ndarray:
    """Per (info, hardware): :func:`roofline.machine_log_estimate` over the machine's probed backends (the
    configured variants, ``name[...]``, left out where a plain backend is probed); NaN without probes."""
    out = np.full(len(items), np.nan)
    tables: dict[int, list] = {}
    for i, (info, hw) in enumerate(items):
        probes = tables.get(id(hw))
        if probes is None:
            probes = tables[id(hw)] = machine_probes(hw)
        if probes:
            out[i] = roofline.machine_log_estimate(info, probes)
    return out
