"""The cost-model interface, artifacts on disk, and the shipped defaults.

A :class:`CostModel` predicts a candidate's latency on a hardware descriptor
without running it:

- ``fit(dataset)`` trains from scratch on a :class:`~collage_ml.models.dataset.Dataset`;
- ``update(new)`` folds in new measurements (each implementation documents how);
- ``predict(candidates) -> (mean, uncertainty)``: ``mean`` is the predicted
  latency in seconds, ``uncertainty`` the standard deviation of the predicted
  *natural-log* latency, so ``mean * exp(±z * uncertainty)`` is an interval;
- ``save(path)`` / :func:`load_model`.

An artifact is a directory: ``meta.json`` (kind, the featurizer schema
version, parameters, what it was trained on and how often it was updated)
plus the model's own files in XGBoost's JSON format or as a torch
``state_dict`` (loaded with ``weights_only=True``). Nothing is pickled.
Loading refuses an artifact made under another feature schema.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import time
import warnings
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from collage_ml.errors import CollageError, describe
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.schema import SCHEMA_VERSION, check_schema
from collage_ml.models.dataset import Dataset, Sample, items_of

ARTIFACT_FORMAT = "collage-ml-cost-model"
ARTIFACT_VERSION = 1
META = "meta.json"

#: kind -> "module:Class"
KINDS: dict[str, str] = {
    "xgb": "collage_ml.models.xgb:XGBCostModel",
    "gnn": "collage_ml.models.gnn:GNNCostModel",
    "blend": "collage_ml.models.blend:BlendCostModel",
}

#: where the shipped artifacts live: <dir>/<name>/meta.json
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "cost_models"


class ArtifactError(CollageError):
    """A cost-model artifact is missing, unreadable, or of another kind or schema."""


class CostModel(ABC):
    kind: ClassVar[str] = ""
    #: whether predictions read the machine's probe results (the hardware embedding): guided placement then
    #: runs the probe set first on a machine and backend the database has not seen. A model that ignores
    #: the machine (a test fixture) sets it False.
    uses_probes: ClassVar[bool] = True
    #: the fewest new samples an update learns from (``models.feedback`` holds fewer until more arrive): a
    #: model that cannot learn more than one shift of every prediction from a few sets it higher
    min_update: ClassVar[int] = 1

    def __init__(self, **params: Any):
        self.params: dict[str, Any] = dict(params)
        self.meta: dict[str, Any] = {"updates": 0, "trained_on": {}}
        self.hw: HardwareDesc | None = None  # the descriptor candidates are predicted for by default
        self._trained_hw: HardwareDesc | None = None  # ``hw`` as training or loading set it (see predict)
        self._warned_hw = False
        #: what the last :func:`collage_ml.train` call did (samples, sources, held-out metrics); not saved
        self.training: dict[str, Any] = {}

    # -- the interface -------------------------------------------------------------------
    @abstractmethod
    def fit(self, data: Dataset) -> "CostModel": ...

    @abstractmethod
    def update(self, new: Dataset) -> dict[str, Any]:
        """Fold in new measurements; returns what was done (e.g. ``{"mode": "continue", "n": 12}``)."""

    @abstractmethod
    def predict_log(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of the natural-log latency in seconds, per sample."""

    @abstractmethod
    def _save_payload(self, directory: Path) -> dict[str, Any]:
        """Write the model's files into ``directory``; return extra metadata to store."""

    @abstractmethod
    def _load_payload(self, directory: Path, meta: dict[str, Any]) -> None: ...

    # -- shared --------------------------------------------------------------------------
    def predict(self, candidates: Sequence[Any], hw: HardwareDesc | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(latency seconds, log-space std) per Candidate or Sample.

        A Sample carries its machine. A Candidate is predicted for ``hw``; without it, for ``self.hw``, which
        training sets to the machine most of the training rows came from, not necessarily this one. That
        case warns once per model, naming the machine: pass the descriptor of the machine to predict for
        (:func:`collage_ml.featurize.hardware.calibrated` measures this one's probes), or set ``self.hw``."""
        if not len(candidates):
            return np.zeros(0), np.zeros(0)
        if hw is None and self.hw is not None and self.hw is self._trained_hw and not self._warned_hw:
            if any(not isinstance(c, Sample) for c in candidates):
                self._warned_hw = True
                warnings.warn(f"{self.kind} cost model: predicting candidates for {self.hw.describe()}, the machine "
                              f"most of its training rows came from; pass hw= for the machine to predict for",
                              stacklevel=2)
        hw = hw or self.hw or HardwareDesc.current()
        mu, sd = self.predict_log(items_of(candidates, hw))
        return np.exp(mu), sd

    def _record_fit(self, data: Dataset) -> None:
        if not len(data):
            raise ValueError("cannot fit a cost model on an empty dataset")
        fps = sorted({s.hardware for s in data if s.hardware})
        hws = [s.hw for s in data]
        self.hw = self._trained_hw = max(set(hws), key=hws.count)
        self.meta["trained_on"] = {
            "n": len(data),
            "sources": data.sources(),
            "backends": sorted({s.backend for s in data}),
            "hardware": fps,
            "subgraphs": len({s.info.hash for s in data}),
        }
        self.meta["fitted_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")

    def _record_update(self, n: int) -> None:
        self.meta["updates"] = int(self.meta.get("updates", 0)) + 1
        self.meta.setdefault("update_samples", 0)
        self.meta["update_samples"] += n

    def save(self, path: str | Path) -> Path:
        """Writes the artifact directory ``path`` atomically: everything goes into a temporary sibling
        folder, which then replaces ``path`` by a rename, so a reader (or a later run after a kill
        mid-save) sees the old artifact or the new one, never a mix or a half-written one."""
        d = Path(path)
        d.parent.mkdir(parents=True, exist_ok=True)
        if d.exists() and not d.is_dir():
            raise ArtifactError(f"{d} exists and is not a directory; cannot save a cost model there")
        if d.is_dir() and not _replaceable(d):
            raise ArtifactError(f"{d} is a folder with other files, not a cost-model artifact; save to a new folder")
        for stale in [*d.parent.glob(f".{d.name}.tmp-*"), *d.parent.glob(f".{d.name}.old-*")]:
            if not _pid_alive(stale.name.rsplit("-", 1)[-1]):  # left by a save that was killed
                shutil.rmtree(stale, ignore_errors=True)
        tmp = d.parent / f".{d.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            extra = self._save_payload(tmp)
            meta = {
                "format": ARTIFACT_FORMAT,
                "format_version": ARTIFACT_VERSION,
                "kind": self.kind,
                "schema_version": SCHEMA_VERSION,
                "params": self.params,
                "hw": None if self.hw is None else self.hw.to_json(),
                **{k: v for k, v in self.meta.items() if k not in ("format", "kind", "schema_version", "params", "hw")},
                **extra,
            }
            (tmp / META).write_text(json.dumps(meta, indent=1, sort_keys=True, default=_json_default))
            _fsync_dir(tmp)
            _swap_in(tmp, d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return d

    def __repr__(self) -> str:
        n = self.meta.get("trained_on", {}).get("n")
        return f"{type(self).__name__}(trained on {n} samples, {self.meta.get('updates', 0)} updates)"


def _replaceable(d: Path) -> bool:
    """Is the folder ``d`` empty or an artifact (whole or damaged), so a save may replace it?"""
    import fnmatch

    names = [p.name for p in d.iterdir()]
    return META in names or all(any(fnmatch.fnmatch(n, pat) for pat in _ARTIFACT_FILES) for n in names)


_ARTIFACT_FILES = (META, META + ".tmp", "member-*.json", "*.pt", "member-[0-9]*-*")


def _pid_alive(text: str) -> bool:
    try:
        os.kill(int(text), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fsync_dir(d: Path) -> None:
    """Flushes the files of ``d`` and the folder itself to disk (best effort)."""
    for f in [*d.iterdir(), d]:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _swap_in(new: Path, dest: Path) -> None:
    """Replaces the folder ``dest`` with the folder ``new`` by renames. Without an old ``dest`` this is one
    atomic rename; with one, the old folder is renamed aside first and removed after, so between the two
    renames (microseconds) ``dest`` is absent, which readers treat as "no updated model yet"."""
    if not dest.exists():
        os.replace(new, dest)
        return
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(dest, old)
    try:
        os.replace(new, dest)
    except BaseException:
        os.replace(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def read_meta(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"no cost-model artifact at {p}")
    f = p / META if p.is_dir() else p
    if f.name != META or not f.exists():
        raise ArtifactError(f"{p} is not a collage-ml cost-model artifact (no {META}); train one with `collage-ml train`")
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{f} is not readable JSON ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
        raise ArtifactError(f"{f} is not a collage-ml cost-model artifact")
    return meta


def model_class(kind: str) -> type[CostModel]:
    if kind not in KINDS:
        raise ArtifactError(f"unknown cost-model kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}")
    mod, cls = KINDS[kind].split(":")
    return getattr(importlib.import_module(mod), cls)


def check_params(owner: str, params: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """ValueError naming every parameter of ``params`` that ``owner`` (a cost model's class) does not have."""
    unknown = set(params) - set(defaults)
    if unknown:
        raise ValueError(f"unknown {owner} parameter(s): {', '.join(sorted(unknown))}; known: {', '.join(defaults)}")


def create_model(kind: str, **params: Any) -> CostModel:
    return model_class(kind)(**params)


def parse_default(spec: Any) -> tuple[bool, str | None]:
    """Whether ``spec`` names a shipped model, and which kind: ``"default"`` -> (True, None), ``"default:KIND"``
    -> (True, KIND) (ArtifactError if KIND is unknown), anything else (a path) -> (False, None)."""
    text = str(spec)
    if text == "default":
        return True, None
    if not text.startswith("default:"):
        return False, None
    kind = text.split(":", 1)[1]
    if kind not in KINDS:
        raise ArtifactError(f"unknown cost-model kind {kind!r} in {text!r}; use default or default:KIND with KIND one "
                            f"of {', '.join(KINDS)}")
    return True, kind


def load_model(path: str | Path) -> CostModel:
    """Load an artifact directory (or ``"default"``: the shipped one for this machine; ``"default:KIND"``: the
    shipped one of that kind, e.g. ``"default:blend"``)."""
    shipped, kind = parse_default(path)
    if shipped:
        path = default_artifact(kind)
    p = Path(path)
    meta = read_meta(p)
    directory = p if p.is_dir() else p.parent
    check_schema(meta.get("schema_version"), f"cost model {directory}")
    cls = model_class(str(meta.get("kind")))
    try:
        model = cls(**(meta.get("params") or {}))
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"cost model {directory} has parameters this collage-ml does not accept: {e}") from None
    hw = meta.get("hw")
    try:
        model.hw = model._trained_hw = HardwareDesc.from_json(hw) if hw else None
    except ValueError as e:
        raise ArtifactError(f"cost model {directory}: meta.json's hw is not a hardware descriptor ({e})") from None
    model.meta = {k: v for k, v in meta.items() if k not in ("format", "format_version", "kind", "schema_version", "params", "hw")}
    try:
        model._load_payload(directory, meta)
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(f"cost model {directory} is damaged: {describe(e)}") from None
    return model


def shipped_artifacts() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    if SHIPPED_DIR.is_dir():
        for d in sorted(SHIPPED_DIR.iterdir()):
            try:
                out.append((d, read_meta(d)))
            except ArtifactError:
                continue
    return out


def default_artifact(kind: str | None = None, threads: int | None = None) -> Path:
    """The shipped artifact to use on this machine.

    The models take the machine as input (static description and probes: see
    :mod:`collage_ml.featurize.hardware`), so one trained on other CPUs still
    applies. Preference: trained on this exact hardware fingerprint; else trained
    on the same kind of device (CPU only, or with a GPU); xgb before blend before
    gnn. (The blend ranks a family the model has not seen at least as well on a
    machine it knows, better on the Xeon, but not on a machine it does not know,
    and in ``make demo`` it cost a whole-model timing more for the same plan:
    docs/results/cost-models.md, "A blend of XGBoost and the GNN".) ``kind`` restricts to one kind.
    Raises :class:`ArtifactError` naming the fingerprint when nothing fits.
    """
    from collage_ml.measure.hardware import fingerprint
    from collage_ml.paths import default_threads

    t = threads or default_threads()
    fp = fingerprint(t)
    here = HardwareDesc.current(t)
    arts = [(p, m) for p, m in shipped_artifacts() if kind is None or m.get("kind") == kind]
    order = {"xgb": 0, "blend": 1, "gnn": 2}
    arts.sort(key=lambda pm: order.get(str(pm[1].get("kind")), 9))
    for p, m in arts:
        if fp in (m.get("trained_on") or {}).get("hardware", []):
            return p
    for p, m in arts:
        hw = m.get("hw")
        if isinstance(hw, dict) and bool(hw.get("gpu")) == here.gpu:
            return p
    have = ", ".join(p.name for p, _ in arts) or "none"
    raise ArtifactError(
        f"no shipped cost model fits this machine (fingerprint {fp}, {here.cores} cores, {here.threads} threads"
        f"{', GPU' if here.gpu else ''}); shipped: {have}. Train one: collage-ml collect, then "
        "collage-ml train --db DB --model xgb -o ARTIFACT"
    )
