"""Replay the guided op-level loop on a measured database: which rule decides what to measure, with no noise.

    .venv/bin/python benchmarks/guided_replay.py --db datasets/cpu-2core-zen5-m3/measurements.db \
        [--cost-model default|ARTIFACT ...] [--models all|a,b] [--max-region-size 2] [--json OUT]

A dataset collected with the enumerate sampler holds every candidate that
``place`` enumerates for a zoo model on this machine. This benchmark runs
:func:`collage_ml.search.guided.guided_op_level` against that table: its
``measure`` step reads the stored latency instead of timing, so one run is
deterministic, takes about a minute per cost model (mostly featurizing), and can be repeated for every rule and cost
model. For each model and cost model it prints how many distinct candidates
each rule "measured" and the cost of the DP plan it ends with, against the
optimum of the DP over the whole table (the exhaustive answer on the same
numbers). Rules: ``default`` (``GuidedConfig()``) and ``min-gain 0`` (a plan
with unmeasured candidates is pursued whatever gain it is predicted to bring
over the best plan measured in full, as before ``GuidedConfig.min_gain``).

Only the op-level loop is replayed: no end-to-end plan timings, no graph-level
search, and hand-offs cost 0 in both (the datasets hold no boundary costs).
Candidates the table lacks (TorchInductor's are subsampled to 25% by
``collect``) are left out of both sides. The cost model predicts with this
machine's probes from the same database, as ``place`` does.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from collage_ml.backends.base import resolve_backends
from collage_ml.candidates import enumerate_candidates
from collage_ml.db import Database
from collage_ml.featurize.hardware import calibrated
from collage_ml.ir import zoo
from collage_ml.ir.importers import import_model
from collage_ml.measure.runner import Runner
from collage_ml.models.base import load_model
from collage_ml.search.dp import solve
from collage_ml.search.guided import GuidedConfig, guided_op_level

RULES = {
    "min-gain 0": GuidedConfig(min_gain=0.0),  # the loop before the min_gain rule: every predicted gain is pursued
    "default": GuidedConfig(),
}


def replay(graph, backends, runner, model, hw, cfg: GuidedConfig, max_region_size: int) -> dict:
    cands = list(enumerate_candidates(graph, backends, max_region_size=max_region_size))
    table = {}
    for c in cands:
        m = runner.lookup(c.key)
        if m is not None:
            table[c.key] = m.median if m.valid else None
    cands = [c for c in cands if c.key in table]
    keys = [c.key for c in cands]
    best = solve(graph, cands, [table[k] for k in keys])
    mean, sd = model.predict(cands, hw)
    g = guided_op_level(graph, cands, keys, list(mean), list(sd), lambda idx: {keys[i]: table[keys[i]] for i in idx}, cfg=cfg)
    return {
        "candidates": len(set(keys)),
        "measured": g.new_measurements,
        "optimum_ms": best.cost * 1e3,
        "plan_ms": g.dp.cost * 1e3 if g.dp is not None else None,
        "spread": g.calibration.spread,
        "rounds": g.rounds,
        "fell_back": g.fell_back,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--cost-model", action="append", default=None,
                    help="artifact directory or 'default' (repeatable; default: default)")
    ap.add_argument("--models", default="all")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch,inductor")
    ap.add_argument("--max-region-size", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    models = zoo.names(include_tiny=False) if args.models == "all" else args.models.split(",")
    arts = args.cost_model or ["default"]
    backends = resolve_backends(args.backends)
    console = Console(width=200)
    out: dict = {}
    tmp = tempfile.TemporaryDirectory()  # the runner registers this machine: a copy, never the dataset itself
    copy = Path(tmp.name) / "replay.db"
    if not Path(args.db).is_file():
        raise SystemExit(f"guided_replay: no database at {args.db}")
    with Database(args.db, readonly=True):  # a corrupt file is reported under its own name, not the copy's
        pass
    shutil.copyfile(args.db, copy)
    with Database(copy) as db, Runner(db=db, threads=args.threads) as runner:
        hw = calibrated(runner, backends)  # the probes are in the database: nothing is timed
        for art in arts:
            model = load_model(art)
            t = Table(title=f"guided loop replayed on {Path(args.db).parent.name} ({runner.hardware}), cost model {art}, "
                            f"max region {args.max_region_size}")
            for c in ("model", "candidates", *(f"{r} meas." for r in RULES), "optimum ms",
                      *(f"{r} plan / optimum" for r in RULES), "spread"):
                t.add_column(c, justify="left" if c == "model" else "right")
            rows = out.setdefault(art, {})
            for m in models:
                graph = import_model(m)
                rows[m] = {r: replay(graph, backends, runner, model, hw, cfg, args.max_region_size) for r, cfg in RULES.items()}
                a, b = rows[m]["min-gain 0"], rows[m]["default"]
                t.add_row(m, str(a["candidates"]), *(str(rows[m][r]["measured"]) for r in RULES), f"{a['optimum_ms']:.3f}",
                          *(f"{rows[m][r]['plan_ms'] / rows[m][r]['optimum_ms']:.3f}" for r in RULES),
                          f"{b['spread']:.3f}")
            tot = {r: sum(rows[m][r]["measured"] for m in models) for r in RULES}
            cand = sum(rows[m]["default"]["candidates"] for m in models)
            geo = {r: math.exp(sum(math.log(rows[m][r]["plan_ms"] / rows[m][r]["optimum_ms"]) for m in models) / len(models))
                   for r in RULES}
            t.add_row("[bold]total / geomean[/]", str(cand), *(f"{tot[r]} ({tot[r] / cand:.1%})" for r in RULES), "",
                      *(f"{geo[r]:.3f}" for r in RULES), "")
            console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    from collage_ml.errors import CollageError

    try:
        main()
    except CollageError as e:  # a corrupt database, an artifact of another schema, a missing backend: one line
        raise SystemExit(f"guided_replay: {e}")
