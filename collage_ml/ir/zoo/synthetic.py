"""Synthetic networks: seeded random stacks of common blocks, for cost-model training data.

The eight zoo families cover few operator mixes: a model of a new family brings blocks that no training
row has seen (DCGAN's transposed convolutions, ResNet3D's 3-D convolutions; README, "Cost models").
``synthetic-<seed>`` is a network drawn at random from a generic vocabulary of blocks, in one of three
domains, so that a dataset covers each kind of block at many shapes:

- **image**: convolutions (1x1 to 7x7, stride 1 or 2, grouped and depthwise), transposed convolutions,
  BatchNorm, eight activations, max and average pooling, residual blocks, two-branch concatenations, a
  pooled linear head;
- **sequence**: linear layers, LayerNorm, self-attention, MLPs and gated recurrent-style cells;
- **volume**: 3-D convolutions, BatchNorm, activations and 3-D pooling.

The vocabulary is the common one of CNNs, transformers and RNNs, not any zoo model's layer list: the
shapes are drawn, not copied. The same seed gives the same network (and the same weights, through
:func:`~collage_ml.ir.zoo._common.instantiate`). Family ``synthetic``; never held out as a zoo family.

Seeds below 1000 draw from this vocabulary, which is frozen (datasets name its networks by seed). Seeds
from 1000 on draw image networks from a wider one (:mod:`.synthetic_v2`: separable, inverted-residual,
grouped and multi-branch blocks, transposed convolutions of stride 1 and 2, explicit padding, any width),
from 2000 on recurrent sequence networks started from learned states (:mod:`.synthetic_v3`), from 3000
on transformer encoders, post-norm in most (:mod:`.synthetic_v4`), and from 4000 on image cells whose
branches meet in wide concatenations (:mod:`.synthetic_v5`).
"""

from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

from . import synthetic_v2, synthetic_v3, synthetic_v4, synthetic_v5
from ._common import Head as _Head, Residual as _Residual, Spec

FAMILY = "synthetic"
PREFIX = "synthetic-"
_NAME = re.compile(r"^synthetic-(\d{1,9})$")

_ACTS = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.SiLU, nn.GELU)


def seed_of(name: str) -> int | None:
    """The seed of a synthetic model's name (``synthetic-12`` -> 12), or None if it is not one."""
    m = _NAME.match(str(name))
    return int(m.group(1)) if m else None


def _act(rng) -> nn.Module:
    return _ACTS[int(rng.integers(len(_ACTS)))]()


def _ch(rng, c: int, lo: int = 8, hi: int = 512) -> int:
    return int(np.clip(c * rng.choice([0.5, 1, 1, 2]), lo, hi))


class _Concat(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return torch.cat([self.a(x), self.b(x)], dim=1)


class _Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, n, d))


class _Gated(nn.Module):
    """A recurrent-style cell over the sequence as a whole: tanh(Wx) * sigmoid(Ux) + x."""

    def __init__(self, d: int):
        super().__init__()
        self.w, self.u = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return torch.tanh(self.w(x)) * torch.sigmoid(self.u(x)) + x


def _conv_bn_act(rng, conv, bn, cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    layers = [conv(cin, cout, k, stride, k // 2, groups=groups, bias=False), bn(cout)]
    if rng.random() < 0.9:
        layers.append(_act(rng))
    return nn.Sequential(*layers)


def _image(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    c = int(rng.choice([3, 16, 32, 64]))
    hw = int(rng.choice([14, 28, 56, 112]))
    shape = (c, hw, hw)
    layers: list[nn.Module] = []
    for _ in range(int(rng.integers(4, 11))):
        kind = rng.choice(["conv", "conv", "dw", "tconv", "pool", "res", "cat"])
        if kind == "pool" and hw >= 8:
            k = int(rng.choice([2, 3]))
            pool = nn.MaxPool2d if rng.random() < 0.5 else nn.AvgPool2d
            layers.append(pool(k, 2, padding=k // 2 if k == 3 else 0))
            hw = (hw + 2 * (k // 2 if k == 3 else 0) - k) // 2 + 1
        elif kind == "tconv" and hw <= 56:
            cout, k = _ch(rng, c), int(rng.choice([2, 4]))
            layers += [nn.ConvTranspose2d(c, cout, k, 2, (k - 2) // 2, bias=False), nn.BatchNorm2d(cout), _act(rng)]
            c, hw = cout, hw * 2
        elif kind == "dw" and c >= 8:
            k = int(rng.choice([3, 5]))
            cout = _ch(rng, c)
            layers += [_conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, c, k, 1, groups=c),
                       _conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, cout, 1, 1)]
            c = cout
        elif kind == "res" and c >= 8:
            k = int(rng.choice([1, 3]))
            body = nn.Sequential(_conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, c, k, 1),
                                 nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
            layers += [_Residual(body), nn.ReLU()]
        elif kind == "cat" and c >= 8:
            a = _conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, c // 2, 1, 1)
            b = _conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, c // 2, 3, 1)
            layers.append(_Concat(a, b))
            c = 2 * (c // 2)
        else:
            k = int(rng.choice([1, 3, 3, 5, 7]))
            stride = 2 if hw >= 16 and rng.random() < 0.3 else 1
            groups = int(rng.choice([1, 1, 1, 2, 4])) if c % 4 == 0 else 1
            cout = _ch(rng, c)
            cout -= cout % groups
            layers.append(_conv_bn_act(rng, nn.Conv2d, nn.BatchNorm2d, c, cout, k, stride, groups))
            c, hw = cout, (hw + 2 * (k // 2) - k) // stride + 1
    layers.append(_Head(c, 2))
    return nn.Sequential(*layers), shape, f"image {shape[0]}x{shape[1]}x{shape[2]}, {len(layers)} blocks"


def _sequence(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    n = int(rng.choice([16, 64, 128]))
    d = int(rng.choice([64, 128, 256, 512]))
    layers: list[nn.Module] = []
    for _ in range(int(rng.integers(3, 8))):
        kind = rng.choice(["linear", "norm", "attn", "mlp", "gated"])
        if kind == "linear":
            layers += [nn.Linear(d, d), _act(rng)]
        elif kind == "norm":
            layers.append(nn.LayerNorm(d))
        elif kind == "attn":
            layers += [nn.LayerNorm(d), _Residual(_Attention(d, int(rng.choice([1, 2, 4, 8]))))]
        elif kind == "mlp":
            hidden = d * int(rng.choice([2, 4]))
            layers.append(_Residual(nn.Sequential(nn.Linear(d, hidden), _act(rng), nn.Linear(hidden, d))))
        else:
            layers.append(_Gated(d))
    layers.append(nn.Linear(d, 10))
    return nn.Sequential(*layers), (n, d), f"sequence {n}x{d}, {len(layers)} blocks"


def _volume(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    c = int(rng.choice([3, 8, 16, 32]))
    depth, hw = int(rng.choice([4, 8, 16])), int(rng.choice([14, 28, 56]))
    shape = (c, depth, hw, hw)
    layers: list[nn.Module] = []
    for _ in range(int(rng.integers(3, 7))):
        if rng.random() < 0.2 and depth >= 4 and hw >= 8:
            pool = nn.MaxPool3d if rng.random() < 0.5 else nn.AvgPool3d
            layers.append(pool(2, 2))
            depth, hw = depth // 2, hw // 2
        else:
            k = int(rng.choice([1, 3, 3]))
            stride = 2 if hw >= 16 and depth >= 4 and rng.random() < 0.3 else 1
            cout = _ch(rng, c, hi=128)
            layers.append(_conv_bn_act(rng, nn.Conv3d, nn.BatchNorm3d, c, cout, k, stride))
            c = cout
            depth, hw = (depth + 2 * (k // 2) - k) // stride + 1, (hw + 2 * (k // 2) - k) // stride + 1
    layers.append(_Head(c, 3))
    return nn.Sequential(*layers), shape, f"volume {'x'.join(map(str, shape))}, {len(layers)} blocks"


def _draw(seed: int) -> tuple[nn.Module, tuple[int, ...], str]:
    rng = np.random.default_rng([0x5EED, int(seed)])
    if seed >= synthetic_v5.FIRST_SEED:
        return synthetic_v5.cells(rng)
    if seed >= synthetic_v4.FIRST_SEED:
        return synthetic_v4.encoder(rng)
    if seed >= synthetic_v3.FIRST_SEED:
        return synthetic_v3.sequence(rng)
    if seed >= synthetic_v2.FIRST_SEED:
        return synthetic_v2.image(rng)
    r = rng.random()
    domain = _image if r < 0.6 else _sequence if r < 0.85 else _volume
    return domain(rng)


def spec(seed: int) -> Spec:
    """The synthetic network ``synthetic-<seed>``: its domain, blocks and shapes drawn from ``seed`` (its
    weights, when built, from the caller's seeded RNG, as every zoo model's)."""
    with torch.device("meta"):  # only the shapes are wanted here: no weights allocated, the caller's RNG untouched
        _, shape, what = _draw(seed)
    return Spec(make=lambda: _draw(seed)[0], input_shapes=(shape,), description=f"synthetic {what}")
