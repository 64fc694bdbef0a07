"""The public Python API: explicit signatures, docstrings, and one default for every shared parameter."""

import inspect

import pytest

import collage_ml
from collage_ml import api, defaults
from collage_ml.cli import build_parser

PUBLIC = ("place", "collect", "train", "evaluate", "load", "show")


@pytest.mark.parametrize("name", PUBLIC)
def test_explicit_signature_and_docstring(name):
    fn = getattr(collage_ml, name)
    assert fn is getattr(api, name)
    params = inspect.signature(fn).parameters.values()
    assert not [p for p in params if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert fn.__doc__ and len(fn.__doc__) > 80


SHARED = {
    "max_region_size": defaults.MAX_REGION_SIZE, "threads": defaults.THREADS, "db": defaults.DB,
    "backends": defaults.BACKENDS, "progress": defaults.PROGRESS,
}


def test_one_default_per_shared_parameter():
    from collage_ml import collector
    from collage_ml.search import tuner

    seen: dict[str, set] = {}
    for fn in (api.place, api.collect, api.train, api.evaluate, api.load, api.show):
        for p in inspect.signature(fn).parameters.values():
            if p.name in SHARED:
                seen.setdefault(p.name, set()).add(p.default)
    assert seen == {k: {v} for k, v in SHARED.items()}
    assert defaults.MAX_REGION_SIZE == 3
    from collage_ml.collector.planning import plan_lazily

    for fn in (tuner.place, collector.collect, collector.plan, plan_lazily):
        assert inspect.signature(fn).parameters["max_region_size"].default == defaults.MAX_REGION_SIZE
    assert inspect.signature(api.place).parameters["cost_model"].default == defaults.COST_MODEL
    assert inspect.signature(api.evaluate).parameters["artifact"].default == defaults.COST_MODEL
    # the CLI's defaults are the same ones
    p = build_parser()
    for argv in (["place", "m"], ["collect"]):
        assert p.parse_args(argv).max_region_size == defaults.MAX_REGION_SIZE
    assert p.parse_args(["train", "-o", "a"]).model == defaults.MODEL_KIND
    assert p.parse_args(["eval"]).artifact == defaults.COST_MODEL
    assert p.parse_args(["eval"]).db is None and p.parse_args(["place", "m"]).db is None


def test_place_takes_the_tuners_options_by_name():
    from collage_ml.search import tuner

    ours = set(inspect.signature(api.place).parameters)
    theirs = set(inspect.signature(tuner.place).parameters) - {"graph", "family"}
    assert theirs <= ours, theirs - ours
    ours = set(inspect.signature(api.collect).parameters)
    from collage_ml import collector

    theirs = {n for n in inspect.signature(collector.collect).parameters if not n.startswith("_")}
    assert theirs <= ours, theirs - ours
