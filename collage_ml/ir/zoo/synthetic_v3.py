"""The third vocabulary of synthetic networks (seeds from :data:`FIRST_SEED` on): recurrent sequence models.

The first two vocabularies (:mod:`.synthetic`, :mod:`.synthetic_v2`) are frozen: datasets name their
networks by seed. Neither draws a node whose inputs are all weights. Real models have them: a recurrent
network started from a learned initial state computes its first step's hidden-state product from
constants alone, and so do learned query or memory tokens and projected positional tables. Backends treat
such nodes differently (ONNX Runtime folds a constant Gemm away at session creation, OpenVINO folds part
of it, PyTorch computes it every call), and on the Intel Xeon's leave-one-family-out folds no training row
outside NasRNN held one, so the NasRNN fold's backend-choice misses were exactly those subgraphs
(docs/results/cost-models.md, "Sequence networks at batch 1 and recurrent cells on the Xeon").

This vocabulary draws unrolled recurrent networks of the common cell kinds (Elman, GRU- and LSTM-style
gates built from linear layers), at drawn widths that need not be powers of two, over 2 to 8 steps, from
learned initial states, with optional learned positional tables (added raw or through a linear layer),
and a linear head. The cells are the textbook ones, not any zoo model's. Frozen too, since
``datasets/cpu-2core-xeon-amx-synth-rnn-m5`` names its seeds: a new block kind belongs in a fourth vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import drawn_width

FIRST_SEED = 2000

_ACTS = (torch.tanh, torch.relu, torch.sigmoid)


def _width(rng, lo: int, hi: int) -> int:
    return drawn_width(rng, lo, hi, (1, 4, 8, 16))


class _Recurrent(nn.Module):
    """An unrolled recurrent cell over ``[b, steps, d_in]``, from learned initial states."""

    def __init__(self, rng, d_in: int, hidden: int, steps: int):
        super().__init__()
        self.kind = str(rng.choice(["elman", "gru", "lstm"]))
        self.steps = steps
        gates = {"elman": 1, "gru": 3, "lstm": 4}[self.kind]
        self.wx = nn.Linear(d_in, gates * hidden, bias=bool(rng.random() < 0.7))
        self.wh = nn.Linear(hidden, gates * hidden, bias=bool(rng.random() < 0.5))
        self.act = _ACTS[int(rng.integers(len(_ACTS)))] if self.kind == "elman" else torch.tanh
        self.h0 = nn.Parameter(torch.randn(1, hidden) * 0.5)
        self.c0 = nn.Parameter(torch.randn(1, hidden) * 0.5) if self.kind == "lstm" else None
        pos = str(rng.choice(["none", "add", "projected"]))
        self.pos = nn.Parameter(torch.randn(steps, d_in) * 0.1) if pos != "none" else None
        self.pos_proj = nn.Linear(d_in, d_in) if pos == "projected" else None

    def forward(self, x):
        if self.pos is not None:
            table = self.pos if self.pos_proj is None else torch.tanh(self.pos_proj(self.pos))
            x = x + table
        h = self.h0.expand(x.shape[0], -1)
        c = self.c0.expand(x.shape[0], -1) if self.c0 is not None else None
        for t in range(self.steps):
            gx, gh = self.wx(x[:, t]), self.wh(h)
            if self.kind == "elman":
                h = self.act(gx + gh)
            elif self.kind == "gru":
                xz, xr, xn = gx.chunk(3, dim=-1)
                hz, hr, hn = gh.chunk(3, dim=-1)
                z, r = torch.sigmoid(xz + hz), torch.sigmoid(xr + hr)
                h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            else:
                i, f, g, o = (gx + gh).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
        return h


def sequence(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    """A recurrent network drawn from ``rng``: (module, input shape without the batch, description)."""
    steps = int(rng.integers(2, 9))
    d_in, hidden = _width(rng, 16, 640), _width(rng, 16, 640)
    rnn = _Recurrent(rng, d_in, hidden, steps)
    model = nn.Sequential(rnn, nn.Linear(hidden, int(rng.choice([10, 32, 100]))))
    pos = "none" if rnn.pos is None else "raw" if rnn.pos_proj is None else "projected"
    return model, (steps, d_in), f"recurrent {rnn.kind}, {steps} steps, {d_in} -> {hidden}, positions {pos}"
