"""benchmarks/cost_model.py's fold selection (the benchmark itself runs for minutes; its parts are tested here)."""

from __future__ import annotations


import pytest

from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("cost_model")


FOLDS = [
    ("machine", "Xeon AMX t1", set(), None),
    ("machine", "Xeon AMX t2", set(), None),
    ("machine", "Zen 3 t1", set(), None),
    ("cpu", "Xeon AMX, every thread count", set(), None),
    ("cpu", "Zen 3, every thread count", set(), None),
]


def _labels(folds):
    return [f[1] for f in folds]


def test_a_label_with_a_comma_selects_that_fold_alone(bench):
    assert _labels(bench.select_folds(FOLDS, "Xeon AMX, every thread count")) == ["Xeon AMX, every thread count"]


def test_substring_and_comma_separated_parts(bench):
    assert _labels(bench.select_folds(FOLDS, "Zen 3")) == ["Zen 3 t1", "Zen 3, every thread count"]
    # no label holds the whole text, so its parts are read one by one (the form stop 38 ran)
    assert _labels(bench.select_folds(FOLDS, "Zen 3 t1,every")) == [
        "Zen 3 t1", "Xeon AMX, every thread count", "Zen 3, every thread count"]


def test_no_match_is_one_line_naming_the_folds(bench):
    with pytest.raises(SystemExit) as e:
        bench.select_folds(FOLDS, "Zen 9")
    msg = str(e.value)
    assert "'Zen 9'" in msg and "no hardware-out fold matches" in msg and "Zen 3 t1" in msg and "\n" not in msg


def test_the_machine_out_datasets_leave_out_synthetic_and_configuration_sets(bench, tmp_path):
    import shipped_datasets  # on sys.path once the benchmark is loaded

    for name in ("cpu-2core-a-m5", "cpu-2core-a-synth-m5", "cpu-2core-b-synth-v2-m5", "cpu-2core-a-configs"):
        (tmp_path / "datasets" / name).mkdir(parents=True)
        (tmp_path / "datasets" / name / "measurements.db").touch()
    (tmp_path / "datasets" / "reruns").mkdir()  # no measurements.db at its top: not a dataset
    names = lambda dbs: [p.parent.name for p in dbs]  # noqa: E731
    assert names(shipped_datasets.dataset_dbs(root=tmp_path)) == [
        "cpu-2core-a-m5", "cpu-2core-a-synth-m5", "cpu-2core-b-synth-v2-m5"]
    assert names(shipped_datasets.dataset_dbs(synthetic=False, root=tmp_path)) == ["cpu-2core-a-m5"]
    assert set(bench.DEFAULT_HW_DBS) == set(shipped_datasets.dataset_dbs(synthetic=False))
    assert bench.DEFAULT_HW_DBS and not any("synth" in p.parent.name or "configs" in p.parent.name
                                            for p in bench.DEFAULT_HW_DBS)
