"""Rows record their decision (source graph hash, first node), so eval groups them on any model, zoo or not."""

from __future__ import annotations

from collage_ml.backends import resolve_backends
from collage_ml.candidates import enumerate_candidates
from collage_ml.db import Database
from collage_ml.ir import from_onnx
from collage_ml.measure.runner import Runner
from collage_ml.measure.timing import LEGACY
from collage_ml.models.dataset import Dataset
from collage_ml.models.evaluate import decision_groups
from tests.helpers import chain_model


def test_rows_of_a_model_outside_the_zoo_form_decision_groups(tmp_path):
    g = from_onnx(chain_model(), name="not-in-the-zoo")
    cands = list(enumerate_candidates(g, resolve_backends("onnxruntime,torch"), max_region_size=2))
    with Database(tmp_path / "m.db") as db:
        with Runner(db=db, threads=1, timing=LEGACY) as r:
            ms = r.measure(cands, g.reference(), family="not-in-the-zoo")
        assert all(m.extra["source"] == g.whole().hash for m in ms)
        assert {m.extra["first_node"] for m in ms} == set(range(len(g.nodes)))
        ds = Dataset.from_db(db)
    groups = decision_groups(ds)
    assert len(groups) >= len(g.nodes) - 1 and "not-in-the-zoo" not in groups.unrebuilt
    for idx in groups:  # every group: candidates that start at the same node
        assert len({ds.samples[i].decision for i in idx}) == 1
    # every node that two candidates start at is a decision; only single-candidate nodes stay ungrouped
    starts = {}
    for s in ds.samples:
        starts.setdefault(s.decision, []).append(s)
    assert groups.ungrouped == sum(len(v) for v in starts.values() if len(v) < 2)
