"""Training data for cost models: measured candidates, featurizable.

A :class:`Sample` is one valid measurement with what the featurizers need:
the subgraph's :class:`~collage_ml.featurize.SubgraphInfo`, the backend name
and the hardware descriptor, plus the latency and where it came from.
:meth:`Dataset.from_db` builds one from a measurement database (re-analysing
the stored ONNX of each subgraph once); :meth:`Dataset.from_candidates` from a
placement's own fresh measurements.

``source`` is the model family a sample was drawn from: the row's family for
the ``enumerate`` sampler, and for the ``random`` sampler the zoo family of
the model in its ``random:<model>@b<batch>`` pattern. Leave-one-family-out
splits hold out by ``source``, so random subgraphs of a held-out model never
leak into training.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from collage_ml.cost import CandidateKey, Measurement
from collage_ml.defaults import POOL_BY
from collage_ml.featurize.hardware import HardwareDesc
from collage_ml.featurize.info import SubgraphInfo, info_from_onnx, subgraph_info
from collage_ml.measure.probes import PROBE_SET_VERSION
from collage_ml.ui import steps


@dataclass(frozen=True)
class Sample:
    info: SubgraphInfo
    backend: str
    hw: HardwareDesc
    latency: float | None = None  # seconds; None for an unmeasured candidate
    family: str = ""
    source: str = ""
    key: CandidateKey | None = None
    hardware: str = ""  # fingerprint
    pattern: str = ""
    #: (source graph hash, first node) when the row recorded them: its decision group in the op-level DP
    decision: tuple[str, int] | None = None
    protocol: str = ""  # the measurement protocol the latency was timed under ("" when unknown)
    node: str = ""  # the machine instance (e.g. ``boot:<id>``, a VM's boot) that measured it ("" when unrecorded)
    sittings: int = 1  # how many sittings' measurements its latency is the geometric mean of (:func:`merge_sittings`)

    @property
    def log_latency(self) -> float:
        if self.latency is None or not self.latency > 0:
            raise ValueError(f"sample {self.key} has no latency")
        return math.log(self.latency)


def source_family(family: str, pattern: str) -> str:
    """The model family a row was drawn from (see the module docstring)."""
    if family == "random" and pattern.startswith("random:"):
        model = pattern[len("random:") :].split("@", 1)[0]
        try:
            from collage_ml.ir import zoo

            return zoo.get(model).family
        except Exception:
            return Path(model).stem or model
    return family


@dataclass
class Dataset:
    samples: list[Sample] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Dataset(self.samples[i])
        return self.samples[i]

    def __add__(self, other: "Dataset") -> "Dataset":
        return Dataset(self.samples + list(other.samples))

    def y(self) -> np.ndarray:
        """Log latency (natural log of seconds) per sample."""
        return np.array([s.log_latency for s in self.samples], dtype=np.float64)

    def latencies(self) -> np.ndarray:
        return np.array([s.latency for s in self.samples], dtype=np.float64)

    def sources(self) -> list[str]:
        return sorted({s.source for s in self.samples})

    def filter(self, keep: Callable[[Sample], bool]) -> "Dataset":
        return Dataset([s for s in self.samples if keep(s)])

    def split_by_source(self, holdout: Iterable[str]) -> tuple["Dataset", "Dataset"]:
        """(train, test): test holds every sample whose source family is in ``holdout``."""
        h = set(holdout)
        return self.filter(lambda s: s.source not in h), self.filter(lambda s: s.source in h)

    def random_split(self, test_fraction: float, seed: int = 0) -> tuple["Dataset", "Dataset"]:
        """A random split by subgraph (all backends of one subgraph land on the same side)."""
        hashes = sorted({s.info.hash for s in self.samples})
        rng = random.Random(seed)
        rng.shuffle(hashes)
        test = set(hashes[: int(round(len(hashes) * test_fraction))])
        return self.filter(lambda s: s.info.hash not in test), self.filter(lambda s: s.info.hash in test)

    def sample(self, n: int, seed: int = 0) -> "Dataset":
        if n >= len(self):
            return Dataset(list(self.samples))
        return Dataset(random.Random(seed).sample(self.samples, n))

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def from_db(
        db: Any,
        hardware: str | None = None,
        backends: Sequence[str] | None = None,
        families: Sequence[str] | None = None,
        progress: bool = False,
        protocols: Sequence[str] | None = None,
        include_contended: bool = False,
    ) -> "Dataset":
        """Every valid measurement of ``db`` (a :class:`~collage_ml.db.Database` or a path).

        ``hardware`` keeps one fingerprint (default: all); ``protocols`` keeps rows timed under those
        measurement protocols (default: all; ``Dataset.protocols`` counts the rows of each, so a mix is never
        silent). Rows marked ``contended`` (something else used the CPUs while they were timed) are left out
        unless ``include_contended``, and counted in ``Dataset.contended``. A stored subgraph that no longer
        parses is skipped and counted in ``Dataset.skipped``. Each sample's hardware descriptor carries the
        probe results the database holds for its machine, from the calibrations nearest the row's own time
        (:func:`calibration_at`; none for a machine that was never calibrated).

        ``Dataset.kinds`` counts each kind of record of that hardware and those protocols that is valid:
        ``candidates`` (the measurements the samples come from), ``boundaries`` (boundary costs) and ``plans``
        (plans judged end to end). Boundary costs and plans are records of their own kinds, never samples, and
        never counted as skipped.
        """
        from collage_ml.db import Database

        own = not hasattr(db, "measurements")
        d = Database(db, readonly=True) if own else db
        try:
            rows = list(d.measurements(hardware=hardware, valid=True))
            if protocols is not None:
                keep_p = set(protocols)
                rows = [m for m in rows if m.protocol in keep_p]
            contended = sum(1 for m in rows if m.extra.get("contended"))
            if not include_contended:
                rows = [m for m in rows if not m.extra.get("contended")]
            records = (d.record_counts(hardware=hardware, valid=True, protocols=protocols)
                       if hasattr(d, "record_counts") else {"boundaries": 0, "plan_timings": 0})
            n_candidates = len(rows)
            by_protocol: dict[str, int] = {}
            for m in rows:
                by_protocol[m.protocol] = by_protocol.get(m.protocol, 0) + 1
            if backends is not None:
                keep = set(backends)
                rows = [m for m in rows if m.key.backend in keep]
            infos: dict[str, SubgraphInfo | None] = {}
            hw_cache: dict[tuple, HardwareDesc] = {}
            cals: dict[str, list] = {}  # fingerprint -> its calibrations
            out: list[Sample] = []
            skipped = 0
            bar = steps(len(rows), "featurizing", progress)
            for m in rows:
                bar()
                if m.median is None or not m.median > 0:
                    continue
                h = m.key.subgraph_hash
                if h not in infos:
                    data = d.subgraph_onnx(h)
                    try:
                        infos[h] = info_from_onnx(data, h) if data is not None else None
                    except Exception:
                        infos[h] = None
                info = infos[h]
                if info is None:
                    skipped += 1
                    continue
                pattern = str(m.extra.get("pattern", ""))
                src = source_family(m.family, pattern)
                if families is not None and src not in families:
                    continue
                if m.hardware not in cals:
                    cals[m.hardware] = d.calibrations(m.hardware, PROBE_SET_VERSION)
                groups = calibration_groups(cals[m.hardware], m.protocol, m.timestamp, node=m.extra.get("node"))
                # the calibrations a row reads, by identity (``cals`` holds them for the whole loop): their
                # medians are taken once per distinct set, not once per row
                hk = (m.hardware, m.threads, tuple(id(c) for g in groups for c in g))
                if hk not in hw_cache:
                    hw_cache[hk] = HardwareDesc.from_info(d.hardware_info(m.hardware), m.threads,
                                                          {g[0].backend: merged(g).values for g in groups})
                dec = m.extra.get("source"), m.extra.get("first_node")
                out.append(
                    Sample(info, m.key.backend, hw_cache[hk], float(m.median), m.family, src, m.key, m.hardware, pattern,
                           (str(dec[0]), int(dec[1])) if dec[0] is not None and dec[1] is not None else None,
                           m.protocol, str(m.extra.get("node") or ""))
                )
            bar(done=True)
        finally:
            if own:
                d.close()
        ds = Dataset(out)
        ds.skipped = skipped  # type: ignore[attr-defined]
        ds.contended = contended  # type: ignore[attr-defined]
        ds.protocols = by_protocol  # type: ignore[attr-defined]
        ds.kinds = {"candidates": n_candidates, "boundaries": records["boundaries"],  # type: ignore[attr-defined]
                    "plans": records["plan_timings"]}
        return ds

    @staticmethod
    def from_candidates(
        pairs: Iterable[tuple[Any, Measurement]], hw: HardwareDesc, family: str = ""
    ) -> "Dataset":
        """Samples from (Candidate, Measurement) pairs; invalid measurements are left out."""
        out = []
        for c, m in pairs:
            if not m.valid or m.median is None or not m.median > 0:
                continue
            out.append(
                Sample(subgraph_info(c.subgraph), c.backend.name, hw, float(m.median), family or m.family,
                       family or m.family, c.key, m.hardware, c.pattern)
            )
        return Dataset(out)


def sitting_key(s: Sample) -> tuple | None:
    """What makes two samples measurements of one candidate on one machine: the fingerprint (threads
    included), the protocol and the candidate key (subgraph, backend and its version). None for a sample
    without a key (a live candidate)."""
    return None if s.key is None else (s.hardware, s.protocol, s.key)


#: a sitting's scale for a backend is read from the candidates it shares with the first sitting of that machine
#: and backend when at least this many are shared (:func:`sitting_scales`); else from its calibration
MIN_SHARED = 30


def sitting_scales(parts: Sequence[Dataset]) -> list[dict[tuple, float]]:
    """Per part (a sitting: one database), per machine and backend ``(fingerprint, protocol, backend)``: how
    much slower, in log, that sitting ran the candidates it shares with the first part that holds rows of that
    machine and backend (the median log ratio; 0 for that first part). Left out where fewer than
    :data:`MIN_SHARED` candidates are shared."""
    logs = [{sitting_key(s): math.log(s.latency) for s in part if sitting_key(s) is not None
             and s.latency is not None and s.latency > 0} for part in parts]
    first: dict[tuple, int] = {}
    out: list[dict[tuple, float]] = []
    for j, rows in enumerate(logs):
        by_backend: dict[tuple, list] = {}
        for k in rows:
            by_backend.setdefault((k[0], k[1], k[2].backend), []).append(k)
        scales: dict[tuple, float] = {}
        for mb, keys in by_backend.items():
            a = first.setdefault(mb, j)
            if a == j:
                scales[mb] = 0.0
                continue
            r = [rows[k] - logs[a][k] for k in keys if k in logs[a]]
            if len(r) >= MIN_SHARED:
                scales[mb] = float(np.median(r))
        out.append(scales)
    return out


def merge_sittings(parts: Sequence[Dataset]) -> Dataset:
    """``parts`` (one Dataset per database, in order) as one Dataset with one sample per candidate and machine
    (:func:`sitting_key`): where several databases measured the same candidate on the same machine under the
    same protocol (a rerun, a second sitting), they become one sample, the first one's, whose latency is the
    geometric mean of theirs, each put on the first one's scale first. Its ``sittings`` says how many.

    A sitting's scale, per backend, is the median ratio over the candidates it shares with that machine's
    first sitting (:func:`sitting_scales`), where at least :data:`MIN_SHARED` are shared; else each row is read
    against its own sitting's calibration (log latency minus the machine's roofline estimate from that row's
    probes, ``featurize.flat.machine_log_estimates``), or raw where a row has no calibration. On the Zen 3 at 2
    threads four sittings' labels, read the first way, agree within +-10% as means of two against the other
    two on 52%, and read through their calibrations on 45%: a scale from thousands of candidates is steadier
    than one from the probe set's 104 (``benchmarks/sitting_drift.py``; docs/results/cost-models.md, "Four
    sittings of the Zen 3 at 2 threads").

    Each sitting as a sample of its own would instead weigh a re-measured candidate twice. ``Dataset.merged``
    is ``{"candidates": merged candidates, "rows": rows they held, "by_shared": candidates put on scale by the
    shared candidates}``."""
    from collage_ml.featurize.flat import machine_log_estimates

    if isinstance(parts, Dataset):
        raise TypeError("merge_sittings takes one Dataset per sitting (a list), not their samples together")
    scales = sitting_scales(parts)
    samples = [(s, j) for j, part in enumerate(parts) for s in part.samples]
    groups: dict[tuple, list[int]] = {}
    for i, (s, _) in enumerate(samples):
        k = sitting_key(s)
        if k is not None and s.latency is not None and s.latency > 0:
            groups.setdefault(k, []).append(i)
    first: dict[int, Sample] = {}
    drop: set[int] = set()
    rows = by_shared = 0
    for idx in groups.values():
        if len(idx) < 2:
            continue
        ss = [samples[i][0] for i in idx]
        logs = np.log([s.latency for s in ss])
        mb = (ss[0].hardware, ss[0].protocol, ss[0].backend)
        f = [scales[samples[i][1]].get(mb) for i in idx]
        if all(x is not None for x in f):
            label = float(np.mean(logs - (np.array(f) - f[0])))
            by_shared += 1
        else:
            est = machine_log_estimates([(s.info, s.hw) for s in ss])
            label = float(est[0] + np.mean(logs - est)) if np.isfinite(est).all() else float(np.mean(logs))
        first[idx[0]] = replace(ss[0], latency=math.exp(label), sittings=sum(s.sittings for s in ss))
        drop.update(idx[1:])
        rows += len(idx)
    out = Dataset([first.get(i, s) for i, (s, _) in enumerate(samples) if i not in drop])
    for attr in ("skipped", "contended"):  # rows each database left out
        if any(hasattr(part, attr) for part in parts):
            setattr(out, attr, sum(int(getattr(part, attr, 0)) for part in parts))
    out.merged = {"candidates": len(first), "rows": rows, "by_shared": by_shared}  # type: ignore[attr-defined]
    return out


#: calibrations of a backend within this many seconds of each other read one state of the machine
SITTING_WINDOW_S = 1800.0


def calibration_at(cals: Sequence[Any], protocol: str, t: float, window: float = SITTING_WINDOW_S,
                   node: str | None = None) -> list[Any]:
    """Per backend, the calibration (``db.probes.Calibration``) of ``cals`` taken nearest the time ``t``, among
    those of ``protocol`` where the backend has any, and of the row's ``node`` where the backend has any of it;
    where others lie within ``window`` seconds of it, their per-probe median, under the nearest one's name and
    time. A database calibrated in every sitting (``measure.probes.recalibrate``) so reads each row against its
    own sitting's calibration, not against the machine as it was hours earlier or later, nor against another
    machine of its kind that measured at the same time (``collect --ray``). One calibration scatters by about
    2% (six back to back on the Xeon: 0.970-1.027 of another, sd 0.020), so several in one sitting read better
    as their median."""
    return [merged(g) for g in calibration_groups(cals, protocol, t, window, node)]


def calibration_groups(cals: Sequence[Any], protocol: str, t: float, window: float = SITTING_WINDOW_S,
                       node: str | None = None) -> list[tuple[Any, ...]]:
    """What :func:`calibration_at` reads, before any median: per backend (sorted), the nearest calibration
    first, then the others within ``window`` seconds of it."""
    by_backend: dict[str, list[Any]] = {}
    for c in cals:
        by_backend.setdefault(c.backend, []).append(c)
    out = []
    for b in sorted(by_backend):
        own = [c for c in by_backend[b] if c.protocol == protocol] or by_backend[b]
        if node is not None:  # the row's own machine, where it calibrated this backend (else: any, as before)
            own = [c for c in own if c.node == node] or own
        nearest = min(own, key=lambda c: abs(c.time - t))
        out.append((nearest, *(c for c in own if c is not nearest and abs(c.time - nearest.time) <= window)))
    return out


def merged(group: Sequence[Any]) -> Any:
    """One group of :func:`calibration_groups` as one calibration: the nearest, with the group's per-probe
    medians where it has more than one."""
    return group[0] if len(group) == 1 else group[0]._replace(values=probe_medians([c.values for c in group]))


def probe_medians(tables: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Per probe, the median of the values ``tables`` give it; None where none gives one."""
    out: dict[str, float | None] = {}
    for p in sorted({p for t in tables for p in t}):
        v = [t[p] for t in tables if t.get(p) is not None]
        out[p] = float(np.median(v)) if v else None
    return out


def items_of(objs: Sequence[Any], hw: HardwareDesc) -> list[Sample]:
    """Candidates (or Samples) as Samples without latency, ready to featurize."""
    out = []
    for o in objs:
        if isinstance(o, Sample):
            out.append(o)
        else:  # a Candidate
            out.append(Sample(subgraph_info(o.subgraph), o.backend.name, hw, None, key=o.key, pattern=o.pattern))
    return out


def pool_probes(parts: Sequence[Dataset], by: str = "machine") -> dict[str, int]:
    """Gives every sample of one machine (fingerprint and threads) and protocol the same probe table, in place:
    per backend and probe, the median over the distinct calibrations that ``parts`` carry for them. Returns
    {fingerprint: calibrations pooled} for each machine that had more than one (summed over its protocols
    and nodes).

    ``by="node"`` pools each instance of the machine apart (the row's ``node``: a VM's boot; rows that did not
    record one form one group): the sittings of one VM share a table, and two VMs of one fingerprint keep
    their own. On the Zen 3 at 2 threads the zoo's database came from one VM and four synthetic ones from
    another; one table per VM there cost leave-one-family-out 4-5 points of MAPE against each sitting's own
    (docs/results/cost-models.md, "Sequence and volume networks at batch 1 on the Zen 3"): that VM's
    calibrations followed a drift its labels shared. It is for fleets whose VMs differ more than their
    sittings do.

    A database made before calibrations were kept per sitting (2026-12-05) holds one, taken when its machine
    was first seen, and that table stands for every row collected into it, hours or days later. On the Xeon
    the probes did follow the machine's drift at the median (a calibration that read 16% slow came with
    labels 12% slow), but the table that two databases carried, measured 10 hours before their rows, read 6%
    slow for rows that ran 5% fast, and on the Zen 3 one backend's probes moved 34% where its labels moved
    13%. The ``roofline-mean`` target divides each label by its own table's estimate, so a stale or noisy
    table becomes a bias of that database's labels; one table per machine removes it, and with it the drift
    the tables did catch. It helped two CPU kinds of three (docs/results/cost-models.md, "One probe table per
    machine"), so it is opt-in. Protocols stay apart:
    each times kernels its own way, and its calibration carries that scale to its labels."""
    from collage_ml.featurize.roofline import PROBE_NAMES

    if by not in POOL_BY:
        raise ValueError(f"pool_probes: by={by!r} is not one of {', '.join(POOL_BY)}")

    def node(s: Sample) -> str:
        return s.node if by == "node" else ""

    tables: dict[tuple[str, int, str, str], dict[HardwareDesc, None]] = {}
    for d in parts:
        for s in d.samples:
            if s.hw.probes:
                tables.setdefault((s.hardware, s.hw.threads, s.protocol, node(s)), {})[s.hw] = None
    swap: dict[tuple[str, str, str, HardwareDesc], HardwareDesc] = {}
    pooled: dict[str, int] = {}
    for (fp, _, protocol, where), descs in tables.items():
        if len(descs) < 2:
            continue
        per_backend: dict[str, list[dict[str, float | None]]] = {}
        for h in descs:
            for backend, vals in h.probes:
                per_backend.setdefault(backend, []).append(dict(zip(PROBE_NAMES, vals)))
        table = {b: probe_medians(ts) for b, ts in per_backend.items()}
        first = next(iter(descs))
        for h in descs:
            swap[(fp, protocol, where, h)] = first.with_probes(table)
        pooled[fp] = pooled.get(fp, 0) + len(descs)
    if swap:
        for d in parts:
            d.samples = [replace(s, hw=swap[k]) if (k := (s.hardware, s.protocol, node(s), s.hw)) in swap else s
                         for s in d.samples]
    return pooled
