"""In-context costs: the table's lookup, the DP's use of it, and the real measurement stored once per machine."""

import pytest

from collage_ml.backends import resolve_backends
from collage_ml.candidates import Candidate
from collage_ml.db import Database
from collage_ml.ir import from_onnx
from collage_ml.measure.boundary import BoundaryTable
from collage_ml.measure import context
from collage_ml.measure.context import ContextTable, context_key, copies_for, measure_context, outputs_key
from collage_ml.measure.records import BoundaryCost, boundary_key
from collage_ml.measure.runner import Runner
from collage_ml.search.dp import solve
from tests.fake_backends import FakeCostBackend
from tests.helpers import chain_model

A, B = FakeCostBackend("fake-a"), FakeCostBackend("fake-b")


def rec(backend, nbytes, seconds, valid=True):
    return BoundaryCost(context_key(backend, nbytes), "hw", valid, [seconds], seconds, 0.0)


def test_table_interpolates_in_bytes_and_holds_past_the_largest_size():
    t = ContextTable([rec(A, 0, 1e-6), rec(A, 1000, 11e-6), rec(A, 4000, 2e-6), rec(B, 0, 5e-6, valid=False)])
    assert t.seconds("fake-a", 0) == pytest.approx(1e-6)
    assert t.seconds("fake-a", 500) == pytest.approx(6e-6)  # linear in bytes, not in log-bytes
    assert t.seconds("fake-a", 2500) == pytest.approx(6.5e-6)
    assert t.seconds("fake-a", 10**9) == pytest.approx(2e-6)  # flat past 4000
    assert t.seconds("fake-b", 100) == 0.0  # only an invalid record: never measured
    assert t.seconds("nobody", 100) == 0.0


def out(backend, nbytes, seconds):
    return BoundaryCost(outputs_key(backend, nbytes), "hw", True, [seconds], seconds, 0.0)


def test_output_memory_is_linear_from_zero_and_flat_past_the_largest_size():
    t = ContextTable([out(A, 1000, 10e-6), out(A, 4000, 40e-6)])
    assert t.output_seconds("fake-a", 0) == 0.0
    assert t.output_seconds("fake-a", 500) == pytest.approx(5e-6)
    assert t.output_seconds("fake-a", 2500) == pytest.approx(25e-6)
    assert t.output_seconds("fake-a", 10**6) == pytest.approx(40e-6)
    assert t.seconds("fake-a", 1000) == 0.0  # output records are not constants'
    assert t.output_seconds("fake-b", 1000) == 0.0


def test_a_partition_pays_for_its_constants_and_its_outputs(charged):
    g = _chain()
    t = ContextTable([rec(A, 0, 1.0), rec(A, 64 * 64 * 4, 2.0), out(A, 256, 0.5)])
    mm = Candidate(g.subgraph([0]), A)  # 16 KiB of weights, one [1, 64] float output: 256 bytes
    assert t.overhead(g)(mm) == pytest.approx(2.0 + 0.5)


def test_context_records_and_hand_offs_share_the_table_but_not_the_lookups():
    hand = BoundaryCost(boundary_key(A, A, 256), "hw", True, [3e-6], 3e-6, 0.0)
    both = [hand, rec(A, 1024, 50e-6)]
    assert BoundaryTable(both).seconds("fake-a", "fake-a", 1024) == pytest.approx(3e-6)
    assert ContextTable(both).seconds("fake-a", 1024) == pytest.approx(50e-6)


def test_copies_leave_the_cache_at_every_size():
    assert copies_for(0) == 256 and copies_for(262144) == 32
    assert copies_for(1 << 20) == 8 and copies_for(4 << 20) == 4 and copies_for(1 << 30) == 4


def _chain():
    return from_onnx(chain_model(width=64))  # MatMul(W 64x64) -> Relu -> Add(b) -> Sigmoid, Tanh -> Mul


@pytest.fixture
def charged(monkeypatch):
    """Charge models of any size (the chain's 16 KiB of weights are under MIN_MODEL_BYTES)."""
    monkeypatch.setattr(context, "MIN_MODEL_BYTES", 0)


def test_dp_charges_each_partition_but_not_the_whole_model(charged):
    g = _chain()
    n = len(g)
    parts = [Candidate(g.subgraph([i]), A) for i in range(n)]
    whole = Candidate(g.whole(), A)
    cands = parts + [whole]
    costs = [1.0] * n + [n + 0.5]  # the parts sum to n: cheaper than the whole model as measured alone
    plain = solve(g, cands, costs)
    assert len(plain.choice) == n and plain.overhead_cost == 0.0
    # in context every partition pays 0.2 s (its weights evicted): n parts now cost 1.2 n > n + 0.5
    table = ContextTable([rec(A, 0, 0.2), rec(A, 1 << 20, 0.2)])
    charged = solve(g, cands, costs, overhead=table.overhead(g))
    assert [c.subgraph.mask for c in charged.choice] == [g.all_mask]
    assert charged.cost == pytest.approx(n + 0.5) and charged.overhead_cost == 0.0
    # with a cheaper context the parts win again, and the DP reports what it charged them
    cheap = ContextTable([rec(A, 0, 0.01), rec(A, 1 << 20, 0.01)])
    dp = solve(g, cands, costs, overhead=cheap.overhead(g))
    assert len(dp.choice) == n
    assert dp.overhead_cost == pytest.approx(0.01 * n) and dp.cost == pytest.approx(n + 0.01 * n)
    assert dp.per_candidate == [1.0] * n  # the costs given, without the overhead


def test_overhead_grows_with_the_partitions_constants(charged):
    g = _chain()
    t = ContextTable([rec(A, 0, 0.0), rec(A, 64 * 64 * 4, 1.0)])
    mm = Candidate(g.subgraph([0]), A)  # holds W: 16 KiB
    relu = Candidate(g.subgraph([1]), A)  # no constants
    f = t.overhead(g)
    assert f(mm) == pytest.approx(1.0) and f(relu) == 0.0


def test_a_model_smaller_than_the_rotations_is_not_charged():
    g = _chain()
    assert sum(g.tensors[t].nbytes for t in g.initializers) < context.MIN_MODEL_BYTES
    t = ContextTable([rec(A, 0, 1.0), rec(A, 1 << 20, 1.0)])
    assert t.overhead(g)(Candidate(g.subgraph([0]), A)) == 0.0
    big = from_onnx(chain_model(width=1024))  # 4 MiB of MatMul weights
    assert t.overhead(big)(Candidate(big.subgraph([0]), A)) == pytest.approx(1.0)


def test_measured_once_per_machine_and_backend_then_read(tmp_path):
    db = Database(tmp_path / "m.db")
    ort = resolve_backends("onnxruntime")
    sizes = (0, 262144)
    with Runner(db=db, threads=1) as r:
        first = measure_context(r, ort, sizes=sizes, output_sizes=(65536,))
        assert [x.key.nbytes for x in first] == [*sizes, 65536]
        assert all(x.valid for x in first), [x.error_text for x in first]
        assert first[1].extra["copies"] == 32 and first[1].extra["alone"] > 0
        assert first[2].extra["ring"] == 64 and first[2].extra["dropped"] > 0
        assert len(db.boundaries()) == 3
        again = measure_context(r, ort, sizes=sizes, output_sizes=(65536,))
    assert [(x.median, x.timestamp) for x in again] == [(x.median, x.timestamp) for x in first]
    with Runner(db=db, threads=1) as r:
        assert measure_context(r, ort, sizes=(0, 262144, 1 << 20), cached_only=True, output_sizes=(65536,)) == again
    assert len(Database(tmp_path / "m.db").boundaries()) == 3
