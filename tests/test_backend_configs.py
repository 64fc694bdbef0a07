"""Configurations are backends: names, keys in the DB, numerics, spec round trips, the shared ORT pool.

Tests that create onnxruntime's global thread pool run in a subprocess: once it
exists, onnxruntime refuses every session with its own pool in that process
(``Graph.reference`` included), which would break the rest of the test run.
"""

from __future__ import annotations

import math
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from collage_ml.backends import onnxruntime_backend as ortb
from collage_ml.backends.base import (
    configured_name,
    get_backend,
    parse_backend_name,
    resolve_backends,
    split_backend_names,
    to_numpy,
)
from collage_ml.backends.configs import NAMED, PLAN_ONLY, configured_backends, configured_names, grids
from collage_ml.candidates import Candidate, enumerate_candidates
from collage_ml.cost import Measurement
from collage_ml.db import Database
from collage_ml.errors import BackendError
from collage_ml.ir import from_onnx, import_model
from collage_ml.measure.runner import Runner
from collage_ml.measure.tasks import Task, build_backend, execute
from collage_ml.measure.timing import TimingConfig, compare
from collage_ml.plan import Plan
from tests.helpers import assert_compiled_matches_reference, chain_model, ort_optimized_ops, residual_layernorm_model

ROOT = Path(__file__).resolve().parents[1]
# one process per candidate: these tests are about placement and storage, not the protocol (test_protocol.py)
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=5, time_cap=0.2, processes=1, max_processes=1)
HW = "cpu-test-t2-000000000000"


@pytest.fixture(autouse=True)
def no_global_pool_here():
    """Nothing in this process may create ORT's global pool (it would break later tests)."""
    yield
    assert ortb.global_pool_threads() is None, "a pool=shared session ran in the pytest process"


def _ov():
    b = get_backend("openvino")
    if not b.available():
        pytest.skip(b.unavailable_reason())
    return b


# -- names ---------------------------------------------------------------------------------------
def test_plain_names_and_versions_are_unchanged():
    ort = get_backend("onnxruntime")
    assert ort.name == "onnxruntime" and ort.options() == {"spin": "off", "opt": "all", "pool": "own", "skipln": "on"}
    assert ort.version.endswith("+spin0-all") and ort.spec()[2] == {"spin": False, "opt_level": "all"}
    ov = get_backend("openvino")
    assert ov.name == "openvino" and ov.spec()[2] == {"hint": "LATENCY", "streams": 1}
    if ov.available():
        assert ov.version.endswith("+latency-s1-zc2")
    # spelling out the defaults is the plain backend: same name, same rows
    assert get_backend("onnxruntime[spin=off,opt=all,pool=own]") is ort
    assert get_backend("onnxruntime[skipln=on]") is ort
    assert get_backend("openvino[hint=latency,streams=1,pin=on]") is ov


@pytest.mark.parametrize(
    "written, canonical",
    [
        ("onnxruntime[spin=on]", "onnxruntime[spin=on]"),
        ("onnxruntime[spin=1]", "onnxruntime[spin=on]"),
        ("onnxruntime[SPIN=True]", "onnxruntime[spin=on]"),
        ("onnxruntime[ spin = yes , opt = BASIC ]", "onnxruntime[opt=basic,spin=on]"),
        ("onnxruntime[opt=basic,spin=on]", "onnxruntime[opt=basic,spin=on]"),
        ("onnxruntime[spin=on,opt=basic]", "onnxruntime[opt=basic,spin=on]"),
        ("onnxruntime[spin=on,pool=shared]", "onnxruntime[pool=shared,spin=on]"),
        ("onnxruntime[opt=all,spin=on]", "onnxruntime[spin=on]"),
        ("onnxruntime[skipln=OFF]", "onnxruntime[skipln=off]"),
        ("onnxruntime[skipln=0,spin=on]", "onnxruntime[skipln=off,spin=on]"),
        ("openvino[streams=02]", "openvino[streams=2]"),
        ("openvino[pin=false,hint=THROUGHPUT,streams=auto]", "openvino[hint=throughput,pin=off,streams=auto]"),
    ],
)
def test_canonical_names(written, canonical):
    b = get_backend(written)
    assert b.name == canonical
    assert get_backend(canonical) is b  # one instance per configuration
    base, opts = parse_backend_name(canonical)
    assert configured_name(base, type(b).CONFIGS, b.options()) == canonical
    assert b.base_name() == base


def test_versions_include_the_configuration():
    names = ["onnxruntime", "onnxruntime[spin=on]", "onnxruntime[opt=basic]", "onnxruntime[opt=extended]",
             "onnxruntime[opt=none]", "onnxruntime[pool=shared,spin=on]", "onnxruntime[skipln=off]",
             "onnxruntime[skipln=off,spin=on]"]
    versions = [get_backend(n).version for n in names]
    assert len(set(versions)) == len(names), versions
    if get_backend("openvino").available():
        names = ["openvino", "openvino[streams=2]", "openvino[pin=off]", "openvino[hint=throughput,streams=auto]",
                 "openvino[hint=throughput]"]
        versions = [get_backend(n).version for n in names]
        assert len(set(versions)) == len(names), versions


@pytest.mark.parametrize(
    "name, match",
    [
        ("onnxruntime[threads=4]", r"no option 'threads'.*onnxruntime\[opt=all\|extended\|basic\|none, pool=own\|shared, skipln=on\|off, spin=off\|on\]"),
        ("onnxruntime[spin=fast]", r"spin=fast is not in the declared grid onnxruntime\[opt=all"),
        ("onnxruntime[opt=layout]", r"opt=layout is not in the declared grid"),
        ("onnxruntime[skipln=fused]", r"skipln=fused is not in the declared grid"),
        ("openvino[streams=3]", r"streams=3 is not in the declared grid openvino\[hint=latency\|throughput, pin=on\|off, streams=1\|2\|auto\]"),
        ("onnxruntime[pool=shared]", r"needs spin=on.*onnxruntime\[pool=shared,spin=on\]"),
        ("onnxruntime[spin=on,spin=off]", "given twice"),
        ("onnxruntime[spin]", "expected key=value"),
        ("onnxruntime[spin=on", "malformed backend name"),
        ("onnxruntime]", "malformed backend name"),
        ("torch[spin=on]", "'torch' has no configurations"),
        ("onnxruntim[spin=on]", "did you mean onnxruntime"),
    ],
)
def test_bad_names_are_errors_naming_the_grid(name, match):
    with pytest.raises(BackendError, match=match):
        get_backend(name)


def test_lists_split_at_top_level_commas_only():
    s = "onnxruntime[spin=on,opt=basic], openvino[streams=2,pin=off],torch"
    assert split_backend_names(s) == ["onnxruntime[spin=on,opt=basic]", "openvino[streams=2,pin=off]", "torch"]
    names = [b.name for b in resolve_backends("onnxruntime[spin=on,opt=basic],onnxruntime")]
    assert names == ["onnxruntime[opt=basic,spin=on]", "onnxruntime"]
    with pytest.raises(BackendError, match="unbalanced"):
        split_backend_names("onnxruntime[spin=on,openvino")
    with pytest.raises(BackendError, match="unbalanced"):
        split_backend_names("onnxruntime],openvino")


def test_configured_backends_lists_the_named_grid():
    names = [b.name for b in configured_backends()]
    assert names[0] == "onnxruntime" and "onnxruntime[spin=on]" in names
    assert "onnxruntime[pool=shared,spin=on]" not in names  # plan-only: not measured per subgraph
    assert all(get_backend(n).available() for n in names)
    assert [b.name for b in configured_backends("onnxruntime")] == list(NAMED["onnxruntime"])
    assert configured_names(["torch"]) == ["torch"]  # a base without a list is its plain backend
    assert PLAN_ONLY["onnxruntime"][0] in configured_names("onnxruntime", plan_only=True)
    if get_backend("openvino").available():
        assert "openvino[streams=2]" in names
    assert "spin=off|on" in grids()["onnxruntime"]
    with pytest.raises(BackendError, match="base backend names"):
        configured_backends("onnxruntime[spin=on]")


# -- keys and the database ----------------------------------------------------------------------------
def test_configurations_keep_distinct_keys_and_rows(tmp_path):
    g = from_onnx(chain_model())
    sg = g.whole()
    names = ["onnxruntime", "onnxruntime[spin=on]", "onnxruntime[opt=basic]"]
    keys = [Candidate(sg, get_backend(n)).key for n in names]
    assert len({k.subgraph_hash for k in keys}) == 1
    assert len(set(keys)) == 3 and [k.backend for k in keys] == names
    with Database(tmp_path / "m.db") as db:
        for i, k in enumerate(keys):
            m = Measurement(k, HW, True, samples=[1e-3 * (i + 1)], median=1e-3 * (i + 1), threads=2,
                            versions=get_backend(k.backend).versions(), onnx_bytes=sg.skeleton_onnx(),
                            extra={"pattern": "onnxruntime-region", "nodes": len(sg)})
            assert db.commit(m)
        assert db.count() == 3
        assert db.known_keys(HW) == {(k.subgraph_hash, k.backend, k.backend_version) for k in keys}
        for i, k in enumerate(keys):
            got = db.get(k, HW)
            assert got is not None and got.median == pytest.approx(1e-3 * (i + 1))
        assert {m.key.backend for m in db.measurements(backend="onnxruntime[spin=on]")} == {"onnxruntime[spin=on]"}


def test_runner_measures_configurations_into_distinct_rows(tmp_path):
    """The worker process rebuilds each configuration from its spec; both rows land in the DB."""
    g = from_onnx(chain_model())
    bs = [get_backend("onnxruntime"), get_backend("onnxruntime[opt=basic,spin=on]")]
    cands = [Candidate(g.whole(), b, "onnxruntime-region") for b in bs]
    with Database(tmp_path / "m.db") as db, Runner(db=db, threads=1, timing=FAST) as r:
        ms = r.measure(cands, g.reference())
        assert all(m.valid for m in ms), [m.error_text for m in ms]
        assert sorted(m.key.backend for m in db.measurements()) == sorted(b.name for b in bs)
        assert {m.key.backend_version for m in db.measurements()} == {b.version for b in bs}


# -- numerics and round trips ------------------------------------------------------------------------
ORT_CONFIGS = ["onnxruntime[spin=on]", "onnxruntime[opt=basic]", "onnxruntime[opt=extended]", "onnxruntime[opt=none]",
               "onnxruntime[skipln=off]"]
OV_CONFIGS = ["openvino[streams=2]", "openvino[pin=off]", "openvino[hint=throughput,streams=auto]"]


@pytest.mark.parametrize("name", ORT_CONFIGS + OV_CONFIGS)
def test_configured_backends_match_reference(name):
    if name.startswith("openvino"):
        _ov()
    b = get_backend(name)
    g = import_model("resnet50-tiny")
    ref = g.reference()
    masks = [g.all_mask] + [m for m in _some_regions(g, b)][:2]
    for mask in masks:
        assert_compiled_matches_reference(b, g, ref, mask, 2, name)


def _some_regions(g, b):
    from collage_ml.backends.patterns import RegionPattern

    masks = list(RegionPattern("r", max_size=3, max_regions=30).matches(g, lambda n: b.supports(g, n)))
    return masks[1::7]


def test_ort_configuration_reaches_the_session():
    g = from_onnx(chain_model())
    exe = get_backend("onnxruntime[opt=basic,spin=on]").compile(g.whole(), threads=2)
    so = exe.session.get_session_options()
    import onnxruntime as ort

    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert so.intra_op_num_threads == 2 and so.use_per_session_threads
    plain = get_backend("onnxruntime").compile(g.whole(), threads=2).session.get_session_options()
    assert plain.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert plain.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_skipln_off_keeps_add_and_layernorm_unfused(tmp_path):
    """skipln=off reaches onnxruntime: the optimised graph keeps Add + LayerNormalization, the default
    fuses them to SkipLayerNormalization; both agree with the reference."""
    model = residual_layernorm_model("residual", 32)
    ops = {skipln: ort_optimized_ops(model, tmp_path, skipln=skipln) for skipln in ("on", "off")}
    assert ops["on"] == ["SkipLayerNormalization"], ops
    assert ops["off"] == ["Add", "LayerNormalization"], ops
    g = from_onnx(model)
    ref = g.reference()
    for name in ("onnxruntime", "onnxruntime[skipln=off]"):
        assert_compiled_matches_reference(get_backend(name), g, ref, g.all_mask, 2, name)


def test_ov_configuration_reaches_the_compiled_model():
    _ov()
    g = from_onnx(chain_model())
    want = {
        "openvino": ("1", "True"),
        "openvino[streams=2]": ("2", "True"),
        "openvino[pin=off]": ("1", "False"),
        "openvino[hint=throughput,streams=auto]": ("2", "True"),  # the hint picks 2 streams on 2 threads
    }
    for name, (streams, pin) in want.items():
        exe = get_backend(name).compile(g.whole(), threads=2)
        got = (str(exe.compiled.get_property("NUM_STREAMS")), str(exe.compiled.get_property("ENABLE_CPU_PINNING")))
        assert got == (streams, pin), name


@pytest.mark.parametrize("name", ["onnxruntime[opt=basic,spin=on]", "onnxruntime[pool=shared,spin=on]",
                                  "onnxruntime[skipln=off]",
                                  "openvino[hint=throughput,pin=off,streams=auto]", "openvino[streams=2]"])
def test_spec_round_trip(name):
    if name.startswith("openvino"):
        _ov()
    b = get_backend(name)
    r = build_backend(json.loads(json.dumps(b.spec())))  # as a worker task carries it (plan files name backends only)
    assert type(r) is type(b)
    assert (r.name, r.version, r.options()) == (b.name, b.version, b.options())


def test_worker_task_rebuilds_a_configuration():
    """``measure.tasks.execute`` (what a worker runs) compiles, checks and times a configured backend."""
    g = from_onnx(chain_model())
    sg = g.whole()
    feeds, expected = sg.reference_io(g.reference())
    b = get_backend("onnxruntime[opt=extended,spin=on]")
    res = execute(Task(b.spec(), sg.to_onnx().SerializeToString(), feeds, expected, 1, FAST))
    assert res["valid"], res.get("error_text")


# -- plans -----------------------------------------------------------------------------------------------
def _mixed_plan(g, names, seed=0, max_size=3):
    from collage_ml.search.dp import solve

    bs = [get_backend(n) for n in names]
    cands = [c for c in enumerate_candidates(g, bs, max_region_size=max_size) if len(c.subgraph) <= max_size]
    r = random.Random(seed)
    res = solve(g, cands, [r.uniform(1, 2) * len(c.subgraph) ** 0.5 for c in cands])
    return Plan.from_candidates(g, res.choice)


def test_plan_mixing_ort_configurations_runs():
    g = import_model("resnet50-tiny")
    names = ["onnxruntime", "onnxruntime[opt=basic]", "onnxruntime[spin=on]"]
    plan = _mixed_plan(g, names, seed=3)
    assert len(plan.backends_used()) >= 2, plan.backends_used()
    plan = Plan.from_json(plan.to_json())  # configured names survive the plan file, resolved by the registry
    assert all(p.backend_spec is None for p in plan.partitions)
    pm = plan.compile(g, threads=2)
    assert {p.backend for p in pm.plan.partitions} <= set(names)
    ref = g.reference()
    out = pm.run({n: ref[n] for n in g.input_names})
    cmp = compare([to_numpy(out[n]) for n in g.output_names], ref, list(g.output_names))
    assert cmp.ok, cmp.detail


def test_check_pool_compatible():
    own = [get_backend("onnxruntime"), get_backend("onnxruntime[opt=basic]")]
    shared = [get_backend("onnxruntime[pool=shared,spin=on]"), get_backend("onnxruntime[opt=basic,pool=shared,spin=on]")]
    ortb.check_pool_compatible(own)
    ortb.check_pool_compatible(shared + [get_backend("torch")])
    with pytest.raises(BackendError, match="pool=shared and pool=own"):
        ortb.check_pool_compatible(own[:1] + shared[:1])
    assert shared[0].process_group == "onnxruntime-global-pool" and own[0].process_group is None


# -- the shared pool, in subprocesses ----------------------------------------------------------------------
def _run(script: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


SESSIONS = """
    import json, os
    import numpy as np
    from collage_ml.backends.base import get_backend
    from collage_ml.errors import BackendError
    from collage_ml.ir import from_onnx
    from tests.helpers import chain_model

    def nthreads():
        return len(os.listdir("/proc/self/task"))

    g = from_onnx(chain_model(width=64))
    ref = g.reference()  # before any shared pool: afterwards ORT refuses own-pool sessions
    names = NAMES
    t0 = nthreads()
    exes, added = [], []
    for i in range(4):
        exes.append(get_backend(names[i % len(names)]).compile(g.whole(), threads=2))
        added.append(nthreads() - t0)
    ok = all(np.allclose(e(ref["x"])[0], ref["y"], rtol=1e-4, atol=1e-5) for e in exes)
    errors = {}
    for label, name, threads in (("own_after_shared", "onnxruntime", 2),
                                 ("shared_other_size", "onnxruntime[pool=shared,spin=on]", 1)):
        try:
            get_backend(name).compile(g.whole(), threads=threads)
            errors[label] = None
        except BackendError as e:
            errors[label] = str(e)
    # code outside the backend can still make sessions once it fits its options to the process
    import onnxruntime as ort
    from collage_ml.backends.onnxruntime_backend import fit_session_options

    try:
        so = fit_session_options(ort.SessionOptions())
        so.log_severity_level = 3
        sess = ort.InferenceSession(g.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        fitted = bool(np.allclose(sess.run(None, {"x": ref["x"]})[0], ref["y"], rtol=1e-4, atol=1e-5))
    except Exception as e:
        fitted = str(e)
    print(json.dumps({"added": added, "ok": ok, "errors": errors, "fitted": fitted}))
"""


def test_own_pools_add_threads_per_session():
    r = _run(SESSIONS.replace("NAMES", repr(["onnxruntime", "onnxruntime[opt=basic]"])))
    assert r["ok"]
    # intra_op_num_threads=2: each session owns one worker thread (the caller is the other)
    assert r["added"] == [1, 2, 3, 4], r["added"]
    assert r["errors"]["own_after_shared"] is None  # no global pool made: own pools keep working
    assert r["fitted"] is True


def test_shared_pool_is_one_pool_for_every_configuration():
    r = _run(SESSIONS.replace("NAMES", repr(["onnxruntime[pool=shared,spin=on]",
                                             "onnxruntime[opt=basic,pool=shared,spin=on]"])))
    assert r["ok"]
    # the global pool (2 intra-op threads: one worker) is made once; later sessions add no threads
    assert r["added"] == [1, 1, 1, 1], r["added"]
    # the enforced rules: no own-pool session once the global pool exists; one pool size per process
    assert "refuses sessions with their own pool" in r["errors"]["own_after_shared"]
    assert "shared onnxruntime pool has 2 threads" in r["errors"]["shared_other_size"]
    assert r["fitted"] is True


def test_plan_mixing_shared_configurations_shares_the_pool():
    """A placed model whose partitions use two ORT configurations on pool=shared: one pool, right numbers."""
    r = _run("""
        import json, os
        import numpy as np
        from collage_ml.backends.base import get_backend, to_numpy
        from collage_ml.ir import import_model
        from collage_ml.measure.timing import compare
        from collage_ml.plan import Partition, Plan

        def nthreads():
            return len(os.listdir("/proc/self/task"))

        g = import_model("resnet50-tiny")
        ref = g.reference()
        a, b = get_backend("onnxruntime[pool=shared,spin=on]"), get_backend("onnxruntime[opt=basic,pool=shared,spin=on]")
        # alternate the configurations over runs of 3 nodes in topological order (each run convex)
        order = list(range(len(g)))
        parts = []
        for k in range(0, len(order), 3):
            nodes = order[k:k + 3]
            if not g.is_convex(sum(1 << i for i in nodes)):
                parts += [[i] for i in nodes]
            else:
                parts.append(nodes)
        plan = Plan(g.name, [Partition(x.name, nodes, backend_spec=x.spec())
                             for nodes, x in zip(parts, [a, b] * len(parts))], graph_hash=g.whole().hash)
        plan = Plan.from_json(plan.to_json())
        t0 = nthreads()
        pm = plan.compile(g, threads=2)
        added = nthreads() - t0
        out = pm.run({n: ref[n] for n in g.input_names})
        cmp = compare([to_numpy(out[n]) for n in g.output_names], ref, list(g.output_names))
        print(json.dumps({"added": added, "ok": cmp.ok, "detail": cmp.detail, "sessions": len(pm._steps),
                          "backends": sorted({p.backend for p in pm.plan.partitions})}))
    """)
    assert r["ok"], r["detail"]
    assert r["backends"] == ["onnxruntime[opt=basic,pool=shared,spin=on]", "onnxruntime[pool=shared,spin=on]"]
    assert r["sessions"] >= 4
    assert r["added"] == 1, r  # one global pool worker for all the sessions, not one per session
