"""A blend of cost models: the mean of their log-latency predictions.

XGBoost and the GNN err differently on a family they have not seen: the trees
fit the latency's level better (lower MAPE), the graph network the order of
a subgraph's backends (lower backend-choice regret). Their blend, the mean
of the two log predictions (a geometric mean of the latencies), kept the
better of the two on most metrics of leave one family out on the Xeon
(docs/results/cost-models.md, "A blend of XGBoost and the GNN"; ``benchmarks/cost_model.py --blend``).

``predict_log`` returns the members' mean and the standard deviation of
their equal-weight mixture,

    std = sqrt(mean(std_i**2) + mean(mu_i**2) - mean(mu_i)**2)

so a blend is at least as unsure as its members on average, and more where
they disagree. ``fit`` and ``update`` fit and update every member on the same
rows (each by its own policy); the artifact holds each member as an artifact
of its own, in a sub-folder ``member-<i>-<kind>`` named in ``meta.json``.
Loading resolves each member's kind through the registry
(:data:`~collage_ml.models.base.KINDS`) like any artifact; a member may not be
a blend itself, and a sub-folder name must be a plain name, never a path.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from collage_ml.models.base import KINDS, ArtifactError, CostModel, check_params, create_model, load_model
from collage_ml.models.dataset import Dataset, Sample

DEFAULTS: dict[str, Any] = {"members": ["xgb", "gnn"], "member_params": {}}
_MEMBER_DIR = re.compile(r"^member-(\d+)-([a-z0-9_]+)$")


class BlendCostModel(CostModel):
    """The mean of several cost models' log predictions; see the module docstring."""

    kind = "blend"
    min_update = 16  # its XGBoost member's (``XGBCostModel.min_update``)

    def __init__(self, **params: Any):
        check_params("BlendCostModel", params, DEFAULTS)
        super().__init__(**{**DEFAULTS, **params})
        kinds = self.params["members"]
        if not isinstance(kinds, list) or len(kinds) < 2 or not all(isinstance(k, str) for k in kinds):
            raise ValueError(f"members must name two or more cost-model kinds, got {kinds!r}")
        bad = [k for k in kinds if k not in KINDS or k == self.kind]
        if bad:
            raise ValueError(f"a blend's members must be of the kinds {', '.join(k for k in KINDS if k != self.kind)}; "
                             f"got {', '.join(map(repr, bad))}")
        per = self.params["member_params"]
        if not isinstance(per, dict) or any(k not in kinds for k in per):
            raise ValueError(f"member_params maps a member kind to its parameters, got {per!r}")
        self.members: list[CostModel] = []

    @classmethod
    def of(cls, members: Sequence[CostModel]) -> "BlendCostModel":
        """A blend of models fitted already (e.g. two shipped artifacts trained on the same rows)."""
        models = list(members)
        blend = cls(members=[m.kind for m in models], member_params={m.kind: dict(m.params) for m in models})
        blend.members = models
        blend.hw = blend._trained_hw = next((m.hw for m in models if m.hw is not None), None)
        blend.meta["trained_on"] = dict(models[0].meta.get("trained_on") or {})
        blend.meta["fitted_at"] = models[0].meta.get("fitted_at")
        return blend

    def _new_members(self) -> list[CostModel]:
        per = self.params["member_params"]
        return [create_model(k, **dict(per.get(k) or {})) for k in self.params["members"]]

    # -- the interface ----------------------------------------------------------------------
    def fit(self, data: Dataset) -> "BlendCostModel":
        self._record_fit(data)
        self.members = [m.fit(data) for m in self._new_members()]
        return self

    def update(self, new: Dataset) -> dict[str, Any]:
        if not self.members:
            self.fit(new)
            return {"mode": "fit", "n": len(new)}
        infos = [m.update(new) for m in self.members]
        self._record_update(len(new))
        return {"mode": "blend", "n": len(new), "members": infos}

    def predict_log(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        if not self.members:
            raise RuntimeError("the blend is not fitted")
        outs = [m.predict_log(samples) for m in self.members]
        mus = np.stack([np.asarray(mu, dtype=np.float64) for mu, _ in outs])
        sds = np.stack([np.asarray(sd, dtype=np.float64) for _, sd in outs])
        mu = mus.mean(axis=0)
        var = (sds**2).mean(axis=0) + (mus**2).mean(axis=0) - mu**2
        return mu, np.sqrt(np.maximum(var, 0.0))

    def _save_payload(self, directory: Path) -> dict[str, Any]:
        names = []
        for i, m in enumerate(self.members):
            name = f"member-{i}-{m.kind}"
            m.save(directory / name)
            names.append(name)
        return {"member_dirs": names}

    def _load_payload(self, directory: Path, meta: dict[str, Any]) -> None:
        names = meta.get("member_dirs")
        kinds = self.params["members"]
        if not isinstance(names, list) or len(names) != len(kinds):
            raise ArtifactError(f"cost model {directory}: meta.json's member_dirs does not list its {len(kinds)} members")
        members = []
        for i, (name, kind) in enumerate(zip(names, kinds)):
            m = _MEMBER_DIR.match(name) if isinstance(name, str) else None
            if m is None or int(m.group(1)) != i or m.group(2) != kind:
                raise ArtifactError(f"cost model {directory}: member {i} is {name!r}, not member-{i}-{kind}")
            if not (directory / name).is_dir():
                raise ArtifactError(f"cost model {directory} is incomplete: its member folder {name} is missing")
            sub = load_model(directory / name)
            if sub.kind != kind:
                raise ArtifactError(f"cost model {directory}: {name} holds a {sub.kind} model, not {kind}")
            members.append(sub)
        self.members = members
