"""Shared helpers of the model zoo: the per-variant spec and seeded instantiation."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class Spec:
    """How to build one zoo variant.

    ``make`` constructs the module (weights drawn from torch's global RNG, which
    the caller seeds); ``input_shapes`` are the example input shapes *without*
    the leading batch dimension; ``description`` is a one-line summary.
    """

    make: Callable[[], nn.Module]
    input_shapes: tuple[tuple[int, ...], ...]
    description: str


class Residual(nn.Module):
    """``x + body(x)``: the skip connection of the synthetic networks' residual blocks."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body

    def forward(self, x):
        return x + self.body(x)


class Sum(nn.Module):
    """The sum of the branches' outputs on one input (the synthetic networks' multi-branch nodes)."""

    def __init__(self, *branches: nn.Module):
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x):
        out = self.branches[0](x)
        for b in self.branches[1:]:
            out = out + b(x)
        return out


class Head(nn.Module):
    """A classifier head: the mean over the ``dims`` spatial dimensions, then a linear layer to 10 classes."""

    def __init__(self, c: int, dims: int):
        super().__init__()
        self.dims = tuple(range(2, 2 + dims))
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        return self.fc(x.mean(dim=self.dims))


def drawn_width(rng, lo: int, hi: int, steps: tuple[int, ...]) -> int:
    """A width drawn anywhere in [lo, hi], rounded to a multiple of a step drawn from ``steps`` (the
    synthetic vocabularies' channel counts and hidden sizes, which need not be powers of two)."""
    step = int(rng.choice(steps))
    return int(max(lo, min(hi, step * round(float(rng.uniform(lo, hi)) / step))))


def check_batch(batch: object) -> int:
    """Return ``batch`` as an int if it is a positive integer, else raise ValueError."""
    if isinstance(batch, bool):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    try:
        value = operator.index(batch)  # accepts int and numpy integers, rejects floats
    except TypeError:
        raise ValueError(f"batch must be a positive integer, got {batch!r}") from None
    if value < 1:
        raise ValueError(f"batch must be a positive integer, got {value}")
    return value


@torch.no_grad()
def calibrate_batchnorm(model: nn.Module, input_shapes: tuple[tuple[int, ...], ...]) -> None:
    """Give every BatchNorm seeded, non-trivial affine parameters and running stats.

    The affine parameters are drawn at random (gamma ~ U(0.5, 1.5), beta ~ N(0, 0.1));
    the running mean/variance are then set to the statistics of one train-mode pass
    over a random batch of 2, so that in eval mode every BatchNorm roughly normalizes
    its input: activations stay O(1) through deep random networks instead of
    vanishing or exploding. Uses torch's global RNG (the caller seeds it).
    """
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0.0, 0.1)
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average: one pass sets the batch statistics
    model.train()
    model(*(torch.randn(2, *shape) for shape in input_shapes))
    for bn in bns:
        bn.momentum = 0.1
    model.eval()


def instantiate(spec: Spec, batch: int, seed: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build ``spec`` deterministically from ``seed``: (eval-mode module, example inputs).

    Torch's global RNG state is left as it was. Inputs are float32 N(0, 1) tensors of
    shape ``(batch, *input_shape)`` drawn from a ``torch.Generator`` seeded with ``seed``.
    """
    batch = check_batch(batch)
    seed = operator.index(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.make()
        calibrate_batchnorm(model, spec.input_shapes)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(
        torch.randn((batch, *shape), generator=gen, dtype=torch.float32)
        for shape in spec.input_shapes
    )
    return model, inputs
