"""The one feedback loop: measurements made by ``place`` (and ``collect``) update the cost model.

Every measurement is committed to the database by the Runner as it arrives,
inside the tuner's one measure step (:meth:`collage_ml.search.tuner.Tuner.measure`),
which hands each new one to a :class:`Feedback`. It collects those (candidate,
measurement) pairs and, on :meth:`Feedback.flush`, passes the
valid ones to :meth:`CostModel.update <collage_ml.models.base.CostModel.update>`
and saves the updated model *next to the database*, at
``<db folder>/cost-models/<fingerprint>-<kind>``. The next run that asks for
``cost_model="default"`` with that database loads it in preference to the
shipped artifact. A user's own artifact path is never overwritten.

Fewer valid new samples than the model's ``min_update`` are held, not learnt
from, until a later flush brings enough (they are in the database either way):
guided placement measures two to ten candidates of most models, and from so few
an XGBoost update learns only a shift of every prediction.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from collage_ml.errors import first_line

from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.models.base import KINDS, CostModel, load_model, parse_default
from collage_ml.models.dataset import Dataset


def updated_path(db_path: str | Path, fingerprint: str, kind: str) -> Path:
    return Path(db_path).absolute().parent / "cost-models" / f"{fingerprint}-{kind}"


def resolve_cost_model(spec: Any, db_path: str | Path | None, fingerprint: str) -> tuple[CostModel, str, Path | None]:
    """(model, where it came from, where updates are saved).

    ``spec``: a :class:`CostModel`, an artifact path, ``"default"`` (the
    updated model next to ``db_path`` if there is one for this fingerprint,
    else the shipped artifact that fits this machine) or ``"default:KIND"``
    (the same, of that kind only: ``"default:blend"``).
    """
    if isinstance(spec, CostModel):
        return spec, "given", (updated_path(db_path, fingerprint, spec.kind) if db_path is not None else None)
    shipped, kind_only = (True, None) if spec is None else parse_default(spec)
    if shipped:  # "default" (or None) or "default:KIND"
        for kind in (KINDS if kind_only is None else (kind_only,)) if db_path is not None else ():
            p = updated_path(db_path, fingerprint, kind)
            if not p.exists():
                continue
            try:
                return load_model(p), str(p), p
            except Exception as e:  # damaged (e.g. an older collage-ml killed mid-save): the next save replaces it
                _warn_once(p, f"collage-ml: warning: the updated cost model {p} does not load ({first_line(e)}); "
                              "using the shipped model, and saving the next update over it")
        model, source = load_model(spec or "default"), "shipped default" + (f" ({kind_only})" if kind_only else "")
    else:
        model, source = load_model(spec), str(spec)
    return model, source, (updated_path(db_path, fingerprint, model.kind) if db_path is not None else None)

_WARNED: set[str] = set()


def _warn_once(path: Path, text: str) -> None:
    """One line on stderr, once per process and path (a guided run resolves its model more than once)."""
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        print(text, file=sys.stderr)


class Feedback:
    def __init__(self, model: CostModel, save_to: Path | None, hw: HardwareDesc):
        self.model = model
        self.save_to = save_to
        self.hw = hw
        self.pairs: list[tuple[Any, Any]] = []
        self.held: list = []  # valid samples of earlier flushes, fewer than the model's ``min_update``
        self.updates = 0
        self.samples = 0

    def add(self, pairs: Sequence[tuple[Any, Any]]) -> None:
        self.pairs.extend(pairs)

    def flush(self, family: str = "") -> dict[str, Any] | None:
        """Updates and saves the model with what was added since the last flush (and what earlier flushes held);
        None when nothing was learnt: nothing valid was added, or fewer samples than the model's ``min_update``
        are at hand (they are held for the next flush)."""
        data = Dataset(self.held + list(Dataset.from_candidates(self.pairs, self.hw, family).samples))
        self.pairs = []
        if len(data) < max(1, int(getattr(self.model, "min_update", 1))):
            self.held = list(data.samples)
            return None
        self.held = []
        info = self.model.update(data)
        self.updates += 1
        self.samples += len(data)
        if self.save_to is not None:
            self.model.save(self.save_to)
        return {**(info or {}), "saved_to": None if self.save_to is None else str(self.save_to)}
