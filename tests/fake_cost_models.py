"""Cost models for tests (fixtures, not for users): predictions from a formula or a table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from collage_ml.models.base import CostModel


class FlopsFixtureModel(CostModel):
    """Latency = overhead + FLOPs / speed, the same for every backend, with a fixed log-space uncertainty.

    ``update`` records the samples it saw (so tests can check the feedback loop) and moves ``overhead``
    towards the median measured latency of small subgraphs.
    """

    kind = "fixture"
    uses_probes = False  # the formula ignores the machine

    def __init__(self, overhead: float = 2e-5, speed: float = 2e10, sd: float = 0.3, invert: bool = False):
        super().__init__(overhead=overhead, speed=speed, sd=sd, invert=invert)
        self.seen: list[tuple[str, str, float]] = []

    def _mean(self, s) -> float:
        flops = float(s.info.node_values[:, 0].sum())
        t = self.params["overhead"] + flops / self.params["speed"]
        return 1e-9 / t if self.params["invert"] else t

    def fit(self, data):
        self._record_fit(data)
        return self

    def update(self, new):
        self.seen.extend((s.info.hash, s.backend, s.latency) for s in new)
        self._record_update(len(new))
        return {"mode": "record", "n": len(new)}

    def predict_log(self, samples):
        mu = np.log([self._mean(s) for s in samples])
        return mu, np.full(len(samples), float(self.params["sd"]))

    def _save_payload(self, directory: Path) -> dict:
        (directory / "seen.json").write_text(json.dumps(self.seen))
        return {}

    def _load_payload(self, directory: Path, meta: dict) -> None:
        self.seen = [tuple(x) for x in json.loads((directory / "seen.json").read_text())]
