"""NasRNN: the recurrent cell found by neural architecture search (Zoph & Le, 2017).

This follows the cell as used by TASO's and Collage's NasRNN benchmark: at each step,
8 projections ``t_i = x W_i + h U_i`` (16 MatMuls + 8 Adds) feed a fixed tree::

    m0 = relu(t0) + sigmoid(t3)        m1 = sigmoid(t1) + tanh(t2)
    m2 = sigmoid(t4) * tanh(t5)        m3 = sigmoid(t6) * relu(t7)
    m4 = sigmoid(m1) + tanh(m2)        m5 = tanh(m0) * tanh(m3)
    m6 = tanh(m4) * tanh(m5)           h' = tanh(m6)

Projections are bias-free ``nn.Linear`` layers shared across time steps (TASO draws
fresh weights per step; sharing them is what a real RNN does and does not change the
graph's op structure). The initial state is a learned ``[1, hidden]`` parameter
broadcast over the batch, as in TASO.

Full size: hidden 512, input size 512, 5 time steps (TASO's length); input
``[b, 5, 512]`` -> final state ``[b, 512]``.

Tiny: hidden 32, input size 32, 3 steps; input ``[b, 3, 32]`` -> ``[b, 32]``.
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import Spec


class NasCell(nn.Module):
    """One NasRNN step: (x ``[b, input]``, h ``[b, hidden]``) -> h' ``[b, hidden]``."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.wx = nn.ModuleList(nn.Linear(input_size, hidden, bias=False) for _ in range(8))
        self.wh = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(8))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        t = [wx(x) + wh(h) for wx, wh in zip(self.wx, self.wh)]
        m0 = torch.relu(t[0]) + torch.sigmoid(t[3])
        m1 = torch.sigmoid(t[1]) + torch.tanh(t[2])
        m2 = torch.sigmoid(t[4]) * torch.tanh(t[5])
        m3 = torch.sigmoid(t[6]) * torch.relu(t[7])
        m4 = torch.sigmoid(m1) + torch.tanh(m2)
        m5 = torch.tanh(m0) * torch.tanh(m3)
        m6 = torch.tanh(m4) * torch.tanh(m5)
        return torch.tanh(m6)


class NasRNN(nn.Module):
    """Unrolled NasRNN: ``[b, T, input]`` -> final hidden state ``[b, hidden]``."""

    def __init__(self, input_size: int, hidden: int, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.cell = NasCell(input_size, hidden)
        self.h0 = nn.Parameter(torch.randn(1, hidden) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.h0.expand(x.shape[0], -1)
        for step in range(self.steps):
            h = self.cell(x[:, step], h)
        return h


FULL = Spec(
    make=lambda: NasRNN(512, 512, steps=5),
    input_shapes=((5, 512),),
    description="NasRNN (NAS cell, hidden 512, unrolled 5 steps, 16 MatMuls/step); input [1, 5, 512]",
)
TINY = Spec(
    make=lambda: NasRNN(32, 32, steps=3),
    input_shapes=((3, 32),),
    description="tiny NasRNN (NAS cell, hidden 32, unrolled 3 steps); input [1, 3, 32]",
)
