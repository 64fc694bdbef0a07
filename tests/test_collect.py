"""``collage-ml collect``: filling a database, resuming after kill -9, shards, samplers, budgets.

Real measurements on a tiny model with fast backends and a fast timing rule;
the whole file runs in well under a minute.
"""

from __future__ import annotations

import math
import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from collage_ml.cli_collect import add_parser, run
from collage_ml.collector import loop as collect_mod
from collage_ml.collector import (
    FOCUS_NEEDS_MODEL, collect, default_db_path, focus_weights, in_shard, parse_shard, plan, shard_of, subsample_keep,
)
from collage_ml.collector.sampling import convex_hull, sample_masks, sample_sources, sample_subgraphs
from collage_ml.db import Database
from collage_ml.errors import CollageError, UnknownModelError
from collage_ml.ir import import_model
from collage_ml.measure.timing import TimingConfig

# one process per candidate: these tests are about placement and storage, not the protocol (test_protocol.py)
# contention checks off: the load on a CI machine is not what these tests are about
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0, warmup=1, warmup_seconds=0.0, min_repeats=3,
                    max_repeats=10, time_cap=0.2, processes=1, max_processes=1)
MODEL = "dcgan-tiny"
BACKENDS = "onnxruntime,torch"
# no calibration (the probe set) either: test_collect_calibrates_the_machine_in_every_sitting is about it
KW = dict(models=MODEL, backends=BACKENDS, max_region_size=2, threads=1, timing=FAST, progress=False,
          recalibrate_hours=None)
PLAN_KW = dict(models=MODEL, backends=BACKENDS, max_region_size=2, threads=1)
REPO = Path(__file__).resolve().parents[1]


def db_keys(path) -> set[tuple[str, str, str]]:
    with Database(path, create=False, readonly=True) as db:
        return {(m.key.subgraph_hash, m.key.backend, m.key.backend_version) for m in db.measurements()}


def db_rows(path) -> dict[tuple[str, str, str], float]:
    with Database(path, create=False, readonly=True) as db:
        return {(m.key.subgraph_hash, m.key.backend, m.key.backend_version): m.timestamp for m in db.measurements()}


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """One complete unsharded collection (with the progress bar on, to exercise it)."""
    path = tmp_path_factory.mktemp("collect") / "full.db"
    summary = collect(**{**KW, "progress": True}, db=path)
    return path, summary


# ----------------------------------------------------------------------------- filling and caching


def test_collect_fills_the_db_and_a_rerun_is_all_cache_hits(full):
    path, s = full
    assert s.stopped == "complete" and s.remaining == 0
    assert s.measured == s.planned == s.candidates > 10
    assert s.valid + s.invalid == s.measured
    assert s.rate_per_min > 0
    with Database(path) as db:
        st = db.stats()
    assert st["total"] == s.measured
    assert st["families"] == {"dcgan": s.measured}
    assert set(st["backends"]) == {"onnxruntime", "torch"}
    assert st["backends"] == {b: c["measured"] for b, c in s.by_backend.items()}
    assert st["hardware"] == {s.hardware: s.measured}
    assert st["onnx_stored"] == st["subgraphs"]
    assert s.by_family == {"dcgan": {"measured": s.measured, "valid": s.valid, "invalid": s.invalid}}
    d = s.to_dict()
    json.dumps(d)
    assert d["invalid_by_backend"] == {"onnxruntime": s.by_backend["onnxruntime"]["invalid"],
                                       "torch": s.by_backend["torch"]["invalid"]}

    again = collect(**KW, db=path)
    assert again.measured == 0 and again.planned == 0
    assert again.cache_hits == s.measured
    assert db_keys(path) == plan(**PLAN_KW).keys()  # a fresh plan with no DB is exactly what was stored


def test_default_db_path_is_per_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("COLLAGE_ML_CACHE", str(tmp_path))
    assert default_db_path() == tmp_path / "measurements.db"
    s = collect(**KW, dry_run=True)
    assert s.db == str(tmp_path / "measurements.db") and s.stopped == "dry-run" and s.planned > 0
    assert not (tmp_path / "measurements.db").exists()  # a dry run creates nothing

    import collage_ml

    # the package-level API function
    assert collage_ml.collect(**KW, dry_run=True).planned == s.planned


# ----------------------------------------------------------------------------- shards


def test_shards_partition_the_work_and_merge_to_the_unsharded_db(full, tmp_path):
    full_path, _ = full
    everything = plan(**PLAN_KW).keys()
    for n in (2, 3):
        parts = [plan(**PLAN_KW, shard=f"{i}/{n}").keys() for i in range(n)]
        assert all(parts), "every shard has work on this model"
        assert sum(len(p) for p in parts) == len(everything) and set().union(*parts) == everything
        for k in everything:
            assert sum(k in p for p in parts) == 1 and k in parts[shard_of(k, n)]
    assert plan(**PLAN_KW, shard=(1, 2)).keys() == plan(**PLAN_KW, shard="1/2").keys()

    a, b, merged = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "merged.db"
    sa = collect(**KW, db=a, shard="0/2")
    sb = collect(**KW, db=b, shard=(1, 2))
    assert sa.shard == "0/2" and sb.shard == "1/2"
    ka, kb = db_keys(a), db_keys(b)
    assert ka and kb and not ka & kb
    assert all(in_shard(k, (0, 2)) for k in ka) and all(in_shard(k, (1, 2)) for k in kb)
    with Database(merged) as db:
        assert db.merge(a) == len(ka) and db.merge(b) == len(kb)
        assert db.merge(a) == 0 and db.merge(b) == 0  # idempotent
        st = db.stats()
    assert db_keys(merged) == db_keys(full_path) == everything
    with Database(full_path) as db:
        ref = db.stats()
    for k in ("total", "subgraphs", "families", "backends", "hardware"):
        assert st[k] == ref[k]


# ----------------------------------------------------------------------------- kill -9 and resume

_CHILD = textwrap.dedent(
    """
    import math
    import sys
    from collage_ml.collector import collect
    from collage_ml.measure.timing import TimingConfig
    # slow on purpose (every candidate is timed for 0.25 s) so the kill lands mid-run
    slow = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0, warmup=1, warmup_seconds=0.0, min_repeats=3,
                        max_repeats=10**6, max_spread=0.0, time_cap=0.25)
    collect(models={model!r}, backends={backends!r}, db=sys.argv[1], max_region_size=2, threads=1,
            timing=slow, progress=False, recalibrate_hours=None)
    """
)


def _count_rows(path: Path) -> int:
    if not path.exists():
        return 0
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def test_kill_9_loses_nothing_committed_and_resume_remeasures_nothing(tmp_path):
    path = tmp_path / "killed.db"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    err = open(tmp_path / "child.err", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(model=MODEL, backends=BACKENDS), str(path)],
        stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(tmp_path),
    )
    try:
        deadline = time.monotonic() + 90
        while _count_rows(path) < 3:
            assert proc.poll() is None, f"the collection ended before the kill: {(tmp_path / 'child.err').read_text()}"
            assert time.monotonic() < deadline, "no measurement committed within 90 s"
            time.sleep(0.05)
        before = db_rows(path)  # committed before the kill
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        err.close()

    after = db_rows(path)
    total = len(plan(**PLAN_KW).keys())
    assert len(before) >= 3 and len(after) < total, "the kill landed after the run finished"
    assert all(after.get(k) == ts for k, ts in before.items())  # nothing committed was lost or rewritten
    conn = sqlite3.connect(str(path))
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()

    remeasured = []
    s = collect(**KW, db=path, on_measurement=lambda m: remeasured.append(
        (m.key.subgraph_hash, m.key.backend, m.key.backend_version)))
    assert s.stopped == "complete"
    assert s.cache_hits == len(after) and s.measured == total - len(after) == len(remeasured)
    assert not set(remeasured) & set(after)
    final = db_rows(path)
    assert set(final) == plan(**PLAN_KW).keys()
    assert all(final[k] == ts for k, ts in after.items())


def test_onnx_paths_record_their_file_stem_as_family(tmp_path):
    import onnx

    path = tmp_path / "mynet.onnx"
    onnx.save(import_model(MODEL).model, str(path))
    p = plan(**{**PLAN_KW, "models": [str(path)]})
    assert [w.family for w in p.works] == ["mynet"] and p.keys() == plan(**PLAN_KW).keys()
    s = collect(**{**KW, "models": str(path)}, db=tmp_path / "f.db", max_candidates=2)
    assert s.measured == 2 and s.by_family == {"mynet": {"measured": 2, "valid": s.valid, "invalid": s.invalid}}
    with Database(tmp_path / "f.db") as db:
        assert db.stats()["families"] == {"mynet": 2}


# ----------------------------------------------------------------------------- the random sampler


def test_random_sampler_is_seeded_and_yields_convex_connected_subgraphs():
    g = import_model("resnet50-tiny")
    a = sample_masks(g, 40, 6, seed=3, label="x")
    assert a == sample_masks(g, 40, 6, seed=3, label="x")
    assert a != sample_masks(g, 40, 6, seed=4, label="x")
    sizes = set()
    for m in a:
        assert g.is_convex(m) and g.is_connected(m) and convex_hull(g, m) == m
        sizes.add(bin(m).count("1"))
    assert min(sizes) == 1 and max(sizes) > 2 and max(sizes) <= 6
    sgs = sample_subgraphs(g, 20, 5, seed=0)
    assert len({sg.hash for sg in sgs}) == len(sgs) > 5
    for seed in range(30):  # many streams, all convex
        for m in sample_masks(g, 10, 8, seed=seed):
            assert g.is_convex(m) and g.is_connected(m)


def test_random_plan_is_deterministic_covers_other_batch_sizes_and_is_convex():
    kw = dict(PLAN_KW, sampler="random", batch_sizes=(1, 2), max_region_size=3, samples_per_graph=15)
    p1, p2 = plan(**kw), plan(**kw)
    assert p1.keys() == p2.keys() and p1.planned > 0
    assert plan(**{**kw, "seed": 1}).keys() != p1.keys()
    assert {w.batch for w in p1.works} == {1, 2}
    assert {w.family for w in p1.works} == {"random"}
    for w in p1.works:
        g = import_model(w.model, batch=w.batch)
        for mask, _, pattern, _ in w.items:
            assert g.is_convex(mask) and g.is_connected(mask) and bin(mask).count("1") <= 3
            assert pattern == f"random:{w.label}"


def test_sources_interleave_models_and_batch_sizes_so_a_short_budget_samples_every_model():
    is_zoo = lambda m: not m.endswith(".onnx")  # noqa: E731
    src = sample_sources(["a", "b", "c", "x.onnx"], [16, 1, 4, 2, 8, 2], is_zoo=is_zoo)
    # every zoo model at every batch size once, the ONNX file (fixed shapes) at batch 1 only
    assert sorted(src) == sorted([(m, b) for m in "abc" for b in (1, 2, 4, 8, 16)] + [("x.onnx", 1)])
    assert len(set(src)) == len(src)
    # the first round visits every model once, each at another batch size; so do the later rounds
    assert src[:4] == [("a", 1), ("b", 2), ("c", 4), ("x.onnx", 1)]
    assert src[4:7] == [("a", 2), ("b", 4), ("c", 8)]
    assert sample_sources(["a", "b"], [1], is_zoo=is_zoo) == [("a", 1), ("b", 1)]
    with pytest.raises(ValueError, match="positive"):
        sample_sources(["a"], [0, 1], is_zoo=is_zoo)


def test_random_collect_records_family_random_at_other_batch_sizes(tmp_path):
    path = tmp_path / "random.db"
    s = collect(**{**KW, "max_region_size": 3}, db=path, sampler="random", batch_sizes=(2,), samples_per_graph=10,
                max_candidates=4)
    assert s.measured == 4 and s.stopped == "max_candidates" and s.batch_sizes == [2]
    with Database(path) as db:
        assert db.stats()["families"] == {"random": 4}
        ms = list(db.measurements())
        import onnx

        for m in ms:
            assert m.extra["pattern"] == "random:dcgan-tiny@b2"
            model = onnx.load_from_string(db.subgraph_onnx(m.key.subgraph_hash))
            dims = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
            assert any(d and d[0] == 2 for d in dims), dims


# ----------------------------------------------------------------------------- budgets


def test_max_candidates_and_budget_are_respected(tmp_path, monkeypatch):
    path = tmp_path / "budget.db"
    total = plan(**PLAN_KW).planned

    s = collect(**KW, db=path, budget_minutes=0)  # spent before the one source is planned
    assert s.measured == 0 and s.stopped == "budget" and s.remaining == 0 and s.unplanned_sources == 1

    s = collect(**KW, db=path, max_candidates=3)
    assert s.measured == 3 and s.stopped == "max_candidates" and s.remaining == total - 3
    assert len(db_keys(path)) == 3

    # a clock that jumps 61 s per measurement: a 2-minute budget allows exactly 2 more (the budget is checked
    # between chunks of the protocol's passes: chunks of one candidate here)
    now = [1000.0]
    monkeypatch.setattr(collect_mod, "_clock", lambda: now[0])
    kw = {**KW, "timing": replace(FAST, pass_chunk=1)}
    s = collect(**kw, db=path, budget_minutes=2, on_measurement=lambda m: now.__setitem__(0, now[0] + 61))
    assert s.measured == 2 and s.stopped == "budget" and s.cache_hits == 3
    assert len(db_keys(path)) == 5

    s = collect(**KW, db=path, max_candidates=0)
    assert s.measured == 0 and s.stopped == "max_candidates"


def test_sources_are_planned_as_the_run_reaches_them_so_a_budget_covers_planning(tmp_path, monkeypatch):
    from collage_ml.collector import planning as planning_mod

    now = [1000.0]
    imported: list[tuple[str, int]] = []

    def slow_import(model, batch, real=planning_mod._import):  # importing a source takes 10 minutes
        imported.append((model, batch))
        now[0] += 600
        return real(model, batch)

    monkeypatch.setattr(collect_mod, "_clock", lambda: now[0])
    monkeypatch.setattr(planning_mod, "_import", slow_import)
    monkeypatch.setattr(collect_mod, "_import", slow_import)
    kw = {**KW, "models": "dcgan-tiny,nasrnn-tiny"}
    s = collect(**kw, db=tmp_path / "a.db", budget_minutes=15)
    # planning everything first would have spent the budget on imports; instead the first source was
    # planned (once) and measured, and the budget ran out while the second was planned
    assert imported == [("dcgan-tiny", 1), ("nasrnn-tiny", 1)]
    assert s.stopped == "budget" and s.measured > 0 and s.unplanned_sources == 0
    assert set(s.by_family) == {"dcgan"} and s.remaining == s.planned - s.measured - s.cache_hits > 0

    imported.clear()
    s = collect(**kw, db=tmp_path / "b.db", budget_minutes=5)  # spent by planning the first source
    assert imported == [("dcgan-tiny", 1)] and s.measured == 0 and s.unplanned_sources == 1
    assert s.stopped == "budget" and s.remaining == s.planned > 0
    assert s.planned < plan(**{**PLAN_KW, "models": kw["models"]}).planned


def test_an_interleaving_protocol_measures_the_same_plan_and_keeps_the_cap(full, tmp_path):
    """Under ``interleave`` one call holds a chunk of every backend: the same candidates end up stored, and
    ``max_candidates`` still caps the total, not each backend's share."""
    kw = {**KW, "timing": replace(FAST, interleave=True, pass_chunk=4)}
    s = collect(**kw, db=tmp_path / "capped.db", max_candidates=5)
    assert s.measured == 5 and s.stopped == "max_candidates"
    s = collect(**kw, db=tmp_path / "all.db")
    assert s.stopped == "complete" and s.measured == full[1].measured
    assert db_keys(tmp_path / "all.db") == db_keys(full[0])


def test_sources_too_large_for_memory_are_skipped_with_a_reason(tmp_path):
    p = plan(**PLAN_KW, max_reference_bytes=1)
    assert p.planned == 0 and len(p.skipped) == 1 and "dcgan-tiny" in p.skipped[0]
    s = collect(**KW, db=tmp_path / "s.db", max_reference_bytes=1)
    assert s.measured == 0 and s.stopped == "complete" and s.skipped == p.skipped


def test_inductor_is_subsampled_deterministically():
    from collage_ml.backends import get_backend

    if not get_backend("inductor").available():
        pytest.skip("inductor unavailable")
    kw = dict(PLAN_KW, backends="onnxruntime,inductor", max_region_size=3)
    everything = plan(**kw, inductor_fraction=1.0)
    quarter = plan(**kw)  # the default fraction, 0.25
    none = plan(**kw, inductor_fraction=0.0)
    ind = {k for k in everything.keys() if k[1] == "inductor"}
    ind_q = {k for k in quarter.keys() if k[1] == "inductor"}
    assert ind and ind_q < ind and all(subsample_keep(k, 0.25) for k in ind_q)
    assert quarter.counts["inductor"]["subsampled"] == len(ind) - len(ind_q)
    assert quarter.counts["onnxruntime"] == everything.counts["onnxruntime"]
    assert not {k for k in none.keys() if k[1] == "inductor"}
    assert ind_q == {k for k in plan(**kw).keys() if k[1] == "inductor"}


# ----------------------------------------------------------------------------- errors and the focus hook


def test_bad_arguments_give_clear_errors(tmp_path):
    for bad in ("3/2", "2/2", "-1/2", "0/0", "1", "a/b", "1/2/3"):
        with pytest.raises(ValueError, match="bad shard"):
            parse_shard(bad)
    with pytest.raises(ValueError, match=r"0\.\.N-1"):
        collect(**KW, db=tmp_path / "x.db", shard="3/2")
    assert parse_shard("1/3") == (1, 3) and parse_shard((0, 1)) == (0, 1) and parse_shard(None) is None
    with pytest.raises(ValueError, match="unknown sampler 'bogus'"):
        collect(**KW, db=tmp_path / "x.db", sampler="bogus")
    with pytest.raises(CollageError, match="focus sampling needs a trained cost model"):
        collect(**KW, db=tmp_path / "x.db", sampler="focus")
    with pytest.raises(ValueError, match="budget_minutes"):
        collect(**KW, db=tmp_path / "x.db", budget_minutes=-1)
    with pytest.raises(ValueError, match="max_candidates"):
        collect(**KW, db=tmp_path / "x.db", max_candidates=-3)
    with pytest.raises(UnknownModelError, match="dcgan-tiny"):
        collect(**{**KW, "models": "dcgan-tinny"}, db=tmp_path / "x.db")
    with pytest.raises(ValueError, match="cannot be combined"):
        collect(**KW, db=tmp_path / "x.db", shard="0/2", ray_address="local")
    assert not (tmp_path / "x.db").exists()
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(CollageError, match=r"pip install 'collage-ml\[ray\]'"):
            collect(**KW, db=tmp_path / "x.db", ray_address="local")


def _parser():
    p = argparse.ArgumentParser(prog="collage-ml")
    add_parser(p.add_subparsers(dest="command"))
    return p


def test_cli_usage_errors_exit_2(capsys):
    for argv, msg in (
        (["collect", "--shard", "3/2"], "0..N-1"),
        (["collect", "--sampler", "bogus"], "invalid choice"),
        (["collect", "--max-candidates", "-1"], "integer >= 0"),
        (["collect", "--budget-minutes", "x"], "number >= 0"),
        (["collect", "--inductor-fraction", "2"], "fraction"),
    ):
        with pytest.raises(SystemExit) as e:
            _parser().parse_args(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_cli_run_json(full, capsys):
    path, s = full
    args = _parser().parse_args([
        "collect", "--models", MODEL, "--backends", BACKENDS, "--max-region-size", "2", "--threads", "1",
        "--db", str(path), "--json", "--no-progress", "--no-calibrate",
    ])
    assert run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"] == 0 and out["cache_hits"] == s.measured and out["stopped"] == "complete"
    args = _parser().parse_args(["collect", "--sampler", "focus", "--models", MODEL])
    with pytest.raises(CollageError, match="needs a trained cost model"):
        run(args)
    assert FOCUS_NEEDS_MODEL.endswith("train one with `collage-ml train` first")


class _Predictor:
    """A test double of the cost-model interface: ``predict -> (mean, uncertainty)``."""

    def predict(self, candidates):
        import numpy as np

        n = len(candidates)
        return np.full(n, 1e-3), np.array([1e-3 * (i % 3 == 0) for i in range(n)])


def test_focus_hook_weights_by_uncertainty_and_selects():
    w = focus_weights(["a", "b", "c", "d"], _Predictor())
    assert w[0] > w[1] and w[3] > w[2] and min(w) > 0
    kw = dict(PLAN_KW, sampler="focus", cost_model=_Predictor(), batch_sizes=(1,), samples_per_graph=20)
    p = plan(**kw, max_candidates=5)
    assert p.planned == 5 and p.keys() == plan(**kw, max_candidates=5).keys()
    assert {w.family for w in p.works} == {"random"}


# collect --ray (a real local Ray instance): tests/test_collect_ray.py


def test_collect_calibrates_the_machine_in_every_sitting(tmp_path, monkeypatch):
    from collage_ml.measure import probes

    monkeypatch.setattr(probes, "PROBES", probes.PROBES[10:12])  # layernorm and maxpool: fast
    kw = {**KW, "backends": "onnxruntime", "recalibrate_hours": 1.0, "max_candidates": 2}
    path = tmp_path / "c.db"
    s = collect(**kw, db=path)
    assert s.calibrations == 1 and 0 < s.calibrate_s < s.measure_s and s.measured == 2  # probes are not candidates
    assert collect(**kw, db=path).calibrations == 0  # the calibration is fresh
    s = collect(**{**kw, "recalibrate_hours": 0.0}, db=path)  # stale at once: again before every source
    assert s.calibrations >= 1
    with Database(path, readonly=True) as db:
        cals = db.calibrations(s.hardware, probes.PROBE_SET_VERSION)
    assert len(cals) == 1 + s.calibrations and cals[0].sitting is None and all(c.sitting for c in cals[1:])
    with pytest.raises(ValueError, match="recalibrate_hours must be >= 0"):
        collect(**{**kw, "recalibrate_hours": -1.0}, db=path)

    seen = []
    monkeypatch.setattr("collage_ml.cli_collect.collect", lambda **k: seen.append(k["recalibrate_hours"]) or s)
    for flags in ([], ["--recalibrate-after", "2.5"], ["--no-calibrate"]):
        run(_parser().parse_args(["collect", "--models", MODEL, "--no-progress", *flags]))
    assert seen == [1.0, 2.5, None]


def test_a_candidate_measured_meanwhile_counts_as_a_cache_hit_of_its_backend(tmp_path, monkeypatch):
    """Planned, then found in the database when its turn came (another process, or a probe of the run's
    own calibration that is also a zoo candidate): a cache hit of its backend, before that backend has
    measured anything."""
    from collage_ml.measure.runner import Runner

    lookup, first = Runner.lookup, []

    def measured_meanwhile(self, key):
        if not first:
            first.append(key)
            return object()
        return lookup(self, key)

    monkeypatch.setattr(Runner, "lookup", measured_meanwhile)
    s = collect(**{**KW, "max_candidates": 3}, db=tmp_path / "c.db")
    assert s.measured == 3 and s.by_backend[first[0].backend]["cache_hits"] >= 1
