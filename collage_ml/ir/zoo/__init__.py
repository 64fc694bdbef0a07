"""Model zoo: the networks of the Collage evaluation (Jeon et al., PACT 2022), in plain torch.

Each family has a full-size variant with the paper's shapes (e.g. ``"resnet50"``) and a
``-tiny`` variant (e.g. ``"resnet50-tiny"``) with the same kinds of operators but few
channels/layers and small inputs, cheap enough for unit tests. Weights are random but
seeded; BatchNorm statistics are seeded and calibrated so activations stay O(1)
(see :func:`collage_ml.ir.zoo._common.calibrate_batchnorm`). Every module is returned
in eval mode with float32 example inputs.

>>> model, (x,) = build("resnet50-tiny", batch=2, seed=0)
>>> model(x).shape
torch.Size([2, 10])
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch

from ...errors import UnknownModelError
from . import bert, dcgan, mobilenet, nasnet, nasrnn, resnet, resnet3d, resnext, synthetic
from ._common import Spec, instantiate

__all__ = ["ZooEntry", "names", "get", "entries", "build"]

# family name -> module with FULL and TINY specs, in the Collage paper's order.
_FAMILIES = {
    "bert": bert,
    "dcgan": dcgan,
    "nasnet": nasnet,
    "resnext50": resnext,
    "resnet3d50": resnet3d,
    "resnet50": resnet,
    "mobilenetv2": mobilenet,
    "nasrnn": nasrnn,
}

TINY_SUFFIX = "-tiny"


@dataclass(frozen=True)
class ZooEntry:
    """One buildable zoo model."""

    name: str  # e.g. "resnet50" or "resnet50-tiny"
    family: str  # e.g. "resnet50" (same for the tiny variant)
    description: str  # one line, incl. the input shape at batch 1
    tiny: bool

    def build(self, batch: int = 1, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        """Returns (module in eval mode, example inputs with the given batch), seeded and deterministic.

        Raises ValueError if ``batch`` is not a positive integer.
        """
        return instantiate(_SPECS[self.name], batch, seed)


def _register() -> tuple[dict[str, ZooEntry], dict[str, Spec]]:
    entries_: dict[str, ZooEntry] = {}
    specs: dict[str, Spec] = {}
    for family, module in _FAMILIES.items():
        for tiny, spec in ((False, module.FULL), (True, module.TINY)):
            name = family + TINY_SUFFIX if tiny else family
            entries_[name] = ZooEntry(name, family, spec.description, tiny)
            specs[name] = spec
    return entries_, specs


_ENTRIES, _SPECS = _register()
#: synthetic networks drawn so far (their specs join ``_SPECS``); never listed by :func:`names`
_SYNTHETIC: dict[str, ZooEntry] = {}


def entries(include_tiny: bool = True) -> list[ZooEntry]:
    """All zoo entries (full-size first, in the paper's order, then the tiny ones)."""
    full = [e for e in _ENTRIES.values() if not e.tiny]
    return full + [e for e in _ENTRIES.values() if e.tiny] if include_tiny else full


def names(include_tiny: bool = True) -> list[str]:
    """Names of all zoo models, ordered as :func:`entries`."""
    return [e.name for e in entries(include_tiny)]


def get(name: str) -> ZooEntry:
    """The entry called ``name`` (a zoo model, or ``synthetic-<seed>``: :mod:`.synthetic`); raises
    UnknownModelError listing valid names and close matches."""
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        pass
    seed = synthetic.seed_of(name)
    if seed is not None:
        if name not in _SYNTHETIC:
            _SPECS[name] = synthetic.spec(seed)
            _SYNTHETIC[name] = ZooEntry(name, synthetic.FAMILY, _SPECS[name].description, False)
        return _SYNTHETIC[name]
    valid = names()
    close = difflib.get_close_matches(str(name), valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownModelError(
        f"unknown zoo model {name!r}.{hint} Valid names: {', '.join(valid)}, or synthetic-<seed>") from None


def build(name: str, batch: int = 1, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``get(name).build(batch, seed)``."""
    return get(name).build(batch, seed)
