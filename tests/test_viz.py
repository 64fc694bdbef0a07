"""Pictures of placed models: the SVG (one cluster per partition, hand-off edges), the table, `show`, no Graphviz."""

from __future__ import annotations

import json
import random
import shutil
import xml.etree.ElementTree as ET

import pytest

import collage_ml
from collage_ml.candidates import enumerate_candidates
from collage_ml.cli import main
from collage_ml.cost import CandidateKey, Measurement
from collage_ml.db import Database
from collage_ml.ir import import_model
from collage_ml.placed import PlacedModel
from collage_ml.plan import Plan
from collage_ml.search.dp import solve
from collage_ml.viz import GraphvizMissing, PlanView
from tests.fake_backends import FakeCostBackend

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")

SVG = "{http://www.w3.org/2000/svg}"
HW = "cpu-test-viz"
A, B = FakeCostBackend("fake-a"), FakeCostBackend("fake-b")


@pytest.fixture(scope="module", autouse=True)
def registered_fakes():
    """Saved plans name registered backends only (plan files are data): register the two test fixtures."""
    from collage_ml.backends import base

    for name in ("fake-a", "fake-b"):
        base.register_backend(name, lambda name=name: FakeCostBackend(name))
    yield
    for name in ("fake-a", "fake-b"):
        base._FACTORIES.pop(name, None)
        base._INSTANCES.pop(name, None)


@pytest.fixture(scope="module")
def graph():
    return import_model("resnet50-tiny")


@pytest.fixture(scope="module")
def plan(graph) -> Plan:
    """A deterministic mix of two backends: the DP over real candidates with seeded random costs."""
    cands = [c for c in enumerate_candidates(graph, [A, B], max_region_size=2) if len(c.subgraph) <= 2]
    r = random.Random(0)
    res = solve(graph, cands, [r.uniform(1, 2) * 1e-4 for _ in cands])
    p = Plan.from_candidates(graph, res.choice, res.per_candidate, hardware=HW, threads=1)
    assert set(p.backends_used()) == {"fake-a", "fake-b"}
    return p


def _parse(svg_text: str):
    root = ET.fromstring(svg_text)
    groups = list(root.iter(f"{SVG}g"))
    clusters = [g for g in groups if g.get("class") == "cluster"]
    handoffs = [g for g in groups if g.get("class") == "edge" and (g.get("id") or "").startswith("handoff-")]
    return root, clusters, handoffs


def _title(g) -> str:
    return g.find(f"{SVG}title").text


@needs_dot
def test_svg_has_one_cluster_per_partition_and_the_handoffs(graph, plan):
    view = PlanView(graph, plan)
    root, clusters, handoffs = _parse(view.svg())
    assert len(clusters) == len(plan.partitions) == len(view.partitions)
    assert {c.get("id") for c in clusters} == {f"partition-{k}" for k in range(len(plan.partitions))}
    assert {_title(c) for c in clusters} == {f"cluster_P{k}" for k in range(len(plan.partitions))}
    # every node sits in the cluster of its partition
    for c in clusters:
        k = int(c.get("id").split("-")[1])
        inside = {int(g.get("id").split("-")[1]) for g in c.iter(f"{SVG}g") if (g.get("id") or "").startswith("node-")}
        assert not inside or inside == set(view.partitions[k].nodes)
    # a hand-off edge wherever producer and consumer partitions differ, and nowhere else
    crossing = {
        (src, n)
        for n, node in enumerate(graph.nodes)
        for t in node.inputs
        if (src := graph.producer.get(t)) is not None and view.owner[src] != view.owner[n]
    }
    assert crossing and view.handoffs
    drawn = set()
    for h in handoffs:
        a, b = _title(h).split("->")
        drawn.add((int(a[1:]), int(b[1:])))
    assert drawn == crossing
    for e in root.iter(f"{SVG}g"):
        if e.get("class") == "edge" and not (e.get("id") or "").startswith("handoff-"):
            a, b = _title(e).split("->")
            if a.startswith("n") and b.startswith("n"):
                assert view.owner[int(a[1:])] == view.owner[int(b[1:])]
    # partitions are numbered in execution order; each hand-off runs forward
    assert all(h.src < h.dst for h in view.handoffs)


@needs_dot
def test_single_backend_plan_has_no_handoffs(graph):
    view = PlanView(graph, Plan.single(graph, A))
    _, clusters, handoffs = _parse(view.svg())
    assert len(clusters) == 1 and not handoffs and not view.handoffs


@needs_dot
def test_table_and_costs_from_the_database(graph, plan, tmp_path):
    db_path = tmp_path / "m.db"
    whole = Plan.single(graph, B, hardware=HW)
    with Database(db_path, create=True) as db:
        db.register_hardware(HW, {"physical_cores": 2, "logical_cores": 2, "threads": 1, "gpus": []})
        ms = [Measurement(CandidateKey(f"boundary:{n}", f"{a}->{b}", "fake-1|fake-1"), HW, True, samples=[c] * 3,
                          median=c, spread=0.0, family="boundary")
              for a in ("fake-a", "fake-b") for b in ("fake-a", "fake-b") for n, c in ((1024, 1e-5), (65536, 3e-5))]
        lat = 7e-4
        ms.append(Measurement(CandidateKey(graph.whole().hash, "fake-b", "fake-1"), HW, True, samples=[lat] * 3,
                              median=lat, spread=0.0, family="resnet50"))
        db.commit_many(ms)
    view = PlanView(graph, plan, db=db_path)
    assert all(h.cost_ms is not None and 0.01 <= h.cost_ms <= 0.03 for h in view.handoffs)
    rows = view.rows()
    assert len(rows) == len(plan.partitions) and rows[0]["partition"] == "P0"
    assert all(r["measured_ms"] is not None and r["latency_from"] == "plan" for r in rows)
    assert sum(r["handoffs_in"] for r in rows) == len(view.handoffs)
    # a partition the plan does not time (here: the whole model) takes the database's measurement
    wv = PlanView(graph, whole, db=db_path)
    assert wv.rows()[0]["measured_ms"] == pytest.approx(0.7) and wv.rows()[0]["latency_from"] == "database"
    from rich.console import Console

    con = Console(width=160, record=True)
    con.print(view.table())
    text = con.export_text()
    assert "P0" in text and "fake-a" in text and "hand-off" in text and "Conv" in text


@pytest.fixture(scope="module")
def saved(graph, plan, tmp_path_factory):
    pm = plan.compile(graph, threads=1)
    pm.report = {"model": graph.name, "hardware": HW, "plan_latency_ms": 1.5, "chosen": "op-level"}
    d = tmp_path_factory.mktemp("placed") / "pm"
    pm.save(d)
    return d, pm


@needs_dot
def test_show_redraws_a_saved_model_without_compiling(saved, monkeypatch, tmp_path, capsys):
    d, pm = saved

    def no(*a, **k):
        raise AssertionError("show compiled a backend")

    monkeypatch.setattr(PlacedModel, "__init__", no)
    monkeypatch.setattr(Plan, "compile", no)
    out = tmp_path / "pics" / "plan.svg"
    assert main(["show", str(d), "--svg", str(out)]) == 0
    text = capsys.readouterr().out
    assert "P0" in text and "fake-a" in text and f"wrote {out}" in text
    _, clusters, handoffs = _parse(out.read_text())
    assert len(clusters) == len(pm.plan.partitions) and handoffs
    # the default picture goes into the placed model's directory; the API returns the view
    view = collage_ml.show(d)
    assert len(view.partitions) == len(pm.plan.partitions) and "1.500 ms" in view.title()
    assert main(["show", str(d)]) == 0 and (d / "plan.svg").exists()


def test_show_errors_are_one_line(saved, tmp_path, monkeypatch, capsys):
    d, _ = saved
    assert main(["show", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("collage-ml: error:") and "not a saved placed model" in err and "\n" not in err
    # no Graphviz: one line saying how to install it
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["show", str(d), "--svg", str(tmp_path / "x.svg")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("collage-ml: error:") and "\n" not in err
    assert "dot" in err and "apt-get install graphviz" in err
    assert not (tmp_path / "x.svg").exists()
    with pytest.raises(GraphvizMissing):
        collage_ml.show(d, tmp_path / "y.svg")


def _fake_report(pm) -> dict:
    return {
        "model": pm.graph.name, "mode": "exhaustive", "hardware": HW, "threads": 1, "chosen": "op-level",
        "plan_latency_ms": 1.0, "baselines_ms": {"fake-a": 1.2}, "baselines_e2e_ms": {"fake-a": 1.3},
        "op_level_ms": 1.0, "graph_level_ms": None, "generations": 0, "e2e_measurements": 1, "measurements": 0,
        "cache_hits": 0, "candidates": 0, "search_seconds": 0.0, "max_abs_error": 0.0, "outputs_match": True,
        "partitions": [{"backend": p.backend, "nodes": len(p.nodes)} for p in pm.plan.partitions],
    }


@needs_dot
def test_place_report_writes_the_picture_beside_it(saved, tmp_path, monkeypatch, capsys):
    from collage_ml import api

    _, pm = saved
    pm.report = _fake_report(pm)
    monkeypatch.setattr(api, "place", lambda *a, **k: pm)
    db = tmp_path / "m.db"
    Database(db, create=True).close()
    rep = tmp_path / "out" / "r.json"
    assert main(["place", "resnet50-tiny", "--db", str(db), "--report", str(rep), "--no-progress"]) == 0
    assert json.loads(rep.read_text())["chosen"] == "op-level"
    _, clusters, handoffs = _parse((tmp_path / "out" / "r.svg").read_text())
    assert len(clusters) == len(pm.plan.partitions) and handoffs
    assert "hand-off" in capsys.readouterr().out
    # without Graphviz, place still succeeds and says why there is no picture
    monkeypatch.setenv("PATH", str(tmp_path))
    rep2 = tmp_path / "out2" / "r.json"
    assert main(["place", "resnet50-tiny", "--db", str(db), "--report", str(rep2), "--no-progress"]) == 0
    assert rep2.exists() and not rep2.with_suffix(".svg").exists()
    assert "warning: no picture of the plan" in capsys.readouterr().err
