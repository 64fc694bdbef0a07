"""Graph features for the GNN: one ``torch_geometric.data.Data`` per (subgraph, backend, hardware).

- ``x`` [n, NODE_FEATURES]: op one-hot, log FLOPs, log bytes read/written,
  log output size, output rank, conv kernel/stride/groups and matmul M/N/K
  (log), weight bytes (log), and whether the node reads a boundary input or
  writes a boundary output;
- ``edge_index`` [2, e]: the internal tensor edges, producer to consumer;
- graph-level: ``backend`` [1] (slot in :data:`~collage_ml.featurize.schema.BACKENDS`),
  ``hw`` [1, 3] (cores, threads, GPU) and ``u`` [1, len(SUBGRAPH_FEATURES)],
  the flat featurizer's subgraph columns (sizes and totals the readout would
  otherwise have to rediscover).

Batched with ``torch_geometric.loader.DataLoader`` these become per-graph rows.
"""

from __future__ import annotations

import numpy as np

from collage_ml.featurize.flat import SUBGRAPH_FEATURES, subgraph_part
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import NODE_COLUMNS, SubgraphInfo
from collage_ml.featurize.schema import N_OPS, backend_slot

_LOG_COLUMNS = [i for i, c in enumerate(NODE_COLUMNS) if c not in ("out_rank", "stride")]
_RAW_COLUMNS = [i for i, c in enumerate(NODE_COLUMNS) if c in ("out_rank", "stride")]
NODE_FEATURES = N_OPS + len(NODE_COLUMNS) + 2
GLOBAL_FEATURES = len(SUBGRAPH_FEATURES)


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


def graph_data(info: SubgraphInfo, backend: str, hw: HardwareDesc, y: float | None = None):
    """A ``torch_geometric.data.Data``; ``y`` (log latency), when given, is stored as ``y`` [1]."""
    import torch
    from torch_geometric.data import Data

    d = Data(
        x=torch.from_numpy(node_matrix(info)),
        edge_index=torch.from_numpy(info.edges),
        backend=torch.tensor([backend_slot(backend)], dtype=torch.long),
        hw=torch.tensor([hw.vector()], dtype=torch.float32),
        u=torch.from_numpy(np.asarray(subgraph_part(info), dtype=np.float32)).unsqueeze(0),
    )
    if y is not None:
        d.y = torch.tensor([y], dtype=torch.float32)
    return d
