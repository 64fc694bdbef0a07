"""Models from the wild (tests/wild_corpus.py): every ONNX file onnxruntime runs imports, places, never a traceback."""

import math
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import collage_ml
from collage_ml.backends.base import _OP_PROBES, get_backend, probe_op
from collage_ml.cli import main
from collage_ml.errors import CollageError
from collage_ml.ir import import_model
from collage_ml.ir.reference import run_onnx
from collage_ml.measure.timing import TimingConfig
from collage_ml.models import base as models_base
from collage_ml.search.failures import FailureLog, normalise
from tests.fake_cost_models import FlopsFixtureModel
from tests.wild_corpus import CORPUS, NoSoftmaxFixture, build

# one process per candidate: these tests are about placement and storage, not the protocol (test_protocol.py)
FAST = TimingConfig(max_pressure=math.inf, max_steal=math.inf, contention_retries=0,
                    warmup=1, warmup_seconds=0.0, min_repeats=3, max_repeats=8, time_cap=0.05, processes=1, max_processes=1)
NAMES = list(CORPUS)


def _ort_outputs(model: onnx.ModelProto, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", NAMES)
def test_corpus_imports_and_every_node_emits_a_checked_runnable_subgraph(name):
    m = build(name)
    g = import_model(m, name=name)
    ref = g.reference()
    for n in g.nodes:
        sg = g.subgraph(1 << n.index)
        sub = sg.to_onnx(check=True)  # the checker passes whatever the file's IR version was
        feeds, expected = sg.reference_io(ref)
        got = run_onnx(sub, feeds)
        for t, want in expected.items():
            np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {sg}")
    # the imported graph computes what onnxruntime computes on the original file
    feeds = g.example_inputs(3)
    want = _ort_outputs(m, feeds)
    got = run_onnx(g.model, feeds)
    for t in g.output_names:
        np.testing.assert_allclose(got[t], want[t], rtol=1e-5, atol=1e-6)


def test_import_notes_say_what_was_converted():
    g = import_model(build("squeezenet-ir3"))
    notes = " | ".join(g.import_notes)
    assert "IR version 3 -> 4" in notes and "listed as graph inputs are constants" in notes
    assert "ConstantOfShape x" in notes and "opset 9 -> 13" in notes
    assert g.model.ir_version >= 4 and not g.initializers.keys() & {i.name for i in g.model.graph.input}
    assert "ConstantOfShape" not in g.op_histogram()
    up = import_model(build("bn-upsample-ir3"))
    assert "Upsample:1->0" in " ".join(up.import_notes) and "Resize" in up.op_histogram()
    s = import_model(build("sloppy"))
    assert "nodes sorted topologically" in s.import_notes
    assert any("no node reads dropped" in n for n in s.import_notes)
    assert "unused_w" not in s.initializers
    # a modern file is left alone, and a normalised graph imports to itself (PlacedModel.load relies on it)
    t13 = import_model(build("torch-legacy-op13"))
    assert not any("opset" in n for n in t13.import_notes)
    again = collage_ml.ir.from_onnx(g.model)
    assert again.import_notes == [] and [n.op_type for n in again.nodes] == [n.op_type for n in g.nodes]


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    """One database per mode for the whole corpus: hand-off costs are measured once, as a user's would be."""
    d = tmp_path_factory.mktemp("wild")
    return {"exhaustive": d / "exhaustive.db", "guided": d / "guided.db"}


@pytest.fixture
def fixture_kind(monkeypatch):
    monkeypatch.setitem(models_base.KINDS, "fixture", "tests.fake_cost_models:FlopsFixtureModel")


@pytest.mark.parametrize("name", NAMES)
def test_corpus_places_in_its_mode_and_matches_onnxruntime(name, dbs, fixture_kind):
    """Each model in one mode, the modes taking turns over the corpus (both modes on half of it each: what
    the import did to a file does not depend on the mode, and each placement costs seconds of the suite)."""
    m = build(name)
    mode = ("exhaustive", "guided")[NAMES.index(name) % 2]
    # guided mode with a formula cost model: updating the shipped XGBoost model costs seconds per run
    # (the shipped model is exercised by benchmarks/wild_models.py)
    extra = {"cost_model": FlopsFixtureModel()} if mode == "guided" else {}
    pm = collage_ml.place(m, backends="onnxruntime,openvino,torch", mode=mode, db=dbs[mode],
                          max_region_size=1, timing=FAST, graph_level=False, **extra)
    rep = pm.report
    assert rep["outputs_match"], (mode, rep["mismatch"])
    assert rep["fallback"] is None, (mode, rep["fallback"])
    # no backend fails most of its candidates the same way on these models
    assert rep["systematic_failures"] == [], (mode, rep["systematic_failures"])
    feeds = pm.graph.example_inputs(5)
    want = _ort_outputs(m, feeds)
    out = pm.run(feeds)
    for t in pm.graph.output_names:
        np.testing.assert_allclose(np.asarray(out[t]), want[t], rtol=1e-3, atol=1e-4, err_msg=f"{name} {mode}")


def test_no_cover_falls_back_to_the_whole_model_and_says_why(tmp_path):
    from collage_ml.search import tuner

    g = import_model(build("squeezenet-ir3"))
    lines = []
    res = tuner.place(g, backends=[NoSoftmaxFixture()], db=tmp_path / "m.db", max_region_size=1,
                      timing=FAST, graph_level=False, progress=False, log=lines.append)
    pm, rep = res.placed, res.report
    assert rep["chosen"] == "all-test-no-softmax" and len(rep["partitions"]) == 1
    assert rep["outputs_match"]
    assert rep["fallback"] == "no valid candidate covers node 'softmax' (Softmax); test-no-softmax declines it"
    assert any(x.startswith("no finer plan: no valid candidate covers node 'softmax'") for x in lines)
    # known before measuring: only the whole model was measured, no candidate
    assert rep["measurements"] == 1
    # guided mode takes the same way out, and its report still has what the CLI prints
    res = tuner.place(g, backends=[NoSoftmaxFixture()], mode="guided", db=tmp_path / "m.db", max_region_size=1,
                      timing=FAST, graph_level=False, progress=False)
    assert res.report["chosen"] == "all-test-no-softmax" and res.report["guided"]["rounds"] == 0
    assert res.report["outputs_match"] and res.report["fallback"] == rep["fallback"]


def test_systematic_failure_is_said_once_and_the_plan_still_comes(tmp_path):
    from collage_ml.search import tuner
    from tests.fake_backends import RaiseFixture

    g = import_model(build("squeezenet-ir3"))
    lines = []
    res = tuner.place(g, backends=[RaiseFixture(), get_backend("onnxruntime")], db=tmp_path / "m.db",
                      max_region_size=1, timing=FAST, graph_level=False, progress=False, log=lines.append)
    rep = res.report
    assert rep["outputs_match"] and {p["backend"] for p in rep["partitions"]} == {"onnxruntime"}
    said = [x for x in lines if "test-raise" in x and "failed" in x]
    assert len(said) == 1 and said[0].startswith("systematic failure: test-raise: ")
    assert "this backend always fails to compile" in said[0]
    (s,) = rep["systematic_failures"]
    assert s["backend"] == "test-raise" and s["count"] == s["of"] > 1
    assert rep["invalid_by_backend"]["onnxruntime"]["invalid"] == 0


def test_no_plan_at_all_is_one_line_without_traceback(tmp_path, capsys):
    p = tmp_path / "m.onnx"
    onnx.save(build("bn-upsample-ir3"), str(p))  # torch maps neither LRN nor this Resize
    rc = main(["place", str(p), "--backends", "torch", "--db", str(tmp_path / "m.db"), "--max-region-size", "1",
               "--no-progress", "--no-graph-level"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    line = [x for x in err.splitlines() if x.startswith("collage-ml: error:")]
    assert len(line) == 1 and "no plan" in line[0] and "LRN" in line[0]


def test_search_errors_are_collage_errors(tmp_path, monkeypatch):
    from collage_ml.search import tuner

    def boom(*a, **k):
        raise RuntimeError("something deep in the search broke")

    monkeypatch.setattr(tuner, "enumerate_candidates", boom)
    g = import_model(build("sloppy"))
    with pytest.raises(CollageError, match="something deep in the search broke"):
        tuner.place(g, backends=[get_backend("onnxruntime")], db=tmp_path / "m.db", progress=False)


@pytest.mark.parametrize("name", NAMES)
def test_every_command_on_every_corpus_model(name, tmp_path, capsys):
    p = tmp_path / f"{name}.onnx"
    onnx.save(build(name), str(p))
    assert main(["inspect", str(p), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] > 0
    rep = tmp_path / "r.json"
    rc = main(["place", str(p), "--backends", "onnxruntime", "--db", str(tmp_path / "m.db"),
               "--max-region-size", "1", "--no-progress", "--no-graph-level", "--report", str(rep)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Traceback" not in out.err
    assert json.loads(rep.read_text())["outputs_match"]
    rc = main(["collect", "--models", str(p), "--backends", "onnxruntime", "--db", str(tmp_path / "c.db"),
               "--max-region-size", "1", "--max-candidates", "2", "--no-progress", "--no-calibrate"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Traceback" not in out.err and "measured" in out.out


def test_unsupported_op_is_declined_once_by_the_probe():
    from onnx import TensorProto as T
    from onnx import helper

    def model(width):
        nodes = [helper.make_node("Cast", ["x"], ["c"], to=T.INT32), helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("Cast", ["r"], ["y"], to=T.FLOAT)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, width])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, width])])
        return import_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))

    ortb = get_backend("onnxruntime")
    g = model(3)
    relu = g.nodes[1]
    assert not ortb.supports(g, relu)  # onnxruntime has no int32 Relu kernel
    assert "Relu" in probe_op(ortb, g, relu)
    assert ortb.supports(g, g.nodes[0])
    n = len(_OP_PROBES)
    g2 = model(5)  # same op, attributes, dtypes and ranks: the cached answer, no new probe
    assert not ortb.supports(g2, g2.nodes[1])
    assert len(_OP_PROBES) == n


def test_failure_texts_group_across_candidates():
    g = import_model(build("squeezenet-ir3"))
    a = normalise("ModelError: invalid ONNX model: conv1_w_0 in initializer but not in graph input", g.tensors)
    b = normalise("ModelError: invalid ONNX model: fc_w_0 in initializer but not in graph input", g.tensors)
    assert a == b
    assert normalise("could not compile SubGraph(2 nodes [Conv,Relu], hash=89272ea43296): bad") == \
        normalise("could not compile SubGraph(1 nodes [Gemm], hash=00aa): bad")

    class M:
        def __init__(self, valid, text=""):
            self.valid, self.error_text = valid, text

    from collage_ml.candidates import Candidate

    b1 = get_backend("onnxruntime")
    cands = [Candidate(g.subgraph(1 << i), b1, "x") for i in range(len(g))]
    log = FailureLog(g)
    log.add((c, M(i == 0, f"BackendError: {c.subgraph.nodes[0].name} failed")) for i, c in enumerate(cands))
    (s,) = log.systematic()
    assert s["backend"] == "onnxruntime" and s["of"] > 2 and s["count"] >= s["of"] - 1
    assert len(log.summary_lines()) == 1
