"""XGBoost cost model: an ensemble of gradient-boosted trees on flat feature rows.

Objective
    Each member regresses the natural log of the latency in seconds
    (``reg:squarederror`` on :meth:`Dataset.y`) from the fixed-length rows of
    :func:`~collage_ml.featurize.flat.flat_matrix` (subgraph analysis, backend
    one-hot, hardware descriptor). Squared error in log space is relative error
    in latency, so a 10 µs elementwise op and a 100 ms convolution weigh alike.
    Under the default target (``roofline``, below) the trees fit that log
    latency on top of a per-row base margin, the roofline estimate.

Uncertainty
    ``n_members`` boosters are trained on bootstrap resamples *of subgraphs*
    (all backends of one subgraph are drawn together, so the resample is
    honest about which structures were seen), each with its own seed for row
    and column subsampling. ``predict_log`` returns the members' mean and

        std = sqrt(var_members + noise_std**2)

    ``var_members`` (ddof=1) is the disagreement between members, the part that
    grows away from the training data. ``noise_std`` is a sample-independent
    floor: the members' median *out-of-bag* RMS error of the log latency
    (each member's error on the subgraphs its bootstrap left out) times
    ``noise_scale``, never below ``min_std``. It keeps the std strictly
    positive, and puts it on the scale of the errors the model makes on
    unseen subgraphs of seen families. It is stored in ``meta.json``. (With a
    single member there is no bootstrap and no out-of-bag error: the std is
    ``min_std``.) Trees extrapolate flat, so the members' spread grows only
    modestly far from the training data: on held-out model families it was
    1.5-4x the spread on training data, while the error grew far more; read the
    std as a lower bound out of distribution.

Update policy (MetaSchedule-style)
    The training data is kept in memory (``self._train``). ``update(new)``
    appends ``new`` to it; when the samples added since the last full fit
    reach ``retrain_fraction`` x the size of that fit, every member is refit
    from scratch on all kept data (mode ``"retrain"``). Otherwise each member
    boosts ``update_rounds`` more trees (XGBoost ``xgb_model=`` continuation)
    on the new samples mixed with a random replay sample of older kept data
    (``replay_ratio`` x ``len(new)`` samples), so it learns what is new
    without forgetting the rest (mode ``"continue"``). A model loaded from
    disk keeps no training data: its updates always continue (it never refits
    from scratch, which would drop what the loaded boosters know), the first on
    the new samples alone; the samples it is given are kept from then on, so
    later updates replay what was added since the load.
    Updating a model that was never fitted fits it.

Targets (``target``)
    ``"log"`` regresses the log latency itself. The two roofline targets
    regress it relative to an estimate that the probes give on the sample's
    machine (:mod:`~collage_ml.featurize.roofline`): each row's XGBoost
    ``base_margin`` is a log estimate, so the trees learn log(latency /
    estimate), which moves less between machines than the latency.
    ``"roofline"`` takes the estimate of the candidate's own backend
    (``roof_log_est``); ``"roofline-mean"`` takes the mean over the machine's
    probed backends of their log estimates
    (:func:`~collage_ml.featurize.flat.machine_log_estimates`), one scale for
    the machine whichever backend runs the candidate, so that the order of the
    backends is the trees' to learn and one backend's noisy probes do not move
    it. Rows of machines without probes have no estimate; their margin is the
    mean log latency of such rows in the training set
    (``meta["margin_fallback"]``), and the trees tell them apart by the
    missing probe columns.

    Trees do not extrapolate: on a CPU kind slower than every machine in
    training, a ``log`` model predicts large kernels too fast, and the guided
    loop chases finer plans that only look faster. A margin carries the
    probes' scale into the prediction linearly. ``benchmarks/guided_replay.py
    --without``, each CPU kind left out of training: ``log`` measured 9.9% of
    the Zen 4's candidates and 1.0% of the Zen 5's; ``roofline`` and
    ``roofline-mean`` measured 1.0% of both, with the same plans. In
    ``benchmarks/cost_model.py``'s CPU-kind-out folds ``roofline`` lost 2 to 3
    points of pairwise accuracy against ``log``; ``roofline-mean`` did not
    (docs/results/cost-models.md, "A cost model that knows the machine"). ``"roofline-mean"`` is
    the default since 2026-12-03 (``"roofline"`` from 2026-12-02). Where the
    backends' speeds part ways between machines (one backend faster on the new
    machine, another not), the mean carries only part of each backend's
    scale; the probe columns are there for the trees to learn the rest.

Backend order (``ranker``)
    Next to the regressors, one booster learns XGBoost's ``rank:pairwise``
    objective within "same subgraph, which backend" groups (one query id per
    subgraph and machine measured on two or more backends; grade = rank by
    speed). At prediction, the samples of one call that share a subgraph and a
    machine keep the values each regressor gave them, reassigned in the order
    of ``log latency - ranker_weight x ranker score``: the regressors set the
    level the DP sums, and the ranker moves a backend ahead where it is sure
    (its score gaps are log-odds; where it cannot tell two backends apart, the
    regressors' order stands). ``benchmarks/target_study.py`` (one member,
    Zen 5 family 26 model 2, 2026-12-01): weight 0.1 raised backend pairwise
    accuracy on every protocol (leave-one-family-out on cpu-2core-zen5
    0.828 -> 0.834; each machine held out: Zen 5 t2 0.790 -> 0.807, Zen 5 t1
    0.862 -> 0.880, Zen 4 t2 0.724 -> 0.734, Zen 4 t1 0.848 -> 0.854), with
    backend regret within half a point either way; the ranker's order alone
    (a large weight) lost on the Zen 4 at 1 thread, which has no probes.
    ``ranker=False`` turns it off; artifacts saved without one predict with
    the regressors alone.

Artifact: ``member-<i>.json`` per booster (XGBoost's JSON model format; nothing
is pickled) next to the shared ``meta.json``. Loading refuses an artifact whose
feature names differ from :data:`~collage_ml.featurize.flat.FEATURES`.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import xgboost as xgb

from collage_ml.featurize.flat import FEATURES, ROOF_EST, flat_matrix, machine_log_estimates
from collage_ml.models.base import ArtifactError, CostModel, check_params
from collage_ml.models.dataset import Dataset, Sample

#: Defaults, chosen on datasets/cpu-2core-zen4 (10,121 samples) holding out the families {bert, nasrnn, dcgan},
#: {resnet50, mobilenetv2} and {nasnet, resnet3d50} in turn. Shallow trees with a fairly high learning rate
#: carried over to unseen families best: depth 4, 800 trees, eta 0.1 gave MAPE 0.250, within-subgraph pairwise
#: backend order 0.729, best-backend hit rate 0.644 (depth 8 / 400 trees / eta 0.05: 0.265, 0.721, 0.634;
#: depth 6 / 400 / 0.05: 0.260, 0.719, 0.626; a fixed backend order: 0.63 pairwise). The full set fits in
#: about 4 s on 2 cores. ``update_rounds`` 50 with ``replay_ratio`` 1 learnt a held-out family or 1-thread
#: data from 30 % of it (MAPE 0.30 -> 0.20, 0.31 -> 0.16) while the error on old data rose by under 10 %;
#: without replay it rose 2-5x. With ``noise_scale`` 1 the std (median 0.22) covered 85 % of the log errors on
#: a random 20 % of subgraphs (RMSE 0.20) and 52-69 % on the held-out families (RMSE 0.26-0.42).
#: ``n_jobs`` is 1: on the 2-vCPU machines here, with both cores busy (another job, a test run), XGBoost's
#: OpenMP threads wait on each other: one member on 6,012 samples fitted in 1.2 s with 1 thread and 53 s with 2
#: (Zen 5, family 26 model 2, 2026-12-01, a background collect and other work running).
DEFAULTS: dict[str, Any] = {
    "n_members": 5,
    "n_estimators": 800,
    "max_depth": 4,
    "learning_rate": 0.1,
    "min_child_weight": 2.0,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "seed": 0,
    "retrain_fraction": 0.25,
    "update_rounds": 50,
    "replay_ratio": 1.0,
    "noise_scale": 1.0,
    "min_std": 0.01,
    "n_jobs": 1,
    "target": "roofline-mean",
    "ranker": True,
    "ranker_weight": 0.1,
    "balance": "none",
}
TARGETS = ("log", "roofline", "roofline-mean")
#: ``balance``: "machine" weighs each machine's rows (fingerprint: CPU kind and threads) to the same total, so a
#: machine with several synthetic sets does not outvote the others on what the probes say; "none": every row 1.
#: With other CPU kinds' synthetic sets in training it recovered the Zen 3's backend choice when the Zen 3 was
#: left out (regret 3.8 -> 2.9%; 2.7% without those sets) but not the Xeon's, Zen 4's or Zen 5's
#: (docs/results/cost-models.md, "Leave one CPU kind out, on today's datasets"), so it is not the default.
BALANCES = ("none", "machine")


def machine_weights(samples: Sequence[Sample]) -> np.ndarray:
    """Per sample, ``len(samples) / (machines x its machine's rows)``: every machine (hardware fingerprint) weighs
    the same in all, and the weights average 1."""
    ids: dict[str, int] = {}
    m = np.array([ids.setdefault(s.hardware or "", len(ids)) for s in samples], dtype=np.int64)
    if not len(m):
        return np.ones(0, np.float32)
    per = np.bincount(m)
    return (len(m) / (len(per) * per[m])).astype(np.float32)


class XGBCostModel(CostModel):
    """An ensemble of XGBoost regressors on log latency; see the module docstring."""

    kind = "xgb"
    #: A loaded model keeps no training data, so its first update boosts on the new samples alone; with
    #: ``min_child_weight`` 2 a handful of them cannot be split, and ``update_rounds`` trees then move every
    #: prediction by their mean log error. On the Zen 4 (2026-12-06) two whole-model timings of nasrnn, one
    #: of them Inductor's, 4x its prediction, moved every prediction of the updated model 2.2x.
    min_update = 16

    def __init__(self, **params: Any):
        check_params("XGBCostModel", params, DEFAULTS)
        super().__init__(**{**DEFAULTS, **params})
        if int(self.params["n_members"]) < 1:
            raise ValueError("n_members must be at least 1")
        if self.params["target"] not in TARGETS:
            raise ValueError(f"unknown target {self.params['target']!r}; choose one of {', '.join(TARGETS)}")
        if self.params["balance"] not in BALANCES:
            raise ValueError(f"unknown balance {self.params['balance']!r}; choose one of {', '.join(BALANCES)}")
        self.members: list[xgb.Booster] = []
        self._train: Dataset | None = None  # kept training data (None after load)
        self._n_fit = 0  # size of the last full fit
        self._pending = 0  # samples added since the last full fit
        self.ranker: xgb.Booster | None = None

    # -- training ---------------------------------------------------------------------------
    def _booster_params(self, member: int) -> dict[str, Any]:
        p = self.params
        return {
            "objective": "reg:squarederror",
            "tree_method": "hist",
            "max_depth": int(p["max_depth"]),
            "eta": float(p["learning_rate"]),
            "min_child_weight": float(p["min_child_weight"]),
            "subsample": float(p["subsample"]),
            "colsample_bytree": float(p["colsample_bytree"]),
            "seed": int(p["seed"]) * 1009 + member,
            "nthread": int(p["n_jobs"]),
            "verbosity": 0,
        }

    def _features(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray | None]:
        """The feature rows, and each row's log estimate under a roofline target (None under ``log``; NaN
        where the machine has no probes)."""
        X = flat_matrix([(s.info, s.backend, s.hw) for s in samples])
        target = self.params["target"]
        if target == "roofline":
            return X, X[:, ROOF_EST].astype(np.float64)
        if target == "roofline-mean":
            return X, machine_log_estimates([(s.info, s.hw) for s in samples])
        return X, None

    def _margin(self, est: np.ndarray | None) -> np.ndarray | None:
        """Per-row base margin: the estimate, or the fallback where there is none (None under ``log``)."""
        if est is None:
            return None
        m = est.copy()
        bad = ~np.isfinite(m)
        if bad.any():
            m[bad] = float(self.meta.get("margin_fallback") or 0.0)
        return m

    def _set_fallback(self, est: np.ndarray | None, y: np.ndarray) -> None:
        if est is not None:
            bad = ~np.isfinite(est)
            self.meta["margin_fallback"] = float(y[bad].mean() if bad.any() else y.mean())

    def _dmatrix(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, margin: np.ndarray | None) -> xgb.DMatrix:
        keep = w > 0  # out-of-bag rows are left out
        return xgb.DMatrix(
            X[keep], label=y[keep], weight=w[keep], feature_names=list(FEATURES), nthread=int(self.params["n_jobs"]),
            base_margin=None if margin is None else margin[keep],
        )

    def _weights(self, samples: Sequence[Sample], rng: np.random.Generator) -> np.ndarray:
        """Per-sample weight = how often the sample's subgraph was drawn (0 = out of bag; all 1 for one member),
        times its machine's share under ``balance``."""
        if int(self.params["n_members"]) == 1:
            w = np.ones(len(samples), np.float32)
        else:
            groups: dict[str, int] = {}
            idx = np.array([groups.setdefault(s.info.hash, len(groups)) for s in samples])
            counts = np.bincount(rng.integers(0, len(groups), size=len(groups)), minlength=len(groups))
            w = counts[idx].astype(np.float32)
        return w * machine_weights(samples) if self.params["balance"] == "machine" else w

    @staticmethod
    def _groups(samples: Sequence[Sample]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The "same subgraph, which backend" groups, (machine, subgraph hash): each sample's group id, and the
        index arrays (ascending) of the groups with two or more samples, in group-id order."""
        ids: dict[tuple[str, str], int] = {}
        qid = np.array([ids.setdefault((s.hardware, s.info.hash), len(ids)) for s in samples], dtype=np.int64)
        order = np.argsort(qid, kind="stable")
        q = qid[order]
        starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]]) if len(q) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(q)]
        return qid, [order[a:b] for a, b in zip(starts, ends) if b - a >= 2]

    def _rank_matrix(self, X: np.ndarray, samples: Sequence[Sample], y: np.ndarray) -> xgb.DMatrix | None:
        """Rows of subgraphs measured on two or more backends, sorted by query id, graded by speed (fastest
        highest); None when there is no such group."""
        qid, groups = self._groups(samples)
        if not groups:
            return None
        rows = np.concatenate(groups)
        grade = np.concatenate([np.argsort(np.argsort(-y[g])) for g in groups]).astype(np.float32)  # slowest 0
        return xgb.DMatrix(X[rows], label=grade, qid=qid[rows], feature_names=list(FEATURES),
                           nthread=int(self.params["n_jobs"]))

    def _fit_ranker(self, X: np.ndarray, samples: Sequence[Sample], y: np.ndarray, rounds: int,
                    start: xgb.Booster | None = None) -> xgb.Booster | None:
        if not self.params["ranker"]:
            return None
        d = self._rank_matrix(X, samples, y)
        if d is None:
            return start
        params = {**self._booster_params(0), "objective": "rank:pairwise"}
        return xgb.train(params, d, num_boost_round=rounds, xgb_model=start)

    def _apply_ranker(self, P: np.ndarray, samples: Sequence[Sample], X: np.ndarray) -> np.ndarray:
        """Each member's values within a group, reassigned in the ranker's order (module docstring)."""
        if self.ranker is None or len(samples) < 2:
            return P
        _, groups = self._groups(samples)
        if not groups:
            return P
        score = float(self.params["ranker_weight"]) * self.ranker.inplace_predict(X).astype(np.float64)
        out = P.copy()
        for idx in groups:
            for m in range(P.shape[0]):
                fastest_first = idx[np.argsort(P[m, idx] - score[idx], kind="stable")]
                out[m, fastest_first] = np.sort(P[m, idx])
        return out

    def fit(self, data: Dataset) -> "XGBCostModel":
        self._record_fit(data)
        self._fit_all(Dataset(list(data.samples)))
        return self

    def _fit_all(self, data: Dataset) -> None:
        (X, est), y = self._features(data.samples), data.y()
        self._set_fallback(est, y)
        margin = self._margin(est)
        rng = np.random.default_rng(int(self.params["seed"]))
        members, oob = [], []
        for i in range(int(self.params["n_members"])):
            w = self._weights(data.samples, rng)
            keep = w > 0
            rounds = int(self.params["n_estimators"])
            b = xgb.train(self._booster_params(i), self._dmatrix(X, y, w, margin), num_boost_round=rounds)
            members.append(b)
            out = ~keep
            if out.sum() >= 10:
                r = b.inplace_predict(X[out], base_margin=None if margin is None else margin[out]) - y[out]
                oob.append(float(np.sqrt(np.mean(r**2))))
        self.members = members
        self.ranker = self._fit_ranker(X, data.samples, y, int(self.params["n_estimators"]))
        self._train = data
        self._n_fit = len(data)
        self._pending = 0
        self.meta["oob_rmse"] = float(np.median(oob)) if oob else None
        self._set_noise()

    def _set_noise(self) -> None:
        oob = self.meta.get("oob_rmse")
        base = float(oob) * float(self.params["noise_scale"]) if oob else 0.0
        self.meta["noise_std"] = max(base, float(self.params["min_std"]))

    def update(self, new: Dataset) -> dict[str, Any]:
        """Fold in ``new`` (see the module docstring); returns ``{"mode", "n", ...}``."""
        n = len(new)
        if n == 0:
            return {"mode": "none", "n": 0}
        if not self.members:
            self.fit(new)
            self._record_update(n)
            return {"mode": "retrain", "n": n, "trained_on": n}
        old = list(self._train.samples) if self._train is not None else []
        self._train = Dataset(old + list(new.samples))
        self._pending += n
        # _n_fit is 0 after load: the kept data is only what came since, so never retrain from it alone
        if self._n_fit and self._pending >= float(self.params["retrain_fraction"]) * self._n_fit:
            data = self._train
            self._record_fit(data)
            self._fit_all(data)
            self._record_update(n)
            return {"mode": "retrain", "n": n, "trained_on": len(data)}
        # continue boosting on the new samples plus a replay of older data
        n_replay = min(len(old), int(math.ceil(float(self.params["replay_ratio"]) * n)))
        replay = random.Random(int(self.params["seed"]) + int(self.meta.get("updates", 0)) + 1).sample(old, n_replay)
        mix = list(new.samples) + replay
        (X, est), y = self._features(mix), Dataset(mix).y()
        margin = self._margin(est)
        rng = np.random.default_rng(int(self.params["seed"]) + 7919 * (int(self.meta.get("updates", 0)) + 1))
        rounds = int(self.params["update_rounds"])
        members = []
        for i, b in enumerate(self.members):
            w = self._weights(mix, rng)
            d = self._dmatrix(X, y, w, margin)
            members.append(xgb.train(self._booster_params(i), d, num_boost_round=rounds, xgb_model=b))
        self.members = members
        self.ranker = self._fit_ranker(X, mix, y, rounds, start=self.ranker)
        self._record_update(n)
        return {"mode": "continue", "n": n, "replay": n_replay, "rounds": rounds}

    # -- prediction -------------------------------------------------------------------------
    def predict_members(self, samples: Sequence[Sample]) -> np.ndarray:
        """Each member's predicted log latency: float64 [n_members, len(samples)]."""
        if not self.members:
            raise RuntimeError("XGBCostModel is not fitted; call fit() or load_model() first")
        if not len(samples):
            return np.zeros((len(self.members), 0))
        X, est = self._features(samples)
        margin = self._margin(est)
        P = np.stack([b.inplace_predict(X, base_margin=margin) for b in self.members]).astype(np.float64)
        return self._apply_ranker(P, samples, X)

    def predict_log(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        """Members' mean, and sqrt(members' variance + noise_std**2) (see the module docstring)."""
        P = self.predict_members(samples)
        if not P.shape[1]:
            return np.zeros(0), np.zeros(0)
        mean = P.mean(axis=0)
        var = P.var(axis=0, ddof=1) if len(self.members) > 1 else np.zeros(len(samples))
        noise = float(self.meta.get("noise_std") or self.params["min_std"])
        return mean, np.sqrt(var + noise**2)

    # -- artifact ---------------------------------------------------------------------------
    def _save_payload(self, directory: Path) -> dict[str, Any]:
        if not self.members:
            raise RuntimeError("cannot save an unfitted XGBCostModel")
        for f in [*directory.glob("member-*.json"), directory / "ranker.json"]:
            if f.is_file():
                f.unlink()
        for i, b in enumerate(self.members):
            b.save_model(str(directory / f"member-{i}.json"))
        if self.ranker is not None:
            self.ranker.save_model(str(directory / "ranker.json"))
        return {"members": len(self.members), "feature_names": list(FEATURES), "ranker": self.ranker is not None}

    def _load_payload(self, directory: Path, meta: dict[str, Any]) -> None:
        names = meta.get("feature_names")
        if names != list(FEATURES):
            raise ArtifactError(
                f"cost model {directory} was trained on other feature columns than this collage-ml computes "
                f"({len(names) if isinstance(names, list) else names!r} vs {len(FEATURES)} features) under the "
                "same schema version; retrain it with `collage-ml train`"
            )
        k = meta.get("members")
        if not isinstance(k, int) or k < 1:
            raise ArtifactError(f"cost model {directory}: meta.json does not say how many members it has")
        missing = [f"member-{i}.json" for i in range(k) if not (directory / f"member-{i}.json").is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ArtifactError(f"cost model {directory} is incomplete: missing {shown}")
        members = []
        for i in range(k):
            b = xgb.Booster()
            b.load_model(str(directory / f"member-{i}.json"))
            b.set_param({"nthread": int(self.params["n_jobs"])})
            members.append(b)
        self.members = members
        self.ranker = None
        if meta.get("ranker"):
            if not (directory / "ranker.json").is_file():
                raise ArtifactError(f"cost model {directory} is incomplete: missing ranker.json")
            self.ranker = xgb.Booster()
            self.ranker.load_model(str(directory / "ranker.json"))
            self.ranker.set_param({"nthread": int(self.params["n_jobs"])})
        self._train = None
        self._n_fit = 0
        self._pending = 0
        if "noise_std" not in self.meta:
            self._set_noise()
