"""Plan files and placed-model folders are data: backends by registered name, nothing imported by path."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import collage_ml
from collage_ml.backends.base import get_backend
from collage_ml.errors import CollageError, PlanError
from collage_ml.ir.importers import from_onnx
from collage_ml.plan import PLAN_FORMAT, Partition, Plan
from tests import bad_corpus


@pytest.fixture
def saved(tmp_path):
    return bad_corpus.placed_model(tmp_path / "pm")


def _plan(d):
    return json.loads((d / "plan.json").read_text())


def _write(d, plan):
    (d / "plan.json").write_text(json.dumps(plan))


def test_saved_plan_names_backends_only_and_hashes_the_model(saved):
    plan = _plan(saved)
    assert plan["format"] == PLAN_FORMAT == 2
    assert all("backend_spec" not in p for p in plan["partitions"])
    assert len(plan["model_sha256"]) == 64 and plan["graph_hash"]
    pm = collage_ml.load(saved)
    x = np.ones((1, 8), np.float32)
    assert np.allclose(pm(x), bad_corpus_reference(x))


def bad_corpus_reference(x):
    import onnx.numpy_helper as nh

    init = {t.name: nh.to_array(t) for t in bad_corpus.good_model().graph.initializer}
    return np.maximum(x @ init["W"], 0) + init["b"]


def test_configured_names_survive_and_are_checked_against_the_grid(saved):
    plan = _plan(saved)
    plan["partitions"][0]["backend"] = "onnxruntime[spin=1]"  # a spelling the grid accepts
    _write(saved, plan)
    assert [p.backend for p in collage_ml.load(saved).plan.partitions] == ["onnxruntime[spin=on]"]
    plan["partitions"][0]["backend"] = "onnxruntime[spin=sometimes]"
    _write(saved, plan)
    with pytest.raises(PlanError, match=r"plan\.json: plan partition 0: .*spin=sometimes"):
        collage_ml.load(saved)


def test_legacy_folder_with_a_registered_spec_still_loads(saved):
    """A format-1 folder (before model hashes) stored (module, class, kwargs); it loads when that is exactly
    the registered backend of the partition's name, and is refused otherwise."""
    b = get_backend("onnxruntime[spin=on]")
    plan = _plan(saved)
    plan["format"] = 1
    del plan["model_sha256"]
    plan["partitions"][0].update(backend=b.name, backend_spec=list(json.loads(json.dumps(b.spec()))))
    _write(saved, plan)
    pm = collage_ml.load(saved)
    assert [p.backend for p in pm.plan.partitions] == ["onnxruntime[spin=on]"]
    assert pm.plan.partitions[0].backend_spec is None  # translated to the name, the file's spec dropped
    plan["partitions"][0]["backend_spec"][2] = {**b.spec()[2], "spin": False}  # contradicts the name
    _write(saved, plan)
    with pytest.raises(PlanError, match="is not the registered backend"):
        collage_ml.load(saved)


def test_malicious_spec_runs_nothing(saved, tmp_path):
    marker = tmp_path / "ran"
    for spec in (["subprocess", "run", {"args": ["touch", str(marker)]}],
                 ["os", "system", {"command": f"touch {marker}"}],
                 ["builtins", "exec", {"source": f"open({str(marker)!r}, 'w')"}]):
        for fmt in (1, 2):
            plan = _plan(saved)
            plan["format"] = fmt
            plan["partitions"][0]["backend_spec"] = spec
            _write(saved, plan)
            with pytest.raises(PlanError) as e:
                collage_ml.load(saved)
            assert "partition 0" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_tampering_gives_one_collage_error(saved):
    cases = {
        "negative": lambda p: p["partitions"][0].update(nodes=[-1, 0, 1, 2]),
        "string": lambda p: p["partitions"][0].update(nodes=["1", 0, 2]),
        "bool": lambda p: p["partitions"][0].update(nodes=[True, 0, 2]),
        "float": lambda p: p["partitions"][0].update(nodes=[0.0, 1, 2]),
        "past the end": lambda p: p["partitions"][0].update(nodes=[0, 1, 2, 3]),
        "no graph_hash": lambda p: p.pop("graph_hash"),
        "no model hash": lambda p: p.pop("model_sha256"),
        "threads": lambda p: p.update(threads="2"),
        "partition not an object": lambda p: p.update(partitions=[7]),
        "format": lambda p: p.update(format=True),
    }
    original = _plan(saved)
    for what, edit in cases.items():
        plan = json.loads(json.dumps(original))
        edit(plan)
        _write(saved, plan)
        with pytest.raises(CollageError) as e:
            collage_ml.load(saved)
        assert isinstance(e.value, PlanError), (what, e.value)
        assert "plan.json" in str(e.value) and "\n" not in str(e.value), (what, e.value)
    _write(saved, original)
    collage_ml.load(saved)  # the untouched plan still loads


def test_swapped_weights_and_bad_report_are_refused(saved, tmp_path):
    import onnx
    from onnx import numpy_helper

    other = shutil.copytree(saved, tmp_path / "other")
    m = onnx.load(str(other / "model.onnx"))
    t = m.graph.initializer[0]
    t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) + 1, t.name))
    onnx.save(m, str(other / "model.onnx"))
    with pytest.raises(PlanError, match="content hash mismatch"):
        collage_ml.load(other)
    (saved / "report.json").write_text("[1, 2")
    with pytest.raises(PlanError, match=r"report\.json.*not valid JSON"):
        collage_ml.load(saved)
    (saved / "report.json").write_text("[1, 2]")
    with pytest.raises(PlanError, match=r"report\.json.*not an object"):
        collage_ml.load(saved)


def test_worker_channel_keeps_specs_only_when_asked():
    g = from_onnx(bad_corpus.good_model())
    b = get_backend("onnxruntime")
    plan = Plan(g.name, [Partition(b.name, [0, 1, 2], backend_spec=b.spec())], graph_hash=g.whole().hash)
    assert "backend_spec" not in plan.to_json()
    assert Plan.from_json(plan.to_json(specs=True)).partitions[0].backend_spec is None  # untrusted: dropped
    assert Plan.from_json(plan.to_json(specs=True), trusted=True).partitions[0].backend_spec == b.spec()
