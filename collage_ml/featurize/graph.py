"""Graph features for the GNN: one graph per (subgraph, backend, hardware), and their batching.

Per sample:

- ``x`` [n, NODE_FEATURES]: op one-hot, log FLOPs, log bytes read/written,
  log output size, output rank, conv kernel/stride/groups and matmul M/N/K
  (log), weight bytes (log), and whether the node reads a boundary input or
  writes a boundary output (:func:`node_matrix`);
- ``edge_index`` [2, 2e]: the internal tensor edges in both directions,
  producer to consumer and back (:func:`edges_both_ways`);
- graph-level ``u`` [1, GLOBAL_FEATURES]: the flat featurizer's subgraph
  columns with the count columns (op histogram, inputs, outputs, nodes, edges,
  depth, kernel size) compressed by ``log1p`` (:func:`global_vector`);
- ``backend`` [1]: the slot in :data:`~collage_ml.featurize.schema.BACKENDS`;
- ``hw`` [1, HW_VECTOR]: log1p cores and threads, GPU, the ISA flags, whether
  the machine was calibrated, and the probe columns of the flat featurizer for
  this backend (:func:`hw_vector`; NaN where there are no probes, which the
  model masks after standardising).

:func:`graph_data` returns one ``torch_geometric.data.Data``. The GNN trains
on many at once through :class:`GraphTable` and :class:`EncodedSamples`,
which hold each distinct subgraph once and cut mini-batches by index; both
are built from the same functions, so the features the tests check are the
ones the model reads.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from collage_ml.featurize import roofline
from collage_ml.featurize.flat import (
    HW_PROBE_FEATURES, SUBGRAPH_FEATURES, backend_subgraph_part, config_zeroed, machine_probes,
)
from collage_ml.featurize.hardware import ISA_FLAGS, HardwareDesc
from collage_ml.featurize.info import NODE_COLUMNS, SubgraphInfo
from collage_ml.featurize.schema import N_OPS, backend_slot

_LOG_COLUMNS = [i for i, c in enumerate(NODE_COLUMNS) if c not in ("out_rank", "stride")]
_RAW_COLUMNS = [i for i, c in enumerate(NODE_COLUMNS) if c in ("out_rank", "stride")]
NODE_FEATURES = N_OPS + len(NODE_COLUMNS) + 2
GLOBAL_FEATURES = len(SUBGRAPH_FEATURES)
HW_VECTOR = 3 + len(ISA_FLAGS) + 1 + len(HW_PROBE_FEATURES)

#: global columns that are counts: compressed with log1p
COUNT_COLUMNS = np.array(
    [
        i
        for i, c in enumerate(SUBGRAPH_FEATURES)
        if c.startswith("op:") or c in ("n_inputs", "n_outputs", "n_nodes", "n_edges", "depth", "conv_max_kernel",
                                        "n_residual_add_ln")
    ],
    dtype=np.int64,
)


def node_matrix(info: SubgraphInfo) -> np.ndarray:
    n = info.n_nodes
    x = np.zeros((n, NODE_FEATURES), dtype=np.float32)
    x[np.arange(n), info.ops.astype(np.int64)] = 1.0
    v = info.node_values
    x[:, N_OPS + np.array(_LOG_COLUMNS)] = np.log1p(np.maximum(v[:, _LOG_COLUMNS], 0))
    x[:, N_OPS + np.array(_RAW_COLUMNS)] = v[:, _RAW_COLUMNS]
    x[:, -2] = info.is_input_fed
    x[:, -1] = info.is_output
    return x


def edges_both_ways(info: SubgraphInfo) -> np.ndarray:
    e = np.asarray(info.edges, dtype=np.int64).reshape(2, -1)
    return np.concatenate([e, e[::-1]], axis=1)


def global_vector(info: SubgraphInfo, backend: str = "") -> np.ndarray:
    """The subgraph's global row as ``backend`` runs it (``flat.backend_subgraph_part``)."""
    u = np.array(backend_subgraph_part(info, backend), dtype=np.float32)
    u[COUNT_COLUMNS] = np.log1p(np.maximum(u[COUNT_COLUMNS], 0))
    return u


def hw_vector(info: SubgraphInfo, backend: str, hw: HardwareDesc) -> list[float]:
    probes = hw.probes_of(backend)
    static = [math.log1p(hw.cores), math.log1p(hw.threads), float(hw.gpu), *(float(f in hw.isa) for f in ISA_FLAGS)]
    return [*static, float(probes is not None), *roofline.features(info, probes),
            *roofline.relative_features(info, probes, machine_probes(hw))]


def graph_data(info: SubgraphInfo, backend: str, hw: HardwareDesc, y: float | None = None):
    """A ``torch_geometric.data.Data``; ``y`` (log latency), when given, is stored as ``y`` [1]."""
    import torch
    from torch_geometric.data import Data

    d = Data(
        x=torch.from_numpy(node_matrix(info)),
        edge_index=torch.from_numpy(edges_both_ways(info)),
        backend=torch.tensor([backend_slot(backend)], dtype=torch.long),
        hw=torch.tensor([hw_vector(info, backend, hw)], dtype=torch.float32),
        u=torch.from_numpy(global_vector(info, backend)).unsqueeze(0),
    )
    if y is not None:
        d.y = torch.tensor([y], dtype=torch.float32)
    return d


# -- batching -----------------------------------------------------------------------------
class GraphTable:
    """Distinct subgraphs, their node rows, edges and global rows, concatenated for fast batching."""

    def __init__(self) -> None:
        self.index: dict[str | tuple, int] = {}
        self._x: list[np.ndarray] = []
        self._e: list[np.ndarray] = []
        self._u: list[np.ndarray] = []
        self._frozen = None

    def add(self, info: SubgraphInfo, backend: str = "") -> int:
        """The row of ``info`` as ``backend`` runs it: one per subgraph, and one more per configuration that
        changes its global row (``flat.config_zeroed``)."""
        cols = config_zeroed(backend)
        key = info.hash if cols is None else (info.hash, *cols.tolist())
        i = self.index.get(key)
        if i is None:
            i = len(self._x)
            self.index[key] = i
            self._x.append(node_matrix(info))
            self._e.append(edges_both_ways(info))
            self._u.append(global_vector(info, backend))
            self._frozen = None
        return i

    def tensors(self):
        """(x [N, F], edges [2, E] local, node_ptr [G], n_nodes [G], edge_ptr [G], n_edges [G], u [G, U])."""
        if self._frozen is None:
            import torch

            n = np.array([len(x) for x in self._x], dtype=np.int64)
            m = np.array([e.shape[1] for e in self._e], dtype=np.int64)
            self._frozen = (
                torch.from_numpy(np.concatenate(self._x) if self._x else np.zeros((0, NODE_FEATURES), np.float32)),
                torch.from_numpy(np.concatenate(self._e, axis=1) if self._e else np.zeros((2, 0), np.int64)),
                torch.from_numpy(np.concatenate([[0], np.cumsum(n)[:-1]]) if len(n) else n),
                torch.from_numpy(n),
                torch.from_numpy(np.concatenate([[0], np.cumsum(m)[:-1]]) if len(m) else m),
                torch.from_numpy(m),
                torch.from_numpy(np.stack(self._u) if self._u else np.zeros((0, GLOBAL_FEATURES), np.float32)),
            )
        return self._frozen


class EncodedSamples:
    """Samples (anything with ``info``, ``backend``, ``hw`` and, with ``with_y``, ``log_latency``) as index
    tensors into a :class:`GraphTable`, with their per-sample backend, hardware and target tensors."""

    def __init__(self, samples: Sequence, graphs: GraphTable | None = None, with_y: bool = True):
        import torch

        self.graphs = graphs or GraphTable()
        self.gid = torch.tensor([self.graphs.add(s.info, s.backend) for s in samples], dtype=torch.long)
        self.backend = torch.tensor([backend_slot(s.backend) for s in samples], dtype=torch.long)
        hw_rows: dict[tuple, list[float]] = {}
        rows = []
        for s in samples:
            k = (s.info.hash, s.backend, s.hw)
            if k not in hw_rows:
                hw_rows[k] = hw_vector(s.info, s.backend, s.hw)
            rows.append(hw_rows[k])
        self.hw = torch.tensor(rows, dtype=torch.float32).reshape(-1, HW_VECTOR)
        self.y = torch.tensor([s.log_latency for s in samples], dtype=torch.float32) if with_y else None

    def __len__(self) -> int:
        return int(self.gid.shape[0])

    def batch(self, idx, per_sample: bool = False) -> dict:
        """A mini-batch of the samples at ``idx``: the graphs (each distinct one once, or one per
        sample with ``per_sample``), node-level, and per-sample tensors."""
        import torch

        X, E, nptr, nn_, eptr, ne, U = self.graphs.tensors()
        gid = self.gid[idx]
        if per_sample:
            ug, inv = gid, torch.arange(int(gid.shape[0]))
        else:
            ug, inv = torch.unique(gid, return_inverse=True)
        counts = nn_[ug]
        G = int(ug.shape[0])
        batch_vec = torch.repeat_interleave(torch.arange(G), counts)
        start = torch.cumsum(counts, 0) - counts  # where each graph's nodes start in the batch
        node_idx = torch.repeat_interleave(nptr[ug] - start, counts) + torch.arange(int(counts.sum()))
        ecounts = ne[ug]
        estart = torch.cumsum(ecounts, 0) - ecounts
        edge_idx = torch.repeat_interleave(eptr[ug] - estart, ecounts) + torch.arange(int(ecounts.sum()))
        edges = E[:, edge_idx] + torch.repeat_interleave(start, ecounts).unsqueeze(0)
        return {
            "x": X[node_idx],
            "edge_index": edges,
            "batch": batch_vec,
            "n_graphs": G,
            "u": U[ug],
            "inv": inv,
            "backend": self.backend[idx],
            "graph_backend": self.backend[idx] if per_sample else None,
            "hw": self.hw[idx],
        }
