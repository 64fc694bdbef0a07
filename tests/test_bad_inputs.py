"""Bad inputs through the real CLI: one clear line naming the file, exit 1, never a traceback.

The corpus (``tests/bad_corpus.py``) is built once per module; its cases run in-process through
``collage_ml.cli.main`` (fast), and a few things only a real process shows run as subprocesses: a closed
pipe, library chatter on file descriptor 1, and the placed-model loader as a user script calls it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from collage_ml import cli
from collage_ml.cli import main
from collage_ml.errors import CollageError
from tests import bad_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return root, bad_corpus.build(root)


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def verdict(case: bad_corpus.Case, rc, err: str) -> str | None:
    """None when the case ended cleanly: exit 1, exactly one error line naming the file, no traceback.
    Other stderr lines (a command's progress log before the error) are allowed."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("collage-ml: error:", "error:"))]
    if "Traceback" in err:
        return f"traceback: {err[-400:]!r}"
    if rc != 1:
        return f"exit {rc!r}, expected 1; stderr {err[-300:]!r}"
    if len(errors) != 1:
        return f"{len(errors)} error lines: {lines!r}"
    if case.path.name not in errors[0]:
        return f"the error does not name {case.path.name}: {errors[0]!r}"
    return None


def _run_in_process(case: bad_corpus.Case, capsys) -> tuple[object, str]:
    capsys.readouterr()
    if case.argv is None:
        import collage_ml

        try:
            collage_ml.load(case.path)
            rc, err = 0, ""
        except CollageError as e:
            rc, err = 1, f"error: {e}\n"
        return rc, err + capsys.readouterr().err
    try:
        rc = main(case.argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["model", "db", "placed", "artifact"])
def test_every_bad_input_gives_one_clean_line(corpus, capsys, kind):
    root, cases = corpus
    mine = [c for c in cases if c.kind == kind]
    assert len(mine) >= {"model": 21, "db": 36, "placed": 17, "artifact": 27}[kind]
    before = {c.path: _digest(c.path) for c in mine if c.path.is_file()}
    failures = []
    for c in mine:
        rc, err = _run_in_process(c, capsys)
        why = verdict(c, rc, err)
        if why:
            failures.append(f"{c.label}: {why}")
    assert not failures, "\n".join(failures)
    changed = [str(p) for p, d in before.items() if _digest(p) != d]
    assert not changed, f"bad inputs were modified: {changed}"  # a foreign file is only ever read
    assert not bad_corpus.marker_of(root).exists()


def test_malicious_placed_model_runs_nothing_in_a_fresh_process(corpus):
    """The loader as a user calls it, in a process of its own: the tampered specs would `touch` a file."""
    root, cases = corpus
    marker = bad_corpus.marker_of(root)
    evil = [c for c in cases if c.kind == "placed" and c.name.startswith("spec-")]
    assert len(evil) == 3
    for c in evil:
        r = subprocess.run(c.command(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "is not the registered backend" in r.stderr and "partition 0" in r.stderr, r.stderr
    assert not marker.exists()


# -- three failures that are not about an input file ------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    model = root / "good.onnx"
    onnx.save(bad_corpus.good_model(), str(model))
    return root, model


def _place_args(root: Path, model: Path, *extra: str) -> list[str]:
    return ["place", str(model), "--backends", "onnxruntime", "--db", str(root / "m.db"), "--max-region-size", "1",
            "--no-graph-level", "--no-progress", *extra]


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if ln.startswith("collage-ml: error:")]
    assert len(errors) == 1, err
    return errors[0]


def test_unwritable_out_is_one_line(small, capsys):
    root, model = small
    blocker = root / "a-file"
    blocker.write_text("not a folder")
    assert main(_place_args(root, model, "--out", str(blocker / "placed"))) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "a-file" in line and "Not a directory" in line, line
    assert main(["zoo", "export", "dcgan-tiny", "-o", str(blocker / "m.onnx")]) == 1
    assert "a-file" in _one_error_line(capsys.readouterr().err)


def test_worker_that_does_not_start_is_one_line(small, capsys, monkeypatch):
    root, model = small
    from collage_ml.measure import worker

    monkeypatch.setattr(worker, "STARTUP_TIMEOUT", 1e-4)  # the real start-up check fails
    assert main(_place_args(root, model, "--db", str(root / "fresh.db"))) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "worker did not start" in line, line


def test_closed_pipe_is_quiet(small):
    root, _ = small
    db = bad_corpus.good_db(root / "pipe.db")
    for extra in ([], ["--json"]):
        p = subprocess.Popen([sys.executable, "-m", "collage_ml.cli", "db", "stats", str(db), *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()  # the reader is gone before the first write, as with `| head -0`
        err = p.stderr.read().decode()
        rc = p.wait(60)
        assert rc == 141 and err == "", (rc, err)


# -- --json prints only JSON, whatever a library writes to fd 1 -------------------------------------------
def _chatty(fn):
    def run(args):
        os.write(1, b"The device supports: i8sdot:0, fp16:0 (fd 1 chatter)\n")
        libc = ctypes.CDLL(None)
        libc.printf(b"printf chatter from C\n")  # buffered in C stdio: flushed by the redirect
        return fn(args)

    return run


def test_every_json_command_prints_only_json(small, capfd, monkeypatch):
    root, model = small
    for name in list(cli.COMMANDS):
        monkeypatch.setitem(cli.COMMANDS, name, _chatty(cli.COMMANDS[name]))
    db = root / "json.db"
    from collage_ml.models.base import shipped_artifacts

    artifact = next(str(p) for p, m in shipped_artifacts() if m.get("kind") == "xgb")
    from collage_ml.measure import probes

    monkeypatch.setattr(probes, "PROBES", probes.PROBES[10:11])  # one probe kernel: calibrate stays fast
    import dataclasses
    import math

    from collage_ml.measure.timing import TimingConfig

    # On a busy machine the protocol marks rows contended, and eval (which leaves those out) would find none.
    # collect builds TimingConfig() when it runs: give that default no contention limit for this test (the
    # class itself must stay the module's, for pickling it to the workers)
    names = [f.name for f in dataclasses.fields(TimingConfig) if f.init]
    defaults = dict(zip(names, TimingConfig.__init__.__defaults__))
    defaults.update(max_pressure=math.inf, max_steal=math.inf, contention_retries=0)
    monkeypatch.setattr(TimingConfig.__init__, "__defaults__", tuple(defaults[n] for n in names))
    commands = [
        ["calibrate", "--backends", "onnxruntime", "--db", str(db), "--json"],
        ["zoo", "--json"],
        ["inspect", str(model), "--json"],
        ["backends", "--json"],
        ["collect", "--models", str(model), "--backends", "onnxruntime", "--db", str(db), "--max-region-size", "1",
         "--no-progress", "--json"],
        ["db", "stats", str(db), "--json"],
        ["eval", "--db", str(db), "--artifact", artifact, "--no-progress", "--json"],
        ["train", "--db", str(db), "--model", "xgb", "-o", str(root / "art"), "--param", "n_members=1",
         "--param", "n_estimators=5", "--no-progress", "--json"],
    ]
    parsers = {tuple(a for a in c[:2] if not a.startswith(("-", "/"))) for c in commands}
    assert {("zoo",), ("backends",), ("db", "stats"), ("collect",), ("train",), ("eval",)} <= parsers
    for argv in commands:
        capfd.readouterr()
        rc = main(argv)
        out, err = capfd.readouterr()
        assert rc == 0, (argv, err[-500:])
        json.loads(out)  # nothing but the JSON document
        assert "fd 1 chatter" in err and "printf chatter" in err, (argv, err[-300:])
    # every subcommand with a --json flag is in the list above
    flagged = set()
    for action in cli.build_parser()._subparsers._group_actions[0].choices.items():
        name, sub = action
        if any("--json" in a.option_strings for a in sub._actions):
            flagged.add(name)
        for a in sub._actions:
            if getattr(a, "choices", None) and isinstance(a.choices, dict):
                flagged |= {f"{name} {k}" for k, s in a.choices.items()
                            if any("--json" in x.option_strings for x in s._actions)}
    covered = {" ".join(a for a in c[:2] if not a.startswith(("-", "/"))) for c in commands}
    assert flagged <= covered, flagged - covered


def test_backends_json_parses_with_mnn_installed():
    """The real chatter: importing MNN's converter prints a CPU-feature line to fd 1."""
    pytest.importorskip("MNN")
    r = subprocess.run([sys.executable, "-m", "collage_ml.cli", "backends", "--json"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    rows = json.loads(r.stdout)
    mnn = [b for b in rows if b["name"] == "mnn"]
    assert mnn and mnn[0]["available"], mnn
    assert "The device supports" not in r.stdout


def test_reading_a_database_never_changes_it(small, capsys):
    """`db stats` and `db export` on a shipped dataset (here: one in rollback-journal mode, as
    datasets/cpu-2core-zen4-t1 is) leave its bytes alone; opening it for writing would turn it into WAL."""
    root, _ = small
    db = bad_corpus.good_db(root / "rollback.db")
    import sqlite3

    c = sqlite3.connect(db)
    assert c.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    c.close()
    before = _digest(db)
    assert main(["db", "stats", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 0
    pytest.importorskip("pyarrow")
    assert main(["db", "export", str(db), "--parquet", str(root / "x.parquet")]) == 0
    assert _digest(db) == before
