"""The Runner: compiles and times candidates in persistent worker processes.

Each worker is a fresh interpreter that rebuilds backends from their
:meth:`Backend.spec`, compiles a candidate's subgraph, checks its outputs
against the reference activations, and times it (:mod:`.timing`). Workers are
reused across candidates. A candidate is timed in several workers, by the
protocol in :mod:`.timing`: the latency is the minimum of the per-process
medians. A crash (segfault, ``os.abort``) or a timeout costs one worker and
marks that one candidate ``failed`` (a fact about that run: later runs try it
again, up to ``cost.MAX_ATTEMPTS`` attempts); wrong numbers, an unsupported
op or a compile error make it ``invalid`` (a fact about the backend). The run
goes on with a fresh worker. The worker processes themselves are
:mod:`.worker`'s.

Candidates are grouped by backend and measured one backend per phase, since
a runtime's idle threads slow the next runtime's calls (STACK-NOTES.md); a
protocol with ``interleave`` (``m4``, an experiment arm) interleaves the
passes of one chunk of every backend instead, with a longer warm-up at each
switch. Every
measurement is committed to the database as it arrives; candidates already in
the database for this hardware fingerprint are cache hits and are not run.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from collage_ml.candidates import Candidate
from collage_ml.cost import CandidateKey, Measurement
from collage_ml.errors import BackendError
from collage_ml.measure.hardware import node_id
from collage_ml.measure.tasks import ReleaseTask, RetimeTask, Task
from collage_ml.measure.timing import Tolerance, TimingConfig
from collage_ml.measure.worker import Worker, _worker_main, stop_all, worker_path  # noqa: F401  (re-exported)
from collage_ml.paths import default_threads  # collector/ still imports it from here

_TOKENS = itertools.count()


class Runner:
    """Measures candidates and commits each result to ``db`` (optional).

    ``threads`` is the intra-op thread count used for every backend;
    ``timeout`` bounds one candidate's compile plus timing in one process, in
    seconds; ``timing`` is the measurement protocol (:mod:`.timing`), whose
    name keys the database rows this runner reads and writes.
    ``measured`` counts the measurements that were committed (all of them
    without a database), ``cache_hits`` the candidates read from it.
    ``stale_after`` (seconds; None: off) and ``anchors``: cache hits older than that are rescaled by the
    drift that ``anchors`` of them show when timed again (:meth:`refresh_stale`).
    """

    def __init__(
        self,
        db=None,
        threads: int | None = None,
        timeout: float = 120.0,
        timing: TimingConfig = TimingConfig(),
        tolerance: Tolerance = Tolerance(),
        family: str = "",
        stale_after: float | None = None,
        anchors: int = 3,
    ):
        from collage_ml.measure.hardware import fingerprint, hardware_info

        self.db = db
        self.threads = threads or default_threads()
        self.timeout = timeout
        self.timing = timing
        self.tolerance = tolerance
        self.family = family
        self.hardware = fingerprint(self.threads)
        if db is not None:
            db.register_hardware(self.hardware, hardware_info(self.threads))
        # one pool of workers per process group; backends that change process-wide state (ORT's global
        # thread pool) get workers of their own. Workers start on first use.
        self._pools: dict[str | None, list[Worker]] = {None: [Worker(self.threads)]}
        self.cache_hits = 0
        self.measured = 0
        # stale cache hits (see refresh_stale): older than ``stale_after`` seconds when this runner started
        self.stale_after = stale_after
        self.anchors = int(anchors)
        self.started = time.time()
        self.drift: dict[str, dict[str, float]] = {}  # backend -> {"ratio", "anchors", "age_hours"}
        self._stale_checked: set[CandidateKey] = set()  # keys refresh_stale has read (their rows cannot turn stale)
        self.anchor_measurements = 0
        self.refused = 0  # measurements the database did not take (another process committed the key first)

    @property
    def worker(self) -> "Worker":
        """The first worker of the default pool (plans and boundaries of plain backends run here)."""
        return self._pools[None][0]

    def close(self) -> None:
        """Stops every worker, in parallel (:func:`~collage_ml.measure.worker.stop_all`)."""
        stop_all(w for pool in self._pools.values() for w in pool)

    def _group(self, backends) -> str | None:
        groups = {b.process_group for b in backends} - {None}
        if len(groups) > 1:
            raise BackendError(f"backends of process groups {sorted(groups)} cannot run in one process")
        return groups.pop() if groups else None

    def worker_for(self, backends, index: int = 0) -> "Worker":
        """Worker ``index`` of the pool for tasks that build ``backends`` (one backend, or several for a plan
        or boundary); the pool grows on demand."""
        pool = self._pools.setdefault(self._group(backends), [])
        while len(pool) <= index:
            pool.append(Worker(self.threads))
        return pool[index]

    def __enter__(self) -> "Runner":
        return self

    @contextmanager
    def detached(self) -> Iterator["Runner"]:
        """Within it the runner neither reads its database's cache nor commits to it: what is measured is
        measured now (``measure.probes`` calibrating a machine again)."""
        db, self.db = self.db, None
        try:
            yield self
        finally:
            self.db = db

    def __exit__(self, *exc) -> None:
        self.close()

    def lookup(self, key: CandidateKey) -> Measurement | None:
        """The stored measurement of ``key`` on this hardware under this runner's protocol, or None.

        A failed measurement with attempts left is not returned: it is to be measured again."""
        if self.db is None:
            return None
        m = self.db.get(key, self.hardware, self.timing.name)
        return None if m is None or m.retryable else self._rescaled(m)

    # -- stale cache hits
    def _stale(self, m: Measurement) -> bool:
        return (self.stale_after is not None and m.valid and bool(m.median)
                and self.started - m.timestamp > self.stale_after)

    def _rescaled(self, m: Measurement) -> Measurement:
        """A stale hit times its backend's drift (the database keeps the stored value); others as stored."""
        d = self.drift.get(m.key.backend) if self._stale(m) else None
        if d is None:
            return m
        r = d["ratio"]
        return replace(m, median=m.median * r, samples=[x * r for x in m.samples],
                       extra={**m.extra, "rescaled": r})

    def refresh_stale(self, candidates: Sequence[Candidate], reference: Mapping[str, np.ndarray]) -> dict:
        """Re-measures a few stale cache hits per backend, and rescales that backend's stale hits from then on.

        A machine's speed moves between hours, all its kernels together (docs/results/cost-models.md, "The
        Xeon a day later": 9-10% overnight, orders intact), so measurements of another hour do not add up
        with this hour's.
        For each backend among ``candidates`` that has hits older than ``stale_after`` seconds and no drift
        estimate yet, the ``anchors`` slowest of them are timed again under the protocol, in memory (the
        database keeps its first measurement of a key), and the median ratio new / stored becomes the drift
        that :meth:`lookup` applies to every stale hit of that backend. Anchors count in
        ``anchor_measurements``, not in ``measured``. Does nothing when ``stale_after`` is None (the default)
        or without a database. Returns ``drift``."""
        if self.stale_after is None or self.db is None or self.anchors < 1:
            return self.drift
        stale: dict[str, dict] = {}
        for c in candidates:
            b = c.backend.name
            if b in self.drift or c.key in self._stale_checked:
                continue
            self._stale_checked.add(c.key)
            m = self.db.get(c.key, self.hardware, self.timing.name)
            if m is not None and not m.retryable and self._stale(m):
                stale.setdefault(b, {})[c.key] = (c, m)
        todo = [sorted(v.values(), key=lambda cm: -cm[1].median)[: self.anchors] for v in stale.values()]
        if not todo:
            return self.drift
        phases = [([cms[0][0].backend], [lambda c=c: self._task(c, reference) for c, _ in cms]) for cms in todo]
        for cms, rs in zip(todo, self.run_phases(phases)):
            self.anchor_measurements += len(cms)
            ratios = [r["median"] / m.median for (_, m), r in zip(cms, rs) if r.get("valid") and r.get("median")]
            if ratios:
                age = max(self.started - m.timestamp for _, m in cms) / 3600.0
                self.drift[cms[0][0].backend.name] = {
                    "ratio": float(np.median(ratios)), "anchors": float(len(ratios)), "age_hours": round(age, 2)}
        return self.drift

    def measure(
        self,
        candidates: Sequence[Candidate],
        reference: Mapping[str, np.ndarray],
        family: str | None = None,
        on_result: Callable[[Candidate, Measurement, bool], None] | None = None,
    ) -> list[Measurement]:
        """Measures each candidate (cache hits are not re-run); results align with ``candidates``.

        ``reference`` is :meth:`Graph.reference` of the candidates' graph, or, for candidates of several
        graphs, a function from a candidate to its graph's reference.
        ``on_result(candidate, measurement, cached)`` is called after each one. Candidates are measured
        in chunks of ``timing.pass_chunk`` of one backend, by :meth:`measure_chunks`: one backend per phase,
        or, under ``timing.interleave``, one chunk of every backend at a time with their passes interleaved.
        """
        family = self.family if family is None else family
        self.refresh_stale(candidates, reference)
        results: dict[CandidateKey, Measurement] = {}
        todo: dict[str, dict[CandidateKey, Candidate]] = {}
        for c in sorted(candidates, key=lambda c: c.backend.name):  # one backend per phase
            key = c.key
            if key in results or key in todo.get(c.backend.name, {}):
                continue
            cached = self.lookup(key)
            if cached is not None:
                self.cache_hits += 1
                results[key] = cached
                if on_result:
                    on_result(c, cached, True)
                continue
            todo.setdefault(c.backend.name, {})[key] = c
        budget = self.KEEP_BYTES // max(1, len(todo) if self.timing.interleave else 1)
        streams = [list(self._chunks(list(group.values()), reference, budget)) for group in todo.values()]
        if self.timing.interleave:  # one chunk of every backend at a time, their passes interleaved
            rounds = [[ch for ch in rnd if ch] for rnd in itertools.zip_longest(*streams, fillvalue=None)]
        else:  # one backend per phase
            rounds = [[ch] for stream in streams for ch in stream]
        for chunks in rounds:
            for chunk, ms in zip(chunks, self.measure_chunks(chunks, reference, family)):
                for c, m in zip(chunk, ms):
                    results[c.key] = m
                    if on_result:
                        on_result(c, m, False)
        return [results[c.key] for c in candidates]

    #: under ``keep_compiled``, the most bytes of inputs that the candidates of one pass chunk may hold in a
    #: worker at once (each kept candidate keeps its inputs, and its compiled form some more)
    KEEP_BYTES = 1 << 30

    def _chunks(self, group: list[Candidate], reference: Mapping[str, np.ndarray], budget: int | None = None):
        """``group`` in chunks of ``timing.pass_chunk`` candidates (and, when compiled candidates are kept, of
        at most ``budget`` bytes of inputs, :attr:`KEEP_BYTES` by default)."""
        budget = self.KEEP_BYTES if budget is None else budget
        step = max(1, self.timing.pass_chunk)
        chunk: list[Candidate] = []
        held = 0
        for c in group:
            ref = reference_of(reference, c)
            size = sum(ref[t].nbytes for t in c.subgraph.inputs if t in ref) if self.timing.keep_compiled else 0
            if chunk and (len(chunk) >= step or held + size > budget):
                yield chunk
                chunk, held = [], 0
            chunk.append(c)
            held += size
        if chunk:
            yield chunk

    def _task(self, c: Candidate, reference: Mapping[str, np.ndarray]) -> Task:
        feeds, expected = c.subgraph.reference_io(reference_of(reference, c))
        return Task(c.backend.spec(), c.subgraph.to_onnx(check=False).SerializeToString(), feeds, expected,
                    self.threads, self.timing, self.tolerance)

    def run_passes(self, backends, tasks: Sequence, timeout: float | None = None) -> list[dict]:
        """Runs each task (all for ``backends``) by the protocol, in passes: :meth:`run_phases` of one phase."""
        return self.run_phases([(backends, tasks)], timeout)[0]

    def run_phases(self, phases: Sequence[tuple[Sequence, Sequence]], timeout: float | None = None) -> list[list[dict]]:
        """Runs the tasks of every phase (``(backends, tasks)``: tasks that build ``backends``) by the protocol,
        in passes (:mod:`.timing`): pass ``p`` gives every task of every phase that still needs a window one
        more, after the previous pass has gone through all of them, so a candidate's windows lie seconds apart,
        not back to back, and the more so the more phases share the passes. A window is a fresh compile in the
        pool's worker ``p`` or, under ``keep_compiled``, one more timing of the candidate that worker 0 compiled
        in pass 0 and kept. The first window after a switch of backend warms up for ``switch_warmup`` seconds
        (the last runtime's threads may still spin). A task whose two fastest windows agree (or that needs one)
        is done; under ``skip_contended`` only its clean windows count. Returns, per phase, one combined result
        per task (``median``: the minimum of the per-window medians), or its first failure."""
        cfg = self.timing
        timeout = self.timeout if timeout is None else timeout
        keep = cfg.keep_compiled
        flat = [(backends, task) for backends, tasks in phases for task in tasks]
        tokens = [f"{os.getpid()}-{id(self)}-{next(_TOKENS)}" for _ in flat] if keep else []
        runs: list[list[dict]] = [[] for _ in flat]
        final: dict[int, dict] = {}
        last: tuple | None = None
        try:
            for p in range(max(1, cfg.max_processes)):
                for i, (backends, task) in enumerate(flat):
                    if i in final:
                        continue
                    rs = runs[i]
                    counted = clean_runs(rs) if cfg.skip_contended else rs
                    if counted and len(counted) >= cfg.processes_for(counted[0]["median"]) and processes_agree(
                            [x["median"] for x in counted], cfg.agree):
                        final[i] = combine_runs(rs, cfg.skip_contended)
                        continue
                    names = tuple(b.name for b in backends)
                    switched = last is not None and names != last
                    last = names
                    r = self._window(backends, task, p, tokens[i] if keep else "", bool(rs), timeout, switched)
                    if not r.get("valid"):
                        if rs and not r.get("failed"):
                            r = {**r, "error_text": f"{r.get('error_text', '')} (in window {p + 1}; window 1 was valid)"}
                        final[i] = r
                        continue
                    rs.append(r)
        finally:
            if keep:
                held: dict[int, tuple] = {}
                for i, (backends, _) in enumerate(flat):
                    worker = self.worker_for(backends, 0)
                    held.setdefault(id(worker), (worker, []))[1].append(tokens[i])
                for worker, toks in held.values():
                    if worker.alive():
                        worker.run(ReleaseTask(toks), timeout)
        out = [final[i] if i in final else combine_runs(runs[i], cfg.skip_contended) for i in range(len(flat))]
        per_phase, pos = [], 0
        for _, tasks in phases:
            per_phase.append(out[pos:pos + len(tasks)])
            pos += len(tasks)
        return per_phase

    def _window(self, backends, task, p: int, token: str, compiled: bool, timeout: float,
                switched: bool = False) -> dict:
        """One window of one task: a fresh compile in worker ``p``, or (``token``) a retiming of the kept one
        in worker 0, which compiles it again (and keeps it) if the worker has lost it. ``switched``: the
        previous window timed another backend, so this one warms up for ``timing.switch_warmup``."""
        timing = self.timing
        if switched and timing.switch_warmup > timing.warmup_seconds:
            timing = replace(timing, warmup_seconds=timing.switch_warmup)
        if token and compiled:
            r = self.worker_for(backends, 0).run(RetimeTask(token, timing), timeout)
            if not r.get("lost"):
                return r
        t = task() if callable(task) else task
        t = replace(t, keep=token, timing=timing) if token else replace(t, timing=timing)
        return self.worker_for(backends, 0 if token else p).run(t, timeout)

    def measure_many(self, chunk: Sequence[Candidate], reference: Mapping[str, np.ndarray], family: str = "") -> list[Measurement]:
        """Measures ``chunk`` (candidates of one backend, none cached) in passes, commits each; in order."""
        return self.measure_chunks([chunk], reference, family)[0] if chunk else []

    def measure_chunks(self, chunks: Sequence[Sequence[Candidate]], reference: Mapping[str, np.ndarray],
                       family: str = "") -> list[list[Measurement]]:
        """Measures ``chunks`` (each of candidates of one backend, none cached) with their passes interleaved
        (:meth:`run_phases`), commits each; in order, one list per chunk."""
        chunks = [ch for ch in chunks if ch]
        phases = [([ch[0].backend], [lambda c=c: self._task(c, reference) for c in ch])  # built per pass: feeds can be large
                  for ch in chunks]
        return [[self._measurement(c, r, family) for c, r in zip(ch, rs)]
                for ch, rs in zip(chunks, self.run_phases(phases))]

    def measure_one(self, c: Candidate, reference: Mapping[str, np.ndarray], family: str = "") -> Measurement:
        """Measures one candidate now (its processes back to back) and commits it."""
        return self.measure_many([c], reference, family)[0]

    def _measurement(self, c: Candidate, r: dict, family: str) -> Measurement:
        sg = c.subgraph
        m = Measurement(
            key=c.key,
            hardware=self.hardware,
            valid=bool(r.get("valid")),
            samples=list(r.get("samples", [])),
            median=r.get("median"),
            spread=r.get("spread"),
            compile_seconds=r.get("compile_seconds"),
            max_abs_error=r.get("max_abs_error"),
            max_rel_error=r.get("max_rel_error"),
            threads=self.threads,
            versions=c.backend.versions(),
            family=family,
            error_text=r.get("error_text", ""),
            onnx_bytes=sg.skeleton_onnx(),
            extra={"pattern": c.pattern, "nodes": len(sg), "node": node_id(), **self._decision(sg),
                   **r.get("extra", {})},
            failed=bool(r.get("failed")),
            protocol=self.timing.name,
        )
        self.record(m)
        return m

    def _decision(self, sg) -> dict:
        """What an evaluation needs to rebuild the search's decision groups from this row alone: the source
        graph's structural hash and the candidate's first node (in topological order)."""
        g = sg.graph
        cache = self.__dict__.setdefault("_source_hashes", {})
        if id(g) not in cache:
            cache.clear()  # one graph at a time: the cache must not keep old graphs alive
            cache[id(g)] = (g, g.whole().hash)
        return {"source": cache[id(g)][1], "first_node": (sg.mask & -sg.mask).bit_length() - 1}

    def record(self, m: Measurement) -> bool:
        """Commits ``m`` (when there is a database) and counts it if it was stored. True if stored."""
        stored = self.db.commit(m) if self.db is not None else True
        m.committed = stored  # type: ignore[attr-defined]  (not a field: never stored)
        if stored:
            self.measured += 1
        else:
            self.refused += 1
        return stored


def reference_of(reference, c: Candidate) -> Mapping[str, np.ndarray]:
    """The reference activations for candidate ``c``: ``reference`` itself, or what it gives for ``c``."""
    return reference(c) if callable(reference) else reference


def processes_agree(medians: Sequence[float], tol: float) -> bool:
    """True when the two fastest per-process medians are within ``tol`` of each other (or there is one)."""
    if len(medians) < 2:
        return True
    a, b = sorted(medians)[:2]
    return a > 0 and b / a - 1 <= tol


def clean_runs(runs: Sequence[dict]) -> list[dict]:
    """The windows of ``runs`` that were not contended."""
    return [r for r in runs if not r.get("contended")]


def combine_runs(runs: Sequence[dict], skip_contended: bool = False) -> dict:
    """One result from the per-process results of a candidate: the fastest process's median, every process's
    value recorded in ``extra`` (``process_medians``, ``calls_per_sample``, ``cpu_pressure``, ``cpu_steal``,
    ``contended``, and ``window_offsets``: when each window started, in seconds after the first). With
    ``skip_contended`` the latency combines the clean windows only, and the result is contended only when
    none was clean; otherwise it is contended when any window was."""
    clean = clean_runs(runs) if skip_contended else []
    use = clean or list(runs)
    best = min(use, key=lambda r: r["median"])
    pressures = [r["pressure"] for r in runs if r.get("pressure") is not None]
    steals = [r["steal"] for r in runs if r.get("steal") is not None]
    extra = {
        "process_medians": [r["median"] for r in runs],
        "calls_per_sample": best.get("calls_per_sample", 1),
        "cpu_pressure": max(pressures) if pressures else None,
        "cpu_steal": max(steals) if steals else None,
        "contended": not clean if skip_contended else any(r.get("contended") for r in runs),
        "retimed": sum(r.get("retimed", 0) for r in runs),
        "cpus_available": best.get("cpus_available"),
    }
    starts = [r.get("started") for r in runs]
    if len(runs) > 1 and all(isinstance(t, (int, float)) for t in starts):
        extra["window_offsets"] = [round(t - starts[0], 3) for t in starts]  # seconds after the first window
    if skip_contended:
        extra["contended_windows"] = len(runs) - len(clean)
    out = {k: v for k, v in runs[0].items() if k not in ("samples", "median", "spread", "extra")}
    out.update(
        valid=True, median=best["median"], spread=best["spread"],
        samples=[x for r in runs for x in r.get("samples", [])],
        extra={**runs[0].get("extra", {}), **extra},
    )
    return out


def measure_candidates(
    candidates: Iterable[Candidate], reference: Mapping[str, np.ndarray], db=None, **runner_kwargs
) -> list[Measurement]:
    """One-shot convenience: a Runner for one batch of candidates."""
    with Runner(db=db, **runner_kwargs) as r:
        return r.measure(list(candidates), reference)


if __name__ == "__main__":  # a worker started by hand (the old entry; measure.worker is the new one)
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
