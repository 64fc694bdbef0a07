"""A graph neural network cost model (``kind = "gnn"``).

Architecture
    Per (subgraph, backend, hardware) sample the inputs are the graph features
    of :mod:`collage_ml.featurize.graph`: node rows ``x`` [n, NODE_FEATURES],
    the internal tensor edges, the backend slot, the hardware vector and the
    flat subgraph features ``u`` [GLOBAL_FEATURES]. Node and global columns
    are standardised with per-column mean/std of the training set (stored as
    buffers in the ``state_dict``, so they travel with the artifact).

    - node encoder: Linear(NODE_FEATURES, hidden) + ReLU;
    - ``layers`` message-passing layers over the edges in both directions
      (producer->consumer and back), each residual with LayerNorm + ReLU.
      ``conv`` chooses the layer: ``"sage"`` (GraphSAGE, mean aggregation),
      ``"gin"`` (GIN, sum aggregation with a 2-layer MLP) or ``"gat"``
      (GATv1, 4 heads);
    - readout: sum- and mean-pooling of the node states, concatenated;
    - global branch: Linear(GLOBAL_FEATURES, hidden) + ReLU on ``u``;
    - head: [readout, global, backend embedding (16), hardware vector] ->
      MLP(hidden, hidden) with dropout -> standardised log latency. The
      hardware vector (:func:`~collage_ml.featurize.graph.hw_vector`) is the
      static description, a "calibrated" flag and the candidate's backend's
      probe columns (rates, roofline estimate, probe latencies); missing probe
      columns are NaN, standardised with NaN-aware statistics and then set to
      0, the training mean.

    The graph encoder does not see the backend, so within one batch every
    distinct subgraph is encoded once and shared by all its backends (a
    placement asks for the same subgraph on several backends).
    ``backend_nodes=True`` instead adds a backend embedding to every node's
    input (each sample's graph encoded on its own); measured with GAT at 60
    epochs it ranked a little better (0.734 vs 0.718) but its MAPE was worse
    (0.447 vs 0.420) and it trained 1.3x slower, so it is off by default.

    Measured choice (``benchmarks/gnn_arch.py``, cpu-2core-zen4 database,
    10,121 samples, 30 epochs, hidden 64, 3 layers; leave-one-family-out,
    mean over the held-out families nasnet, bert and mobilenetv2; MAPE is
    mean |pred/true - 1|, rank the pairwise ranking accuracy among backends of
    the same subgraph; one thread on a shared 2-core machine):

    ============  =====  ======  =====  ======
    conv          MAPE   medAPE  rank   fit s
    ============  =====  ======  =====  ======
    sage          0.436  0.432   0.723  10.5
    gin           0.397  0.381   0.718   9.5
    gat           0.397  0.378   0.731  12.8
    gat, seed 1   0.387  0.378   0.734  13.2
    gat, 0 layers 0.429  0.417   0.726   4.6
    ============  =====  ======  =====  ======

    (A model-free reference that ranks backends by their mean offset on the
    training families reaches rank 0.653.) GAT is the default: the best
    ranking, tied best MAPE, at a cost of seconds. Message passing helps only
    a little over the pooled node encodings plus global features (0 layers):
    most subgraphs have 1-6 nodes. 60 epochs were worse than 30 out of
    family (MAPE 0.420 vs 0.397 for GAT); a hidden size of 128 did not help.

Training
    Adam (``lr``), MSE on the standardised natural-log latency, ``epochs``
    passes with mini-batches of ``batch_size``, a fixed ``seed``, CPU only,
    with a cosine learning-rate decay. Training and prediction run with
    ``threads`` torch threads (default 1; restored afterwards): the batches
    are small, and on a busy 2-core machine two threads made an epoch 20x
    slower. The full 10k-row dataset trains in about 15 s; prediction runs at
    ~27,000 samples/s (featurization included).

Uncertainty
    Monte-Carlo dropout in the head (chosen over an ensemble, which would
    multiply the training time): the deterministic (dropout-off) pass
    gives the mean; ``mc_samples`` extra passes of the head with dropout on
    (seeded, so predictions are reproducible) give the standard deviation of
    the log latency. Only the head is resampled, so the graph encoder runs
    once per distinct subgraph and the T passes cost little. MC-dropout
    spread is a rough, usually too narrow, estimate of the real error; use it
    to rank confidence, not as a calibrated interval.

Updates
    ``update(new)`` fine-tunes the current weights for ``finetune_epochs`` on
    the new samples mixed with a replay sample (up to 4x as many, at least
    256) of the training data kept in memory since ``fit`` (none after
    ``load_model``: then only the new samples are used), the new samples
    weighted to count as much as the replay together, at half the learning
    rate. The normalisers stay those of the original fit; the prediction
    bounds widen to cover the new latencies. An unfitted model is simply
    fitted (``{"mode": "fit"}``).

Artifact
    ``state_dict.pt`` (plain tensors, loaded with ``weights_only=True``) plus
    ``meta.json`` with the parameters and the feature sizes; loading refuses
    mismatched feature sizes.

Featurization and batching live in :mod:`collage_ml.featurize.graph`
(``GraphTable``, ``EncodedSamples``): the same functions build one
``torch_geometric`` ``Data`` and the mini-batches.

Guards against extrapolation
    Columns are centred and divided by max(std, 1), so rare one-hot ops are
    not blown up (see :func:`_std`); counts in ``u`` are log1p-compressed;
    standardised inputs are clipped to +-10; predictions stay within the
    training range of log latency widened by 3 (x20 either way).
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from collage_ml.errors import describe
from collage_ml.featurize.graph import GLOBAL_FEATURES, HW_VECTOR, NODE_FEATURES, EncodedSamples as _Encoded
from collage_ml.featurize.schema import N_BACKENDS, backend_slot
from collage_ml.models.base import ArtifactError, CostModel, check_params
from collage_ml.models.dataset import Dataset, Sample

STATE = "state_dict.pt"
BACKEND_EMBED = 16
HW_FEATURES = HW_VECTOR

DEFAULTS: dict[str, Any] = {
    "conv": "gat",
    "hidden": 64,
    "layers": 3,
    "dropout": 0.1,
    "epochs": 30,
    "lr": 2e-3,
    "batch_size": 128,
    "mc_samples": 16,
    "seed": 0,
    "finetune_epochs": 20,
    "weight_decay": 1e-5,
    "threads": 1,
    "backend_nodes": False,
}

CONVS = ("sage", "gin", "gat")

#: standardised inputs are clipped to this many (floored) standard deviations
_CLIP = 10.0
#: predictions are kept within the training range of log latency widened by this much (x20 either way)
_Y_MARGIN = 3.0


def _torch():
    import torch

    return torch


# -- the network --------------------------------------------------------------------------
def _build_net(p: dict[str, Any]):
    torch = _torch()
    nn = torch.nn
    from torch_geometric.nn import GATConv, GINConv, SAGEConv, global_add_pool, global_mean_pool

    conv, hidden, layers, dropout = str(p["conv"]), int(p["hidden"]), int(p["layers"]), float(p["dropout"])
    if conv not in CONVS:
        raise ValueError(f"unknown conv {conv!r}; choose one of {', '.join(CONVS)}")

    def make_conv():
        if conv == "sage":
            return SAGEConv(hidden, hidden)
        if conv == "gin":
            return GINConv(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)), train_eps=True)
        heads = 4 if hidden % 4 == 0 else 1
        return GATConv(hidden, hidden // heads, heads=heads, add_self_loops=True)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # normalisers (training-set statistics), saved with the weights
            self.register_buffer("x_mean", torch.zeros(NODE_FEATURES))
            self.register_buffer("x_std", torch.ones(NODE_FEATURES))
            self.register_buffer("u_mean", torch.zeros(GLOBAL_FEATURES))
            self.register_buffer("u_std", torch.ones(GLOBAL_FEATURES))
            self.register_buffer("hw_mean", torch.zeros(HW_FEATURES))
            self.register_buffer("hw_std", torch.ones(HW_FEATURES))
            self.register_buffer("y_mean", torch.zeros(()))
            self.register_buffer("y_std", torch.ones(()))
            self.register_buffer("y_lo", torch.tensor(-1e9))  # standardised, widened training range
            self.register_buffer("y_hi", torch.tensor(1e9))
            self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
            self.node_in = nn.Linear(NODE_FEATURES, hidden)
            self.convs = nn.ModuleList([make_conv() for _ in range(layers)])
            self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(layers)])
            self.glob = nn.Linear(GLOBAL_FEATURES, hidden)
            self.backend_emb = nn.Embedding(N_BACKENDS, BACKEND_EMBED)
            self.node_backend = nn.Embedding(N_BACKENDS, hidden) if p["backend_nodes"] else None
            self.head_in = nn.Linear(3 * hidden + BACKEND_EMBED + HW_FEATURES, hidden)
            self.head_mid = nn.Linear(hidden, hidden)
            self.head_out = nn.Linear(hidden, 1)
            self.p = dropout
            self.pool_add, self.pool_mean = global_add_pool, global_mean_pool

        def encode(self, b):
            """Per-distinct-graph embedding [G, 3*hidden] (backend-independent)."""
            x = self.node_in(((b["x"] - self.x_mean) / self.x_std).clamp(-_CLIP, _CLIP))
            if self.node_backend is not None:
                x = x + self.node_backend(b["graph_backend"])[b["batch"]]
            x = torch.relu(x)
            ei = b["edge_index"]
            for conv_, norm in zip(self.convs, self.norms):
                x = torch.relu(norm(x + conv_(x, ei)))
            G = b["n_graphs"]
            pooled = torch.cat([self.pool_add(x, b["batch"], size=G) / 8.0, self.pool_mean(x, b["batch"], size=G)], 1)
            g = torch.relu(self.glob(((b["u"] - self.u_mean) / self.u_std).clamp(-_CLIP, _CLIP)))
            return torch.cat([pooled, g], 1)

        def head(self, z, b, gen=None):
            """Standardised log latency per sample; ``gen`` turns on (seeded) MC dropout."""
            # probe columns are NaN on a machine without probes: 0 after standardising, i.e. the training mean
            hw = torch.nan_to_num(((b["hw"] - self.hw_mean) / self.hw_std).clamp(-_CLIP, _CLIP), nan=0.0)
            h = torch.cat([z[b["inv"]], self.backend_emb(b["backend"]), hw], 1)
            h = self._drop(torch.relu(self.head_in(h)), gen)
            h = self._drop(torch.relu(self.head_mid(h)), gen)
            return self.head_out(h).squeeze(-1)

        def _drop(self, h, gen):
            if self.p <= 0:
                return h
            if gen is not None:
                keep = torch.rand(h.shape, generator=gen) >= self.p
                return h * keep / (1.0 - self.p)
            return torch.nn.functional.dropout(h, self.p, self.training)

        def forward(self, b):
            return self.head(self.encode(b), b)

        def bound(self, y):
            """Standardised predictions kept within the widened training range."""
            return torch.maximum(torch.minimum(y, self.y_hi), self.y_lo)

    return Net()


class _threads:
    """Runs torch with ``n`` intra-op threads inside the block (restored after).

    The graphs are small (a batch is a few hundred nodes), so extra threads
    buy little, and on a busy machine their synchronisation costs far more:
    measured on 2 shared cores, one epoch over 8k samples took 0.6 s on one
    thread and 14 s on two.
    """

    def __init__(self, n: int):
        self.n = max(1, int(n))

    def __enter__(self):
        torch = _torch()
        self.old = torch.get_num_threads()
        if self.old != self.n:
            torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        torch = _torch()
        if torch.get_num_threads() != self.old:
            torch.set_num_threads(self.old)
        return False


def _std(t, floor: float = 1.0):
    """Per-column std, floored at ``floor``.

    Columns are centred but only the wide ones are scaled down: a rare one-hot
    op (or a count or geometry column almost constant in the training set)
    would otherwise be blown up to hundreds of standard deviations when an
    unseen family uses it, and the network extrapolates wildly (measured: a
    held-out BERT block predicted 7000x too slow before this floor).
    """
    torch = _torch()
    if t.shape[0] <= 1:
        return torch.zeros(t.shape[1:]).clamp_min(floor)
    mean = torch.nan_to_num(t.nanmean(0), nan=0.0)
    s = torch.nan_to_num(((t - mean) ** 2).nanmean(0), nan=0.0).sqrt()  # NaN (missing probes) left out
    return s.clamp_min(floor)


# -- the cost model -----------------------------------------------------------------------
class GNNCostModel(CostModel):
    kind = "gnn"

    def __init__(self, **params: Any):
        check_params("GNNCostModel", params, DEFAULTS)
        super().__init__(**{**DEFAULTS, **params})
        if self.params["conv"] not in CONVS:
            raise ValueError(f"unknown conv {self.params['conv']!r}; choose one of {', '.join(CONVS)}")
        self.net = None
        self._replay: list[Sample] = []
        self.fit_seconds: float | None = None

    # -- training ------------------------------------------------------------------------
    def fit(self, data: Dataset) -> "GNNCostModel":
        torch = _torch()
        with _threads(self.params["threads"]), torch.random.fork_rng(devices=[]):
            return self._fit(data)

    def _fit(self, data: Dataset) -> "GNNCostModel":
        torch = _torch()
        self._record_fit(data)
        t0 = time.perf_counter()
        samples = list(data)
        torch.manual_seed(int(self.params["seed"]))
        self.net = _build_net(self.params)
        enc = _Encoded(samples)
        self._set_normalisers(enc)
        self._train(enc, int(self.params["epochs"]), float(self.params["lr"]), seed=int(self.params["seed"]))
        rng = random.Random(int(self.params["seed"]))
        self._replay = samples if len(samples) <= 20_000 else rng.sample(samples, 20_000)
        self.fit_seconds = time.perf_counter() - t0
        self.meta["fit_seconds"] = round(self.fit_seconds, 2)
        return self

    def _set_normalisers(self, enc: _Encoded) -> None:
        torch = _torch()
        X, _, _, _, _, _, U = enc.graphs.tensors()
        net = self.net
        with torch.no_grad():
            # node statistics over the distinct training subgraphs
            net.x_mean.copy_(X.mean(0))
            net.x_std.copy_(_std(X))
            u = U[enc.gid]
            net.u_mean.copy_(u.mean(0))
            net.u_std.copy_(_std(u))
            net.hw_mean.copy_(torch.nan_to_num(enc.hw.nanmean(0), nan=0.0))
            net.hw_std.copy_(_std(enc.hw))
            net.y_mean.copy_(enc.y.mean())
            net.y_std.copy_(enc.y.std(unbiased=False).clamp_min(0.1) if len(enc) > 1 else torch.ones(()))
            net.y_lo.copy_((enc.y.min() - _Y_MARGIN - net.y_mean) / net.y_std)
            net.y_hi.copy_((enc.y.max() + _Y_MARGIN - net.y_mean) / net.y_std)
            net.fitted.fill_(True)

    def _train(self, enc: _Encoded, epochs: int, lr: float, seed: int, weights=None) -> list[float]:
        torch = _torch()
        net = self.net
        n = len(enc)
        if n == 0 or epochs <= 0:
            return []
        bs = max(1, int(self.params["batch_size"]))
        opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=float(self.params["weight_decay"]))
        steps = epochs * math.ceil(n / bs)

        def cosine(step: int) -> float:  # from lr down to 5% of it
            return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(step / steps, 1.0)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, cosine)
        gen = torch.Generator().manual_seed(seed)
        y = (enc.y - net.y_mean) / net.y_std
        per_sample = bool(self.params["backend_nodes"])
        losses = []
        net.train()
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, bs):
                idx = perm[i : i + bs]
                pred = net(enc.batch(idx, per_sample))
                err = (pred - y[idx]) ** 2
                loss = err.mean() if weights is None else (err * weights[idx]).sum() / weights[idx].sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / n)
        net.eval()
        return losses

    def update(self, new: Dataset) -> dict[str, Any]:
        torch = _torch()
        with _threads(self.params["threads"]), torch.random.fork_rng(devices=[]):
            return self._update(new)

    def _update(self, new: Dataset) -> dict[str, Any]:
        new_s = list(new)
        if not new_s:
            return {"mode": "none", "n": 0}
        if self.net is None or not bool(self.net.fitted):
            self._fit(Dataset(new_s))
            self._record_update(len(new_s))
            return {"mode": "fit", "n": len(new_s)}
        torch = _torch()
        seed = int(self.params["seed"]) + int(self.meta.get("updates", 0)) + 1
        torch.manual_seed(seed)
        rng = random.Random(seed)
        k = min(len(self._replay), max(4 * len(new_s), 256))
        replay = rng.sample(self._replay, k) if k else []
        enc = _Encoded(new_s + replay)
        net = self.net
        with torch.no_grad():  # widen the prediction bounds to cover the new measurements
            net.y_lo.copy_(torch.minimum(net.y_lo, (enc.y.min() - _Y_MARGIN - net.y_mean) / net.y_std))
            net.y_hi.copy_(torch.maximum(net.y_hi, (enc.y.max() + _Y_MARGIN - net.y_mean) / net.y_std))
        # the new samples weigh as much as the replay together (but never less than one each)
        w = torch.ones(len(enc))
        if replay:
            w[: len(new_s)] = max(1.0, len(replay) / len(new_s))
        self._train(enc, int(self.params["finetune_epochs"]), float(self.params["lr"]) * 0.5, seed=seed, weights=w)
        self._replay = self._replay + new_s
        if len(self._replay) > 20_000:
            self._replay = rng.sample(self._replay, 20_000)
        self._record_update(len(new_s))
        return {"mode": "finetune", "n": len(new_s), "replay": len(replay)}

    # -- prediction ----------------------------------------------------------------------
    def predict_log(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        with _threads(self.params["threads"]):
            return self._predict_log(samples)

    def _predict_log(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        torch = _torch()
        if self.net is None:
            raise ArtifactError("the GNN cost model is not fitted; call fit() or load_model()")
        n = len(samples)
        if n == 0:
            return np.zeros(0), np.zeros(0)
        enc = _Encoded(samples, with_y=False)
        net = self.net
        net.eval()
        T = int(self.params["mc_samples"])
        per_sample = bool(self.params["backend_nodes"])
        gen = torch.Generator().manual_seed(int(self.params["seed"]) + 12345)
        mean = np.empty(n)
        sd = np.zeros(n)
        bs = 4096
        with torch.no_grad():
            for i in range(0, n, bs):
                idx = torch.arange(i, min(n, i + bs))
                b = enc.batch(idx, per_sample)
                z = net.encode(b)
                mean[i : i + len(idx)] = net.bound(net.head(z, b)).double().numpy()
                if T > 1 and net.p > 0:
                    mc = torch.stack([net.bound(net.head(z, b, gen)) for _ in range(T)])
                    sd[i : i + len(idx)] = mc.double().std(0).numpy()
        ys, ym = float(net.y_std), float(net.y_mean)
        return mean * ys + ym, sd * ys

    # -- artifacts -----------------------------------------------------------------------
    def _save_payload(self, directory: Path) -> dict[str, Any]:
        torch = _torch()
        if self.net is None:
            raise ArtifactError("cannot save an unfitted GNN cost model")
        torch.save({k: v.detach().clone() for k, v in self.net.state_dict().items()}, directory / STATE)
        return {
            "node_features": NODE_FEATURES,
            "global_features": GLOBAL_FEATURES,
            "hw_features": HW_FEATURES,
            "n_backends": N_BACKENDS,
            "state_file": STATE,
        }

    def _load_payload(self, directory: Path, meta: dict[str, Any]) -> None:
        torch = _torch()
        want = {"node_features": NODE_FEATURES, "global_features": GLOBAL_FEATURES, "hw_features": HW_FEATURES,
                "n_backends": N_BACKENDS}
        bad = [f"{k}={meta.get(k)!r} (this collage-ml has {v})" for k, v in want.items() if meta.get(k) != v]
        if bad:
            raise ArtifactError(f"GNN cost model {directory} was built for other feature sizes: {', '.join(bad)}; retrain it")
        f = Path(directory) / STATE
        if not f.exists():
            raise ArtifactError(f"GNN cost model {directory} has no {STATE}")
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ArtifactError(f"GNN cost model {f} is unreadable: {describe(e)}") from None
        net = _build_net(self.params)
        try:
            net.load_state_dict(state, strict=True)
        except Exception as e:
            raise ArtifactError(f"GNN cost model {f} does not match its parameters: {type(e).__name__}: {e}") from None
        net.eval()
        self.net = net
        self._replay = []
