"""The measurement protocol (measure/timing.py, Runner): its rules on fake clocks and a moded fake backend,
its name in the database key, failed-versus-invalid, and the worker's import path."""

from __future__ import annotations

import os
import shutil
import sqlite3
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from collage_ml.candidates import Candidate
from collage_ml.cost import MAX_ATTEMPTS, PROTOCOL, CandidateKey, Measurement
from collage_ml.db import Database
from collage_ml.ir import from_onnx
from collage_ml.measure import timing
from collage_ml.measure.runner import Runner, Worker, combine_runs, processes_agree, worker_path
from collage_ml.measure.timing import LEGACY, M2, M3, M4, M5, TimingConfig, time_callable
from tests.fake_backends import AbortFixture, HangFixture
from tests.fake_timing import CountingFixture, KeptCount, ModedFixture, compiles
from tests.helpers import chain_model

HW = "cpu-test-t2-000000000000"
REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """A clock that advances only when the timed function runs: each call costs ``per_call`` seconds."""

    def __init__(self, per_call: float):
        self.t = 0.0
        self.per_call = per_call
        self.calls = 0

    def __call__(self) -> float:
        return self.t

    def fn(self) -> None:
        self.t += self.per_call
        self.calls += 1


# ----------------------------------------------------------------------------- rules, on a fake clock


def test_short_calls_are_batched_into_samples_of_at_least_min_sample_seconds():
    clock = FakeClock(20e-6)
    cfg = replace(TimingConfig(), max_pressure=float("inf"), max_steal=float("inf"))
    r = time_callable(clock.fn, cfg, clock=clock)
    assert r.calls_per_sample == 50  # 1 ms / 20 us
    assert all(abs(s - 20e-6) < 1e-12 for s in r.samples)
    # at least min_repeats samples and min_seconds of timing, then the (zero) spread stops it
    assert round(cfg.min_seconds / 1e-3) <= len(r.samples) <= round(cfg.min_seconds / 1e-3) + 1
    assert r.median == pytest.approx(20e-6)


def test_long_calls_are_one_per_sample_and_the_cap_bounds_them():
    clock = FakeClock(0.2)
    cfg = replace(TimingConfig(), max_pressure=float("inf"), max_steal=float("inf"))
    r = time_callable(clock.fn, cfg, clock=clock)
    assert r.calls_per_sample == 1
    assert len(r.samples) == 1  # the 0.1 s cap stops it after the first 0.2 s sample
    r = time_callable(clock.fn, replace(M2, max_pressure=float("inf")), clock=clock)
    assert len(r.samples) == 2  # m2's 0.3 s cap after the second


def test_legacy_protocol_is_one_call_per_sample_and_five_samples():
    clock = FakeClock(20e-6)
    r = time_callable(clock.fn, LEGACY, clock=clock)
    assert r.calls_per_sample == 1 and len(r.samples) == 5
    assert LEGACY.name == "m1" and TimingConfig().name == PROTOCOL != LEGACY.name
    # the default is m5 (since 2026-12-02), field for field; m1 to m4 never act on steal
    assert PROTOCOL == "m5" and TimingConfig() == M5
    assert all(p.max_steal == float("inf") and not p.skip_contended for p in (LEGACY, M2, M3, M4))
    assert M3.max_processes == 3 and M5.max_processes == 5


def test_contended_windows_are_retimed_and_marked(monkeypatch):
    stall = iter(range(0, 10**9, 10**6))  # +1 s of CPU stall per reading: every window is contended
    monkeypatch.setattr(timing, "cpu_stall_us", lambda: float(next(stall)))
    clock = FakeClock(20e-6)
    r = time_callable(clock.fn, TimingConfig(), clock=clock)
    assert r.contended and r.pressure == 1.0 and r.retimed == TimingConfig().contention_retries

    monkeypatch.setattr(timing, "cpu_stall_us", lambda: 5.0)  # no stall at all
    monkeypatch.setattr(timing, "steal_seconds", lambda cpus=None: 7.0)  # and no steal (the default acts on it)
    r = time_callable(clock.fn, TimingConfig(), clock=clock)
    assert not r.contended and r.pressure == 0.0 and r.retimed == 0


def test_cpu_pressure_is_read_unless_switched_off(monkeypatch, tmp_path):
    """PSI's "some" total is read from the file; COLLAGE_ML_CPU_PRESSURE=off makes it unknown, so known load
    (the suite's other xdist worker) cannot mark a window contended, while steal still counts."""
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=123456\nfull avg10=0.00 total=0\n")
    monkeypatch.setattr(timing, "_PSI", str(psi))
    monkeypatch.delenv(timing.PRESSURE_ENV, raising=False)
    assert timing.cpu_stall_us() == 123456.0
    monkeypatch.setenv(timing.PRESSURE_ENV, "off")
    assert timing.cpu_stall_us() is None
    # a window with unknown pressure but too much steal is still contended
    steal = iter(range(0, 10**6))
    monkeypatch.setattr(timing, "steal_seconds", lambda cpus=None: float(next(steal)))
    clock = FakeClock(20e-6)
    r = time_callable(clock.fn, TimingConfig(), clock=clock)
    assert r.pressure is None and r.contended


def test_processes_needed_agree_and_combine():
    cfg = TimingConfig()
    assert cfg.processes_for(20e-6) == cfg.processes == 3
    assert cfg.processes_for(0.05) == cfg.long_processes == 2
    assert M2.processes_for(20e-6) == 2 and M2.processes_for(0.05) == 1
    assert processes_agree([1.0], 0.05)
    assert processes_agree([1.04, 1.0, 2.0], 0.05) and not processes_agree([1.0, 1.2], 0.05)
    runs = [
        {"valid": True, "median": 2.0, "spread": 0.01, "samples": [2.0], "pressure": 0.0, "calls_per_sample": 3},
        {"valid": True, "median": 1.0, "spread": 0.02, "samples": [1.0], "pressure": 0.3, "contended": True,
         "calls_per_sample": 5},
    ]
    c = combine_runs(runs)
    assert c["median"] == 1.0 and c["spread"] == 0.02 and c["samples"] == [2.0, 1.0]
    assert c["extra"]["process_medians"] == [2.0, 1.0] and c["extra"]["calls_per_sample"] == 5
    assert c["extra"]["contended"] is True and c["extra"]["cpu_pressure"] == 0.3


def test_stolen_windows_are_recorded_and_under_m5_retimed_and_marked(monkeypatch):
    """Steal (the hypervisor's, from /proc/stat) is recorded under every protocol; under m5 a window with
    more than max_steal of the CPUs' time stolen is contended: retimed, then marked."""
    monkeypatch.setattr(timing, "cpu_stall_us", lambda: 5.0)  # no CPU pressure inside the VM
    stolen = iter(range(0, 10**6))  # +1 s stolen per reading: every window is fully stolen
    monkeypatch.setattr(timing, "steal_seconds", lambda cpus=None: float(next(stolen)))
    clock = FakeClock(20e-6)
    r = time_callable(clock.fn, M3, clock=clock)
    assert r.steal == 1.0 and not r.contended and r.retimed == 0  # m3 records steal, never acts on it
    r = time_callable(clock.fn, M5, clock=clock)
    assert r.steal == 1.0 and r.contended and r.retimed == M5.contention_retries

    # the first window stolen, the retimed one clean: the clean one is kept
    readings = iter([0.0, 1.0, 1.0, 1.0])
    monkeypatch.setattr(timing, "steal_seconds", lambda cpus=None: next(readings))
    r = time_callable(clock.fn, M5, clock=clock)
    assert r.steal == 0.0 and not r.contended and r.retimed == 1

    monkeypatch.setattr(timing, "steal_seconds", lambda cpus=None: None)  # unknown (not Linux, no /proc)
    r = time_callable(clock.fn, M5, clock=clock)
    assert r.steal is None and not r.contended


def test_steal_seconds_reads_the_steal_column_of_the_usable_cpus(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 10 100 0 0 0 7 0 0\n"
                    "cpu0 5 0 5 50 0 0 0 3 0 0\n"
                    "cpu1 5 0 5 50 0 0 0 4 0 0\n"
                    "intr 1 2 3\n")
    monkeypatch.setattr(timing, "_STAT", str(stat))
    assert timing.steal_seconds([0, 1]) == pytest.approx(0.07)
    assert timing.steal_seconds([1]) == pytest.approx(0.04)
    monkeypatch.setattr(timing, "_STAT", str(tmp_path / "missing"))
    assert timing.steal_seconds([0]) is None


def test_m5_combines_the_clean_windows_only():
    runs = [
        {"valid": True, "median": 1.0, "spread": 0.0, "samples": [1.0], "steal": 0.3, "contended": True},
        {"valid": True, "median": 2.0, "spread": 0.0, "samples": [2.0], "steal": 0.0},
        {"valid": True, "median": 2.1, "spread": 0.0, "samples": [2.1], "steal": 0.0},
    ]
    c = combine_runs(runs, skip_contended=True)
    assert c["median"] == 2.0 and c["extra"]["contended"] is False and c["extra"]["contended_windows"] == 1
    assert "window_offsets" not in c["extra"]  # the windows' start times are unknown here
    timed = [{**r, "started": 100.0 + 2.5 * i} for i, r in enumerate(runs)]
    assert combine_runs(timed)["extra"]["window_offsets"] == [0.0, 2.5, 5.0]
    assert c["extra"]["cpu_steal"] == 0.3 and c["extra"]["process_medians"] == [1.0, 2.0, 2.1]
    # m3's rule: the fastest window, and contended when any window was
    c = combine_runs(runs)
    assert c["median"] == 1.0 and c["extra"]["contended"] is True
    # no clean window at all: the fastest, marked contended
    c = combine_runs([runs[0], {**runs[1], "contended": True}], skip_contended=True)
    assert c["median"] == 1.0 and c["extra"]["contended"] is True


def test_m5_replaces_contended_windows_up_to_max_processes(monkeypatch):
    """A window that came out contended does not count: the task gets another, in a later pass, up to
    max_processes; m3 stops at its three windows whatever they were."""

    class B:
        name = "fake"

    def scripted(script):
        calls = {}

        def window(self, backends, task, p, token, compiled, timeout, switched=False):
            calls.setdefault(task, 0)
            contended, median = script[task][calls[task]]
            calls[task] += 1
            return {"valid": True, "median": median, "spread": 0.0, "samples": [median], "contended": contended}
        return window, calls

    script = {
        "clean": [(False, 1e-4)] * 5,
        "stolen": [(True, 0.5e-4), (True, 0.6e-4), (False, 1.02e-4), (False, 1e-4), (False, 1.01e-4)],
        "always": [(True, 2e-4)] * 5,
    }
    cfg = replace(M5, keep_compiled=False)
    window, calls = scripted(script)
    monkeypatch.setattr(Runner, "_window", window)
    r = Runner.__new__(Runner)
    r.timing, r.timeout = cfg, 1.0
    clean, stolen, always = r.run_passes([B()], ["clean", "stolen", "always"])
    assert calls == {"clean": 3, "stolen": 5, "always": 5}
    assert clean["median"] == 1e-4 and not clean["extra"]["contended"]
    assert stolen["median"] == 1e-4 and not stolen["extra"]["contended"]
    assert stolen["extra"]["contended_windows"] == 2
    assert always["extra"]["contended"] and always["median"] == 2e-4

    window, calls = scripted(script)
    monkeypatch.setattr(Runner, "_window", window)
    r.timing = replace(M3, keep_compiled=False)
    clean, stolen, always = r.run_passes([B()], ["clean", "stolen", "always"])
    assert calls == {"clean": 3, "stolen": 3, "always": 3}
    assert stolen["median"] == 0.5e-4 and stolen["extra"]["contended"]


# ----------------------------------------------------------------------------- the Runner, real processes


@pytest.fixture(scope="module")
def chain():
    return from_onnx(chain_model(), name="chain")


def _cand(graph, backend):
    return Candidate(graph.subgraph([0, 1]), backend, "test")


#: m3's runner rules, without contention (m5's own rules have their tests below)
QUIET = replace(M3, max_pressure=float("inf"), contention_retries=0)
QUIET_M2 = replace(M2, max_pressure=float("inf"), contention_retries=0)


def test_per_process_modes_are_seen_through(chain, tmp_path):
    """Under m2, the first worker runs in a slow mode (2x), the second in a fast one: the latency is the fast
    mode."""
    b = ModedFixture(counter=str(tmp_path / "counter"), fast_us=300.0, slow_us=600.0)
    with Runner(threads=1, timing=QUIET_M2) as r:
        (m,) = r.measure([_cand(chain, b)], chain.reference())
    assert m.valid, m.error_text
    pm = m.extra["process_medians"]
    assert len(pm) == 3  # slow, fast, slow: the two fastest never agree, so it stops at max_processes
    assert pm[0] > 1.6 * pm[1] and m.median == min(pm)
    assert 280e-6 < m.median < 420e-6
    assert m.protocol == "m2" and m.extra["calls_per_sample"] >= 2


def test_one_process_under_the_legacy_protocol(chain, tmp_path):
    b = ModedFixture(counter=str(tmp_path / "counter"), fast_us=300.0, slow_us=600.0)
    with Runner(threads=1, timing=LEGACY) as r:
        (m,) = r.measure([_cand(chain, b)], chain.reference())
    assert m.valid and m.protocol == "m1" and len(m.extra["process_medians"]) == 1
    assert m.median > 500e-6  # the slow first process is all it saw


def _cands(graph, backend):
    return [Candidate(graph.subgraph(nodes), backend, "test") for nodes in ([0, 1], [1, 2], [2, 3])]


def test_kept_candidates_are_compiled_once_and_timed_in_several_windows(chain, tmp_path):
    counter = str(tmp_path / "compiles")
    b = CountingFixture(counter=counter)
    with Runner(threads=1, timing=QUIET) as r:
        ms = r.measure(_cands(chain, b), chain.reference())
        assert len(r._pools[r._group([b])]) == 1  # one worker did it all
        assert r.worker_for([b], 0).run(KeptCount(), 30)["kept"] == 0  # released after the chunk
    assert all(m.valid and m.protocol == "m3" for m in ms), [m.error_text for m in ms]
    assert all(len(m.extra["process_medians"]) >= 2 for m in ms)  # windows, each with its own median
    assert all(m.median == min(m.extra["process_medians"]) for m in ms)
    assert compiles(counter) == 3  # once per candidate; m2 compiles once per window


def test_m2_compiles_each_window_afresh(chain, tmp_path):
    counter = str(tmp_path / "compiles")
    with Runner(threads=1, timing=QUIET_M2) as r:
        ms = r.measure(_cands(chain, CountingFixture(counter=counter)), chain.reference())
    windows = sum(len(m.extra["process_medians"]) for m in ms)
    assert windows >= 6 and compiles(counter) == windows


def test_a_kept_candidate_lost_with_its_worker_is_compiled_again(chain, tmp_path, monkeypatch):
    """A worker that dies between windows (another candidate crashed it) loses what it kept: the next window
    compiles the candidate again instead of failing it."""
    counter = str(tmp_path / "compiles")
    window = Runner._window
    killed = []

    def kill_before_second_window(self, backends, task, p, token, compiled, timeout, switched=False):
        if p == 1 and not killed:
            self.worker_for(backends, 0).kill()
            killed.append(token)
        return window(self, backends, task, p, token, compiled, timeout, switched)

    monkeypatch.setattr(Runner, "_window", kill_before_second_window)
    with Runner(threads=1, timing=QUIET) as r:
        ms = r.measure(_cands(chain, CountingFixture(counter=counter)), chain.reference())
    assert killed and all(m.valid for m in ms), [m.error_text for m in ms]
    assert all(len(m.extra["process_medians"]) >= 2 for m in ms)
    assert compiles(counter) == 3 + len(ms)  # each lost candidate compiled once more, in the fresh worker


def test_candidates_of_several_graphs_in_one_call_each_get_their_own_reference(chain):
    other = from_onnx(chain_model(seed=1), name="other")  # same structure, other weights: other activations
    cands = [_cand(chain, CountingFixture(counter="")), Candidate(other.subgraph([2, 3]), CountingFixture(counter=""), "t")]
    refs = {id(chain): chain.reference(), id(other): other.reference()}
    with Runner(threads=1, timing=QUIET) as r:
        ms = r.measure(cands, lambda c: refs[id(c.subgraph.graph)])
        assert all(m.valid for m in ms), [m.error_text for m in ms]
        (wrong,) = r.measure([Candidate(other.subgraph([0, 1]), CountingFixture(counter=""), "t")], refs[id(chain)])
    assert not wrong.valid and "wrong numbers" in wrong.error_text  # the other graph's reference is checked


def test_kept_candidates_see_one_process_only(chain, tmp_path):
    """The trade m3 makes: one process per candidate, so a mode that lasts a whole process is not seen
    through (m2's fresh processes see through it: test_per_process_modes_are_seen_through)."""
    b = ModedFixture(counter=str(tmp_path / "counter"), fast_us=300.0, slow_us=600.0)
    with Runner(threads=1, timing=QUIET) as r:
        (m,) = r.measure([_cand(chain, b)], chain.reference())
    assert m.valid and len(m.extra["process_medians"]) >= 2 and m.median > 500e-6


class _OtherCounting(CountingFixture):
    name = "test-counting-b"


def _window_order(monkeypatch) -> list:
    """Records (backend, pass, switched) for every window the Runner times."""
    window = Runner._window
    seen: list = []

    def record(self, backends, task, p, token, compiled, timeout, switched=False):
        seen.append((backends[0].name, p, switched))
        return window(self, backends, task, p, token, compiled, timeout, switched)

    monkeypatch.setattr(Runner, "_window", record)
    return seen


@pytest.mark.parametrize("interleave", [False, True])
def test_interleaved_passes_put_every_backend_between_a_candidates_windows(chain, monkeypatch, interleave):
    """m4 gives every backend's chunk its window of pass p before any gets pass p + 1, so one candidate's
    windows lie a whole round of backends apart; m3 finishes one backend before the next. The first window
    after a switch of backend is marked, for its longer warm-up."""
    seen = _window_order(monkeypatch)
    a, b = CountingFixture(counter=""), _OtherCounting(counter="")
    cfg = replace(QUIET, interleave=interleave, processes=2, long_processes=2, max_processes=2, agree=10.0)
    with Runner(threads=1, timing=cfg) as r:
        ms = r.measure(_cands(chain, a) + _cands(chain, b), chain.reference())
        assert r.worker_for([a], 0).run(KeptCount(), 30)["kept"] == 0  # every chunk released
    assert all(m.valid and len(m.extra["process_medians"]) == 2 for m in ms), [m.error_text for m in ms]
    A, B = a.name, b.name
    if interleave:
        assert [(n, p) for n, p, _ in seen] == [(A, 0)] * 3 + [(B, 0)] * 3 + [(A, 1)] * 3 + [(B, 1)] * 3
        assert [s for _, _, s in seen] == [False, False, False, True, False, False, True, False, False, True, False, False]
    else:
        assert [(n, p) for n, p, _ in seen] == [(A, 0)] * 3 + [(A, 1)] * 3 + [(B, 0)] * 3 + [(B, 1)] * 3
        assert [s for _, _, s in seen].count(True) == 0  # a new phase starts a new pass loop


def test_a_switch_of_backend_warms_up_longer(chain, monkeypatch):
    sent = []
    run = Worker.run

    def spy(self, task, timeout):
        t = getattr(task, "timing", None)
        if t is not None:
            sent.append(t.warmup_seconds)
        return run(self, task, timeout)

    monkeypatch.setattr(Worker, "run", spy)
    cfg = replace(QUIET, interleave=True, processes=1, long_processes=1, max_processes=1, switch_warmup=0.03)
    with Runner(threads=1, timing=cfg) as r:
        ms = r.measure(_cands(chain, CountingFixture(counter="")) + _cands(chain, _OtherCounting(counter="")),
                       chain.reference())
    assert all(m.valid for m in ms)
    assert sent == [cfg.warmup_seconds] * 3 + [0.03] + [cfg.warmup_seconds] * 2


def test_chunks_of_kept_candidates_are_bounded_by_their_inputs(chain, monkeypatch):
    cands = _cands(chain, CountingFixture(counter=""))
    ref = chain.reference()
    with Runner(threads=1, timing=M3) as r:
        assert [len(c) for c in r._chunks(cands, ref)] == [3]
        monkeypatch.setattr(Runner, "KEEP_BYTES", 1)  # every candidate alone over the bound: one per chunk
        assert [len(c) for c in r._chunks(cands, ref)] == [1, 1, 1]
    with Runner(threads=1, timing=replace(M2, pass_chunk=2)) as r:
        assert [len(c) for c in r._chunks(cands, ref)] == [2, 1]  # m2 keeps nothing: only pass_chunk counts


# ----------------------------------------------------------------------------- the protocol is part of the key


def _m(protocol: str, median: float = 1e-3, valid: bool = True, **kw) -> Measurement:
    return Measurement(CandidateKey("h0", "onnxruntime", "1.32.0"), HW, valid, [median], median, 0.0,
                       protocol=protocol, **kw)


def test_rows_of_another_protocol_keep_their_own_key(tmp_path):
    with Database(tmp_path / "m.db") as db:
        assert db.commit(_m("m1", 2e-3)) and db.commit(_m(PROTOCOL, 1e-3))
        assert not db.commit(_m(PROTOCOL, 5e-3))  # a settled key is never overwritten
        assert db.get(_m("m1").key, HW).median == 1e-3  # the current protocol by default
        assert db.get(_m("m1").key, HW, "m1").median == 2e-3
        assert db.known_keys(HW) == {("h0", "onnxruntime", "1.32.0")} and db.known_keys(HW, "m9") == set()
        assert db.stats()["protocols"] == {"m1": 1, PROTOCOL: 1}
        assert len(list(db.measurements(protocol="m1"))) == 1


def _v1_copy(tmp_path) -> Path:
    src = REPO / "datasets" / "cpu-2core-zen4-t1" / "measurements.db"
    if not src.exists():
        pytest.skip("the shipped dataset is not in this checkout")
    dst = tmp_path / "v1.db"
    with sqlite3.connect(f"{src.as_uri()}?mode=ro", uri=True) as s, sqlite3.connect(dst) as d:
        s.backup(d)
    with sqlite3.connect(dst) as c:
        if c.execute("PRAGMA user_version").fetchone()[0] != 1:
            pytest.skip("the shipped dataset is no longer schema 1")
    return dst


def test_schema_1_reads_without_writing_and_migrates_without_loss(tmp_path):
    path = _v1_copy(tmp_path)
    with sqlite3.connect(path) as c:
        n = c.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        n_valid = c.execute("SELECT COUNT(*) FROM measurements WHERE valid = 1").fetchone()[0]
        crashed = c.execute(
            "SELECT COUNT(*) FROM measurements WHERE valid = 0 AND (error_text LIKE 'timeout%' OR error_text LIKE 'worker crashed%')"
        ).fetchone()[0]
    before = path.read_bytes()
    with Database(path, readonly=True) as ro:
        rows = list(ro.measurements())
        assert len(rows) == n and {m.protocol for m in rows} == {"m1"}
        assert sum(m.status == "failed" for m in rows) == crashed
        assert ro.get(rows[0].key, rows[0].hardware) is None  # not the current protocol
        assert ro.get(rows[0].key, rows[0].hardware, "m1") is not None
    assert path.read_bytes() == before  # read-only means read-only
    with Database(path) as db:  # a writable open migrates
        assert db.schema_version == 2
        s = db.stats()
        assert s["total"] == n and s["valid"] == n_valid and s["failed"] == crashed
        assert s["protocols"] == {"m1": n}
        ids = [m.key for m in db.measurements()]
    with Database(path) as again:  # and stays migrated, with every row in its order
        assert [m.key for m in again.measurements()] == ids


# ----------------------------------------------------------------------------- failed is not invalid


def test_a_crash_is_failed_and_retried_up_to_max_attempts(chain, tmp_path):
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=QUIET, timeout=20) as r:
        c = _cand(chain, AbortFixture())
        for attempt in range(1, MAX_ATTEMPTS + 1):
            (m,) = r.measure([c], chain.reference())
            stored = db.get(c.key, r.hardware, r.timing.name)
            assert m.status == "failed" and "worker crashed" in m.error_text
            assert stored.status == "failed" and stored.attempts == attempt
        assert r.measured == MAX_ATTEMPTS and r.cache_hits == 0
        (m,) = r.measure([c], chain.reference())  # no attempts left: reported from the database
        assert r.cache_hits == 1 and m.attempts == MAX_ATTEMPTS
        assert (c.key.subgraph_hash, c.key.backend, c.key.backend_version) in db.known_keys(r.hardware, r.timing.name)


def test_a_valid_measurement_replaces_a_failed_row_and_merge_prefers_it(tmp_path):
    failed = _m(PROTOCOL, valid=False, failed=True)
    failed.median, failed.samples, failed.error_text = None, [], "timeout: no result after 1 s"
    with Database(tmp_path / "a.db") as a, Database(tmp_path / "b.db") as b:
        assert a.commit(failed) and b.commit(_m(PROTOCOL, 3e-3))
        assert a.merge(tmp_path / "b.db") == 1
        got = a.get(failed.key, HW)
        assert got.status == "valid" and got.median == 3e-3 and got.attempts == 2
        assert b.merge(tmp_path / "a.db") == 0  # a settled row never gives way
        assert a.commit(failed) is False  # nor does it to a later failure


def test_hang_is_failed_not_invalid(chain):
    with Runner(threads=1, timing=QUIET, timeout=3) as r:
        (m,) = r.measure([_cand(chain, HangFixture())], chain.reference())
    assert m.status == "failed" and m.error_text.startswith("timeout")


def test_only_committed_measurements_are_counted(chain, tmp_path, monkeypatch):
    from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend

    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=LEGACY) as r:
        monkeypatch.setattr(db, "commit", lambda m: False)  # as if another process had committed the key first
        r.measure([_cand(chain, OnnxRuntimeBackend())], chain.reference())
        assert r.measured == 0 and r.refused == 1


# ----------------------------------------------------------------------------- the worker's import path


def test_worker_does_not_import_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "numpy.py").write_text(
        textwrap.dedent(
            f"""
            open({str(tmp_path / 'SHADOWED')!r}, 'w').close()
            raise ImportError('the shadowing numpy.py was imported')
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert str(tmp_path) not in worker_path()
    w = Worker(threads=1)
    try:
        w.start()  # imports numpy (through collage_ml) in the worker
        assert w.alive()
    finally:
        w.stop()
    assert not (tmp_path / "SHADOWED").exists()


def test_worker_path_keeps_directories_that_modules_came_from(tmp_path, monkeypatch):
    pkg = tmp_path / "userbackends_for_test"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.import_module("userbackends_for_test")
    try:
        assert str(tmp_path) in worker_path()
    finally:
        import sys

        sys.modules.pop("userbackends_for_test", None)
    shutil.rmtree(pkg)
    assert os.path.isdir(tmp_path)
