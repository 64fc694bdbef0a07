"""A corpus of bad inputs for every CLI command that reads a file, and the command lines that read them.

``build(root)`` writes the corpus under ``root`` (about a second, no measurements) and returns
:class:`Case` objects: one per (bad input, command that takes that kind of input). Each case must end
in a non-zero exit (1 for a bad model or file) with one line on stderr that names the file and the
problem, and no traceback. The tests (``tests/test_bad_inputs.py``) run the cases in-process through
``collage_ml.cli.main``; ``benchmarks/bad_inputs.py`` runs them as subprocesses and counts.

Kinds: ONNX models (truncated, bit-flipped, empty, a cycle, a missing initializer, an unknown op, an
unresolvable symbolic dimension), measurement databases (corrupt, truncated, a foreign SQLite file, a
newer schema), placed-model folders (tampered plan.json, swapped weights, malformed report.json), and
cost-model artifacts (damaged meta.json, missing or garbage xgb members, another schema version; a missing,
garbage or code-carrying pickle as a GNN state file).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the placed model's loader, as a user would call it (one line on stderr, exit 1, for a CollageError)
LOAD_SCRIPT = (
    "import sys, collage_ml\n"
    "from collage_ml.errors import CollageError\n"
    "try:\n"
    "    collage_ml.load(sys.argv[1])\n"
    "except CollageError as e:\n"
    "    print(f'error: {e}', file=sys.stderr); sys.exit(1)\n"
)


@dataclass
class Case:
    kind: str  # model | db | placed | artifact
    name: str  # the bad input, e.g. "truncated.onnx"
    path: Path  # the bad file or folder, which the error line must name
    argv: list[str] | None  # collage-ml arguments; None: load ``path`` with LOAD_SCRIPT

    @property
    def label(self) -> str:
        what = "load" if self.argv is None else " ".join(a for a in self.argv[:2] if not a.startswith("/"))
        return f"{self.kind}:{self.name}:{what}"

    def command(self) -> list[str]:
        """The whole command line, for a subprocess."""
        if self.argv is None:
            return [sys.executable, "-c", LOAD_SCRIPT, str(self.path)]
        return [sys.executable, "-m", "collage_ml.cli", *self.argv]


def good_model() -> onnx.ModelProto:
    """x[1,8] -> MatMul(W) -> Relu -> Add(b) -> y: small, valid, fast on every backend."""
    rs = np.random.default_rng(0)
    W = numpy_helper.from_array(rs.standard_normal((8, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(rs.standard_normal((8,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
        helper.make_node("Relu", ["mm"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "b"], ["y"], name="add"),
    ]
    g = helper.make_graph(nodes, "good", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], initializer=[W, b])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def bad_models(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)
    good = good_model().SerializeToString()
    out: dict[str, Path] = {}

    def put(name: str, data: bytes) -> None:
        (d / name).write_bytes(data)
        out[name] = d / name

    put("truncated.onnx", good[: len(good) // 3])
    flipped = bytearray(good)
    flipped[0] ^= 0xFF  # the first field's tag: wire type 7 does not exist, so protobuf cannot parse it
    put("bitflipped.onnx", bytes(flipped))
    put("empty.onnx", b"")
    W = numpy_helper.from_array(np.ones((8, 8), np.float32), "W")
    put("cycle.onnx", _model([helper.make_node("Add", ["x", "b2"], ["a1"], name="a"),
                              helper.make_node("Relu", ["a1"], ["b2"], name="b")],
                             [_vi("x", [1, 8])], [_vi("b2", [1, 8])]).SerializeToString())
    put("missing-initializer.onnx", _model([helper.make_node("MatMul", ["x", "W_absent"], ["y"], name="mm")],
                                           [_vi("x", [1, 8])], [_vi("y", [1, 8])]).SerializeToString())
    put("unknown-op.onnx", _model([helper.make_node("FrobnicateTensor", ["x"], ["y"], name="frob")],
                                  [_vi("x", [1, 8])], [_vi("y", [1, 8])]).SerializeToString())
    put("symbolic-dim.onnx", _model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
                                    [_vi("x", ["batch", 8])], [_vi("y", ["batch", 8])], [W]).SerializeToString())
    return out


def good_db(path: Path) -> Path:
    """An empty, valid collage-ml database."""
    from collage_ml.db import Database

    Database(path).close()
    return path


def bad_dbs(d: Path) -> dict[str, Path]:
    from collage_ml.db import SCHEMA_VERSION

    d.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    ok = good_db(d / "valid.db.src")
    raw = ok.read_bytes()
    (d / "corrupt.db").write_bytes(raw[:100] + bytes(b ^ 0x5A for b in raw[100:]))  # a header, then noise
    (d / "truncated.db").write_bytes(raw[:60])
    out["corrupt.db"], out["truncated.db"] = d / "corrupt.db", d / "truncated.db"
    foreign = d / "foreign.db"  # a valid SQLite file of another application
    c = sqlite3.connect(foreign)
    c.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT)")
    c.execute("INSERT INTO moz_places (url) VALUES ('https://example.org')")
    c.commit()
    c.close()
    out["foreign.db"] = foreign
    newer = d / "newer-schema.db"
    shutil.copy(ok, newer)
    c = sqlite3.connect(newer)
    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    c.commit()
    c.close()
    out["newer-schema.db"] = newer
    ok.unlink()
    return out


def placed_model(path: Path) -> Path:
    """A valid placed model of :func:`good_model`, whole on onnxruntime."""
    from collage_ml.backends.base import get_backend
    from collage_ml.ir.importers import from_onnx
    from collage_ml.plan import Plan

    g = from_onnx(good_model(), name="good")
    pm = Plan.single(g, get_backend("onnxruntime"), threads=1).compile(g)
    pm.report = {"model": "good"}
    return pm.save(path)


def _edit_plan(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    plan = json.loads((dst / "plan.json").read_text())
    edit(plan)
    (dst / "plan.json").write_text(json.dumps(plan))
    return dst


def bad_placed(d: Path, marker: Path) -> dict[str, Path]:
    """Tampered copies of a placed model. ``marker`` is the file the malicious ones try to create."""
    d.mkdir(parents=True, exist_ok=True)
    src = placed_model(d / "valid.src")
    p0 = lambda plan: plan["partitions"][0]  # noqa: E731
    evil = {"args": ["touch", str(marker)]}
    edits = {
        "spec-subprocess": lambda p: p0(p).update(backend_spec=["subprocess", "run", evil]),
        "spec-os-system": lambda p: (p.update(format=1), p0(p).update(backend_spec=["os", "system",
                                                                                   {"command": f"touch {marker}"}])),
        "spec-other-class": lambda p: (p.update(format=1), p0(p).update(
            backend_spec=["collage_ml.backends.torch_backend", "TorchBackend", {}])),
        "backend-by-path": lambda p: p0(p).update(backend="subprocess:run"),
        "config-off-grid": lambda p: p0(p).update(backend="onnxruntime[spin=maybe]"),
        "config-unknown-key": lambda p: p0(p).update(backend="onnxruntime[preload=/tmp/x.so]"),
        "negative-index": lambda p: p0(p).update(nodes=[-1, 0, 1, 2]),
        "string-index": lambda p: p0(p).update(nodes=["0", 1, 2]),
        "index-past-end": lambda p: p0(p).update(nodes=[0, 1, 2, 99]),
        "no-graph-hash": lambda p: p.pop("graph_hash"),
        "other-graph-hash": lambda p: p.update(graph_hash="0" * 40),
        "no-model-hash": lambda p: p.pop("model_sha256"),
        "partitions-not-a-list": lambda p: p.update(partitions={"0": 1}),
    }
    out = {name: _edit_plan(src, d / name, f) for name, f in edits.items()}
    # not JSON at all
    shutil.copytree(src, d / "plan-not-json")
    (d / "plan-not-json" / "plan.json").write_text('{"format": 2, "partitions": [')
    out["plan-not-json"] = d / "plan-not-json"
    # same graph, other weights: the graph hash matches, the content hash does not
    shutil.copytree(src, d / "swapped-weights")
    m = onnx.load(str(d / "swapped-weights" / "model.onnx"))
    for t in m.graph.initializer:
        arr = numpy_helper.to_array(t)
        t.CopyFrom(numpy_helper.from_array((arr * -1.0 + 0.5).astype(arr.dtype), t.name))
    onnx.save(m, str(d / "swapped-weights" / "model.onnx"))
    out["swapped-weights"] = d / "swapped-weights"
    shutil.copytree(src, d / "report-not-json")
    (d / "report-not-json" / "report.json").write_text("{not json")
    out["report-not-json"] = d / "report-not-json"
    shutil.copytree(src, d / "truncated-model")
    raw = (d / "truncated-model" / "model.onnx").read_bytes()
    (d / "truncated-model" / "model.onnx").write_bytes(raw[: len(raw) // 2])
    out["truncated-model"] = d / "truncated-model"
    shutil.rmtree(src)
    return out


def good_artifact(path: Path) -> Path:
    """A small fitted xgb cost model (the shipped default, copied: fitting one takes longer)."""
    from collage_ml.models.base import default_artifact

    try:
        src = default_artifact(kind="xgb")
    except Exception:  # no shipped model fits this machine: any shipped xgb artifact will do
        from collage_ml.models.base import shipped_artifacts

        src = next(p for p, m in shipped_artifacts() if m.get("kind") == "xgb")
    shutil.copytree(src, path)
    return path


def bad_artifacts(d: Path, marker: Path) -> dict[str, Path]:
    from collage_ml.models.base import META, shipped_artifacts

    d.mkdir(parents=True, exist_ok=True)
    src = good_artifact(d / "valid.src")
    meta = json.loads((src / META).read_text())
    out: dict[str, Path] = {}

    def variant(name: str, edit) -> None:
        shutil.copytree(src, d / name)
        edit(d / name)
        out[name] = d / name

    variant("meta-missing", lambda p: (p / META).unlink())
    variant("meta-not-json", lambda p: (p / META).write_text('{"format": '))
    variant("meta-truncated", lambda p: (p / META).write_text((src / META).read_text()[:40]))
    variant("member-missing", lambda p: (p / "member-0.json").unlink())
    variant("member-garbage", lambda p: (p / "member-0.json").write_bytes(b"\x00\xffnot a booster"))
    variant("member-empty", lambda p: (p / "member-0.json").write_bytes(b""))
    variant("other-schema", lambda p: (p / META).write_text(json.dumps({**meta, "schema_version": 10**6})))
    variant("members-count-wrong", lambda p: (p / META).write_text(json.dumps({**meta, "members": 40})))
    shutil.rmtree(src)
    gnn = next((p for p, m in shipped_artifacts() if m.get("kind") == "gnn"), None)
    if gnn is not None:
        from collage_ml.models.gnn import STATE

        src = gnn

        def pickled_code(p: Path) -> None:  # a state file that runs a command if unpickled unsafely
            import torch

            torch.save({"w": _Touch(str(marker))}, p / STATE)

        variant("gnn-state-missing", lambda p: (p / STATE).unlink())
        variant("gnn-state-garbage", lambda p: (p / STATE).write_bytes(b"PK\x03\x04 not a torch file"))
        variant("gnn-state-pickled-code", pickled_code)
    blend = next((p for p, m in shipped_artifacts() if m.get("kind") == "blend"), None)
    if blend is not None:
        src = blend
        variant("blend-member-missing", lambda p: shutil.rmtree(p / "member-1-gnn"))
        variant("blend-member-garbage", lambda p: (p / "member-0-xgb" / "member-0.json").write_bytes(b"\x00\xff"))
        variant("blend-member-outside", lambda p: (p / META).write_text(json.dumps(
            {**json.loads((p / META).read_text()), "member_dirs": ["../valid.src", "member-1-gnn"]})))
    return out


class _Touch:
    """Pickles to ``os.system("touch PATH")``: what an unsafe torch.load would run."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.path}",))


def build(root: Path) -> list[Case]:
    """Writes the corpus under ``root`` and returns every (bad input, command) case."""
    root = Path(root)
    model = root / "good.onnx"
    onnx.save(good_model(), str(model))
    scratch = root / "scratch"  # outputs of commands that should never get that far
    scratch.mkdir(parents=True, exist_ok=True)
    db_ok = good_db(root / "good.db")
    marker = root / "PWNED"
    fast = ["--max-region-size", "1", "--no-progress"]
    cases: list[Case] = []
    for name, p in bad_models(root / "models").items():
        s = str(p)
        cases += [
            Case("model", name, p, ["inspect", s]),
            Case("model", name, p, ["place", s, "--backends", "onnxruntime", "--db", str(scratch / "m.db"),
                                    "--no-graph-level", *fast]),
            Case("model", name, p, ["collect", "--models", s, "--backends", "onnxruntime",
                                    "--db", str(scratch / "m.db"), *fast]),
        ]
    for name, p in bad_dbs(root / "dbs").items():
        s = str(p)
        cases += [
            Case("db", name, p, ["db", "stats", s]),
            Case("db", name, p, ["db", "stats", s, "--json"]),
            Case("db", name, p, ["db", "merge", str(scratch / f"into-{name}"), s]),
            Case("db", name, p, ["db", "merge", s, str(db_ok)]),
            Case("db", name, p, ["db", "export", s, "--parquet", str(scratch / f"{name}.parquet")]),
            Case("db", name, p, ["train", "--db", s, "--model", "xgb", "-o", str(scratch / f"art-{name}"),
                                 "--no-progress"]),
            Case("db", name, p, ["eval", "--db", s, "--artifact", "default", "--no-progress"]),
            Case("db", name, p, ["place", str(model), "--backends", "onnxruntime", "--db", s,
                                 "--no-graph-level", *fast]),
            Case("db", name, p, ["collect", "--models", str(model), "--backends", "onnxruntime", "--db", s, *fast]),
        ]
    for name, p in bad_placed(root / "placed", marker).items():
        cases.append(Case("placed", name, p, None))
    for name, p in bad_artifacts(root / "artifacts", marker).items():
        s = str(p)
        cases += [
            Case("artifact", name, p, ["eval", "--db", str(db_ok), "--artifact", s, "--no-progress"]),
            Case("artifact", name, p, ["place", str(model), "--backends", "onnxruntime", "--mode", "guided",
                                       "--cost-model", s, "--db", str(scratch / "g.db"), "--no-graph-level",
                                       *fast]),
            Case("artifact", name, p, ["collect", "--models", str(model), "--backends", "onnxruntime", "--sampler",
                                       "focus", "--cost-model", s, "--db", str(scratch / "f.db"), *fast]),
        ]
    return cases


def marker_of(root: Path) -> Path:
    """The file the malicious placed models try to create: it must never exist."""
    return Path(root) / "PWNED"
