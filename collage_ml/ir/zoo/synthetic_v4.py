"""The fourth vocabulary of synthetic networks (seeds from :data:`FIRST_SEED` on): transformer encoders.

The first vocabulary's sequence networks (:mod:`.synthetic`) draw pre-norm blocks among others: the
residual stream bypasses each LayerNorm, and a block's width is 64 to 512 in powers of two. The encoders
most models ship (the original Transformer, BERT and its descendants) are post-norm: every attention and
feed-forward sub-layer ends in ``LayerNorm(x + sublayer(x))``, whose output is the residual stream the next
sub-layer and its residual Add both read. On the Zen 3 at 2 threads, the bert fold of leave-one-family-out
missed the backend choice most on residual Add + LayerNorm regions at batch 2 to 16, where ONNX Runtime ran
1.9x slower than OpenVINO, and the machine's synthetic rows held 27 such pairs (docs/results/cost-models.md,
"Sequence and volume networks at batch 1 on the Zen 3").

This vocabulary draws encoders of 1 to 3 layers, post-norm in most and pre-norm in the rest, with separate
or fused query/key/value projections, 2 to 16 heads of 16 to 64 channels (widths 32 to 768 that need not be
powers of two), feed-forward widths 2x to 4x with a drawn activation (GELU exact or tanh-approximated,
ReLU), drawn LayerNorm epsilons, sequences of 8 to 128 tokens, and a linear head on every token. The
shapes are drawn, not any zoo model's. Frozen once a dataset names its seeds; a new block kind belongs in a
fifth vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

FIRST_SEED = 3000

#: tokens x width at most this, so one network at batch 16 stays a few hundred milliseconds on 2 cores
MAX_TOKENS_X_WIDTH = 48 * 1024


class _SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, fused: bool, bias: bool):
        super().__init__()
        self.heads, self.fused = heads, fused
        if fused:
            self.qkv = nn.Linear(d, 3 * d, bias=bias)
        else:
            self.q, self.k, self.v = (nn.Linear(d, d, bias=bias) for _ in range(3))
        self.out = nn.Linear(d, d, bias=bias)

    def forward(self, x):
        b, n, d = x.shape
        hd = d // self.heads
        if self.fused:
            q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = (f(x).reshape(b, n, self.heads, hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        w = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, n, d))


class _EncoderLayer(nn.Module):
    """``LayerNorm(x + attn(x))`` then ``LayerNorm(x + ffn(x))`` (post-norm), or ``x + attn(LayerNorm(x))`` and
    ``x + ffn(LayerNorm(x))`` (pre-norm)."""

    def __init__(self, d: int, heads: int, ffn: int, act: nn.Module, eps: float, norm_first: bool, fused: bool,
                 bias: bool):
        super().__init__()
        self.norm_first = norm_first
        self.attn = _SelfAttention(d, heads, fused, bias)
        self.ffn = nn.Sequential(nn.Linear(d, ffn), act, nn.Linear(ffn, d))
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)

    def forward(self, x):
        if self.norm_first:
            x = x + self.attn(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.ffn(x))


_ACTS = {"gelu": lambda: nn.GELU(), "gelu-tanh": lambda: nn.GELU(approximate="tanh"), "relu": lambda: nn.ReLU()}


def encoder(rng) -> tuple[nn.Module, tuple[int, ...], str]:
    """A transformer encoder drawn from ``rng``: (module, input shape without the batch, description)."""
    heads = int(rng.choice([2, 3, 4, 6, 8, 12, 16]))
    head_dim = int(rng.choice([16, 24, 32, 48, 64]))
    while heads * head_dim > 768:
        heads //= 2
    d = heads * head_dim
    n = int(rng.choice([8, 16, 24, 32, 48, 64, 96, 128]))
    while n > 8 and n * d > MAX_TOKENS_X_WIDTH:
        n //= 2
    ffn = d * int(rng.choice([2, 3, 4]))
    act = str(rng.choice(list(_ACTS)))
    eps = float(rng.choice([1e-5, 1e-6, 1e-12]))
    norm_first = bool(rng.random() < 0.3)
    fused = bool(rng.random() < 0.5)
    bias = bool(rng.random() < 0.85)
    layers = int(rng.integers(1, 4))
    blocks = [_EncoderLayer(d, heads, ffn, _ACTS[act](), eps, norm_first, fused, bias) for _ in range(layers)]
    head = nn.Linear(d, int(rng.choice([2, 10, 32])))
    model = nn.Sequential(*blocks, *([nn.LayerNorm(d, eps=eps)] if norm_first else []), head)
    what = (f"encoder {'pre' if norm_first else 'post'}-norm, {layers} layers, {n}x{d}, {heads} heads, "
            f"ffn {ffn} {act}, qkv {'fused' if fused else 'separate'}{'' if bias else ', no bias'}, eps {eps:g}")
    return model, (n, d), what
