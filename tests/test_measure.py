import math
import numpy as np
import pytest

from collage_ml.backends.onnxruntime_backend import OnnxRuntimeBackend
from collage_ml.candidates import Candidate, enumerate_candidates
from collage_ml.ir import import_model
from collage_ml.measure.runner import Runner
from collage_ml.measure.timing import TimingConfig, Tolerance, compare, spread_of, time_callable
from tests.fake_backends import AbortFixture, HangFixture, RaiseFixture, WrongNumbersFixture

# one process per candidate: these tests are about placement and storage, not the protocol (test_protocol.py)
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=10, time_cap=0.2, processes=1, max_processes=1)


def test_compare_tolerance_rule():
    w = np.array([1.0, 10.0, 100.0], np.float32)
    assert compare([w * (1 + 5e-4)], [w], ["y"]).ok
    bad = compare([w + np.array([0, 0, 1.0], np.float32)], [w], ["y"])
    assert not bad.ok and "max abs error 1" in bad.detail
    assert not compare([w[:2]], [w], ["y"]).ok
    assert not compare([np.array([1, 2])], [np.array([1, 3])], ["i"]).ok
    nan = w.copy()
    nan[0] = np.nan
    assert not compare([nan], [w], ["y"]).ok
    # the absolute part scales with the tensor's magnitude
    big = np.full(100, 50.0, np.float32)
    big[0] = 0.0
    got = big.copy()
    got[0] = 3e-3
    assert compare([got], [big], ["y"], Tolerance(rtol=1e-3, atol=1e-4)).ok


def test_time_callable_stops_and_reports():
    calls = []
    r = time_callable(lambda: calls.append(1), FAST)
    assert 3 <= len(r.samples) <= 10
    assert 0 < r.median < 0.01  # an append takes well under 10 ms, and a clock that reads 0 is broken
    assert r.median == float(np.median(r.samples)) and r.spread == pytest.approx(spread_of(r.samples))
    assert len(calls) >= len(r.samples) + 1


@pytest.fixture(scope="module")
def graph():
    return import_model("resnet50-tiny")


def _cands(graph, backend, n):
    out = []
    for c in enumerate_candidates(graph, [backend], max_region_size=3):
        if len(c.subgraph) <= 3:
            out.append(c)
        if len(out) == n:
            break
    return out


def test_runner_measures_valid_candidates(graph):
    ort = OnnxRuntimeBackend()
    cands = _cands(graph, ort, 4)
    with Runner(threads=1, timing=FAST) as r:
        ms = r.measure(cands, graph.reference())
    assert all(m.valid for m in ms), [m.error_text for m in ms]
    for m in ms:
        assert m.median > 0 and len(m.samples) >= 3 and m.threads == 1
        assert m.max_abs_error < 1e-3 and m.compile_seconds is not None
        assert m.key.backend == "onnxruntime" and m.hardware


def test_broken_backends_are_invalid_and_the_run_continues(graph):
    ref = graph.reference()
    sg = _cands(graph, OnnxRuntimeBackend(), 1)[0].subgraph
    cands = [
        Candidate(sg, WrongNumbersFixture()),
        Candidate(sg, AbortFixture()),
        Candidate(sg, HangFixture()),
        Candidate(sg, RaiseFixture()),
        Candidate(sg, OnnxRuntimeBackend()),
    ]
    with Runner(threads=1, timing=FAST, timeout=5) as r:
        ms = {c.backend.name: r.measure_one(c, ref) for c in cands}
    assert not ms["test-wrong-numbers"].valid and "wrong numbers" in ms["test-wrong-numbers"].error_text
    assert not ms["test-abort"].valid and "SIGABRT" in ms["test-abort"].error_text
    assert not ms["test-hang"].valid and "timeout" in ms["test-hang"].error_text
    assert not ms["test-raise"].valid and "always fails" in ms["test-raise"].error_text
    assert ms["onnxruntime"].valid
    for name, m in ms.items():
        assert m.cost.is_invalid == (name != "onnxruntime")


def test_cache_hits_remeasure_nothing(graph, tmp_path):
    from collage_ml.db import Database

    ort = OnnxRuntimeBackend()
    cands = _cands(graph, ort, 3)
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=FAST) as r:
            first = r.measure(cands, graph.reference())
            assert r.measured == 3 and r.cache_hits == 0
        assert db.stats()["valid"] == 3
        # onnx bytes are kept for featurizers, without the large weights
        assert all(db.subgraph_onnx(c.subgraph.hash) for c in cands)
        with Runner(db=db, threads=1, timing=FAST) as r:
            again = r.measure(cands, graph.reference())
            assert r.measured == 0 and r.cache_hits == 3
            assert r.worker.proc is None  # no worker was even started
        assert [m.median for m in again] == [m.median for m in first]


def test_repeated_block_is_measured_once():
    g = import_model("bert-tiny")
    ort = OnnxRuntimeBackend()
    # bert-tiny has two identical layers: their LayerNormalization nodes share a hash
    lns = [n.index for n in g.nodes if n.op_type == "LayerNormalization"]
    cands = [Candidate(g.subgraph([i]), ort) for i in lns]
    assert len({c.subgraph.hash for c in cands}) < len(cands)
    with Runner(threads=1, timing=FAST) as r:
        ms = r.measure(cands, g.reference())
    assert r.measured == len({c.subgraph.hash for c in cands})
    assert all(m.valid for m in ms)


def test_boundary_costs_measured_in_chains(tmp_path):
    from collage_ml.backends import get_backend
    from collage_ml.db import Database
    from collage_ml.measure.boundary import BoundaryTable, measure_boundaries

    backends = [OnnxRuntimeBackend(), get_backend("torch")]
    with Database(tmp_path / "b.db") as db, Runner(db=db, threads=1, timing=FAST) as r:
        ms = measure_boundaries(r, backends, sizes=(256, 65536))
        assert len(ms) == 8 and all(m.valid for m in ms), [m.error_text for m in ms]
        for m in ms:
            assert m.extra["chain"] > 0 and m.median is not None and 0 <= m.median < 0.1, m
        assert len(db) == 0 and len(db.boundaries()) == 8  # records of their own kind, not candidates
        table = BoundaryTable(db.boundaries())
        assert table.cost("onnxruntime", "torch", 1024) is not None
        big = table.cost("torch", "onnxruntime", 10**6)
        assert big is not None and 0 <= big < 0.1, big
        assert table.cost("onnxruntime", "tvm", 1024) is None
        before = len(db.boundaries())
        again = measure_boundaries(r, backends, sizes=(256,))
        assert len(db.boundaries()) == before  # read back from the database, nothing re-measured
        assert [m.median for m in again] == [m.median for m in ms if m.key.nbytes == 1024]


def test_closing_a_runner_asks_every_worker_to_exit_before_waiting_for_any():
    """Workers exit in parallel: one after the other took 2.3 s for three (benchmarks/runner_close.py)."""
    from collage_ml.measure.runner import Runner

    calls = []

    class FakeWorker:
        def __init__(self, name):
            self.name = name

        def request_stop(self):
            calls.append(("ask", self.name))

        def stop(self):
            calls.append(("reap", self.name))

    r = Runner.__new__(Runner)
    r._pools = {None: [FakeWorker("a"), FakeWorker("b")], "tvm": [FakeWorker("c")]}
    r.close()
    assert calls[:3] == [("ask", "a"), ("ask", "b"), ("ask", "c")]
    assert sorted(calls[3:]) == [("reap", "a"), ("reap", "b"), ("reap", "c")]


def test_a_worker_asked_to_stop_exits_and_is_reaped():
    from collage_ml.measure.worker import Worker

    w = Worker(1)
    w.start()
    proc = w.proc
    w.request_stop()
    w.request_stop()  # asking twice sends once
    assert proc.wait(30) == 0
    w.stop()
    assert w.proc is None and not w._stopping


def test_stale_cache_hits_are_rescaled_by_anchors_timed_again(graph, tmp_path):
    """A machine moves between hours as one (docs/results/cost-models.md, "The Xeon a day later"): hits older
    than ``stale_after`` join at this hour's scale, by the ratio a few of them show when timed again; the
    database keeps what it stored."""
    import sqlite3
    import time

    from collage_ml.db import Database

    ort = OnnxRuntimeBackend()
    cands = _cands(graph, ort, 4)
    path = tmp_path / "m.db"
    with Database(path) as db, Runner(db=db, threads=1, timing=FAST) as r:
        r.measure(cands, graph.reference())
    # the stored rows become two days old and ten times slower: the machine of another day (ten, so that a
    # busy moment of this one, which read these small kernels 2.4x slower beside the parallel suite, still
    # reads as a machine that moved)
    with sqlite3.connect(path) as c:
        c.execute("UPDATE measurements SET median = median * 10, timestamp = ?", (time.time() - 2 * 86400,))
        stored = dict(c.execute("SELECT subgraph_hash, median FROM measurements"))
    with Database(path) as db:
        with Runner(db=db, threads=1, timing=FAST) as r:  # the default: hits as stored
            as_stored = r.measure(cands, graph.reference())
            assert r.drift == {} and r.anchor_measurements == 0 and r.worker.proc is None
        assert [m.median for m in as_stored] == [stored[c.subgraph.hash] for c in cands]
        with Runner(db=db, threads=1, timing=FAST, stale_after=30 * 86400) as r:  # not stale yet
            assert [m.median for m in r.measure(cands, graph.reference())] == [m.median for m in as_stored]
            assert r.anchor_measurements == 0
        with Runner(db=db, threads=1, timing=FAST, stale_after=3600, anchors=2) as r:
            again = r.measure(cands, graph.reference())
            ratio = r.drift["onnxruntime"]["ratio"]
            assert 0.03 < ratio < 0.5, ratio  # about 1/10
            assert r.anchor_measurements == 2 and r.measured == 0 and r.cache_hits == 4
            assert r.drift["onnxruntime"]["anchors"] == 2 and 47 < r.drift["onnxruntime"]["age_hours"] < 49
            assert [m.median for m in again] == pytest.approx([stored[c.subgraph.hash] * ratio for c in cands])
            assert all(m.extra["rescaled"] == ratio for m in again)
            assert r.lookup(cands[0].key).median == pytest.approx(stored[cands[0].subgraph.hash] * ratio)
    with sqlite3.connect(path) as c:  # nothing stored was changed or added
        assert dict(c.execute("SELECT subgraph_hash, median FROM measurements")) == stored
