"""Replay the guided op-level loop on a measured database: which rule decides what to measure, with no noise.

    .venv/bin/python benchmarks/guided_replay.py --db datasets/cpu-2core-zen5-m3/measurements.db \
        [--cost-model default|ARTIFACT ...] [--models all|a,b] [--max-region-size 2] [--json OUT] \
        [--hardware FP --threads N] [--without FP,FP [--without-kind xgb,gnn,blend] [--xgb-param KEY=VALUE]
        [--without-synthetic]]

A dataset collected with the enumerate sampler holds every candidate that
``place`` enumerates for a zoo model on this machine. This benchmark runs
:func:`collage_ml.search.guided.guided_op_level` against that table: its
``measure`` step reads the stored latency instead of timing, so one run is
deterministic, takes about a minute per cost model (mostly featurizing), and can be repeated for every rule and cost
model. For each model and cost model it prints how many distinct candidates
each rule "measured" and the cost of the DP plan it ends with, against the
optimum of the DP over the whole table (the exhaustive answer on the same
numbers). Rules: ``default`` (``GuidedConfig()``), ``min-gain 0`` (a plan
with unmeasured candidates is pursued whatever gain it is predicted to bring
over the best plan measured in full, as before ``GuidedConfig.min_gain``) and
``sample 0`` (a pursued plan's parts are measured in full at once, as before
``GuidedConfig.sample_first``). The optimum sums its parts with hand-offs
priced at 0, and on some models (dcgan and resnet3d50 on the Zen 3 at one
thread) the parts sum to far less than any backend's whole model, a mix no
end-to-end run has reproduced; so the table also shows the default rule's
plan against the fastest whole model on one backend (``single_ms``).

``--hardware`` replays another machine's rows (a dataset from another CPU
kind; its probes are read from the database, never timed here), and
``--without`` adds a model trained on every dataset but those fingerprints:
with every thread count of the replayed CPU kind left out, the replay tests
guided placement on a CPU kind the model never saw.

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
from collage_ml.featurize.hardware import HardwareDesc, calibrated
from collage_ml.measure.probes import PROBE_SET_VERSION
from collage_ml.ir import zoo
from collage_ml.ir.importers import import_model
from collage_ml.measure.runner import Runner
from collage_ml.models.base import load_model
from collage_ml.search.dp import solve
from collage_ml.search.guided import GuidedConfig, guided_op_level

RULES = {
    "min-gain 0": GuidedConfig(min_gain=0.0),  # the loop before the min_gain rule: every predicted gain is pursued
    "sample 0": GuidedConfig(sample_first=0),  # a pursued plan's parts measured in full at once, as before sample_first
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
    whole = [table[c.key] for c in cands if c.subgraph.mask == graph.all_mask and table[c.key] is not None]
    mean, sd = model.predict(cands, hw)
    g = guided_op_level(graph, cands, keys, list(mean), list(sd), lambda idx: {keys[i]: table[keys[i]] for i in idx}, cfg=cfg)
    return {
        "candidates": len(set(keys)),
        "measured": g.new_measurements,
        "optimum_ms": best.cost * 1e3,
        # the fastest whole model on one backend, where the table has it (max region size permitting): the
        # optimum is a sum of parts with free hand-offs, which an end-to-end run need not reproduce
        "single_ms": min(whole) * 1e3 if whole else None,
        "plan_ms": g.dp.cost * 1e3 if g.dp is not None else None,
        "spread": g.calibration.spread,
        "rounds": g.rounds,
        "fell_back": g.fell_back,
    }


def _trained_without(fingerprints: list[str], params: dict | None = None, kind: str = "xgb",
                     synthetic: bool = True) -> Path:
    """A ``kind`` artifact (``params`` over XGBoost's defaults) trained on every dataset (as
    ``guided_vs_exhaustive.py`` picks them; without the synthetic-network sets where ``synthetic`` is False) but
    the rows of ``fingerprints``; trained once, then read from the cache. A ``blend`` is the XGBoost and GNN
    artifacts of the same rows, blended (trained if not cached)."""
    import hashlib

    from guided_vs_exhaustive import ROOT, _all_data, _tag

    from collage_ml.featurize.schema import SCHEMA_VERSION
    from collage_ml.models import create_model
    from collage_ml.models.blend import BlendCostModel

    params = dict(params or {})
    name = hashlib.sha1((",".join(fingerprints) + json.dumps(params, sort_keys=True)
                         + ("" if synthetic else "-no-synthetic")).encode()).hexdigest()[:10]
    art = ROOT / ".cache" / "guided-bench" / f"without-{name}-{kind}-s{SCHEMA_VERSION}-{_tag(kind)}"
    if not (art / "meta.json").exists():
        if kind == "blend":
            members = [load_model(_trained_without(fingerprints, params, k, synthetic)) for k in ("xgb", "gnn")]
            BlendCostModel.of(members).save(art)
            return art
        left_out = set(fingerprints)
        data = _all_data(synthetic)
        train = data.filter(lambda s: s.hardware not in left_out)
        if len(train) == len(data):
            raise SystemExit(f"guided_replay: no dataset has rows of {', '.join(fingerprints)}")
        create_model(kind, **(params if kind == "xgb" else {})).fit(train).save(art)
    return art


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--cost-model", action="append", default=None,
                    help="artifact directory or 'default' (repeatable; default: default)")
    ap.add_argument("--models", default="all")
    ap.add_argument("--backends", default="onnxruntime,openvino,torch,inductor")
    ap.add_argument("--max-region-size", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--hardware", default=None,
                    help="replay the rows of this fingerprint (default: this machine's), e.g. a dataset from another CPU "
                         "kind; the cost model then reads that machine's description and probes from the database")
    ap.add_argument("--xgb-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a parameter of the --without model (e.g. target=log; repeatable)")
    ap.add_argument("--without", default=None, metavar="FP[,FP...]",
                    help="also replay an XGBoost model trained on every dataset except these fingerprints (every "
                         "thread count of the replayed CPU kind, to test a CPU kind the model never saw); cached "
                         "under .cache/guided-bench/")
    ap.add_argument("--without-kind", default="xgb", metavar="KIND[,KIND...]",
                    help="the --without models' kinds: xgb, gnn, blend (default: xgb)")
    ap.add_argument("--without-synthetic", action="store_true",
                    help="train the --without models without the synthetic-network datasets too")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    models = zoo.names(include_tiny=False) if args.models == "all" else args.models.split(",")
    arts = args.cost_model or ["default"]
    if args.without:
        params = {}
        for item in args.xgb_param:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise SystemExit(f"guided_replay: --xgb-param expects KEY=VALUE, got {item!r}")
            try:
                params[key] = json.loads(value)
            except json.JSONDecodeError:
                params[key] = value
        for kind in args.without_kind.split(","):
            if kind not in ("xgb", "gnn", "blend"):
                raise SystemExit(f"guided_replay: --without-kind takes xgb, gnn or blend, not {kind!r}")
            arts.append(str(_trained_without(sorted(args.without.split(",")), params, kind,
                                             synthetic=not args.without_synthetic)))
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
        if args.hardware:
            info = db.hardware_info(args.hardware)
            if info is None:
                raise SystemExit(f"guided_replay: {args.db} has no machine {args.hardware}")
            runner.hardware = args.hardware  # the lookups read that machine's rows
            # its probes are read, never measured here (this machine is another one)
            table = {b.name: db.probes(args.hardware, b.name, b.version, runner.timing.name, PROBE_SET_VERSION)
                     for b in backends}
            if not any(table.values()):
                raise SystemExit(f"guided_replay: {args.db} has no probes of {args.hardware} under "
                                 f"{runner.timing.name}")
            hw = HardwareDesc.from_info(info, runner.threads).with_probes(table)
        else:
            machines = db.stats()["hardware"]
            if runner.hardware not in machines:  # say so before timing probes for a machine with no rows
                raise SystemExit(
                    f"guided_replay: {args.db} has no rows of this machine ({runner.hardware}); replay one of "
                    f"its machines with --hardware FP --threads N: "
                    + ", ".join(f"{fp} ({n} rows)" for fp, n in machines.items()))
            hw = calibrated(runner, backends)  # the probes are in the database: nothing is timed
        for art in arts:
            model = load_model(art)
            t = Table(title=f"guided loop replayed on {Path(args.db).parent.name} ({runner.hardware}), cost model {art}, "
                            f"max region {args.max_region_size}")
            for c in ("model", "candidates", *(f"{r} meas." for r in RULES), "optimum ms",
                      *(f"{r} plan / optimum" for r in RULES), "default plan / best whole model", "spread"):
                t.add_column(c, justify="left" if c == "model" else "right")
            rows = out.setdefault(art, {})
            for m in models:
                graph = import_model(m)
                rows[m] = {r: replay(graph, backends, runner, model, hw, cfg, args.max_region_size) for r, cfg in RULES.items()}
                a, b = rows[m]["min-gain 0"], rows[m]["default"]
                t.add_row(m, str(a["candidates"]), *(str(rows[m][r]["measured"]) for r in RULES), f"{a['optimum_ms']:.3f}",
                          *(f"{rows[m][r]['plan_ms'] / rows[m][r]['optimum_ms']:.3f}" for r in RULES),
                          f"{b['plan_ms'] / b['single_ms']:.3f}" if b["single_ms"] else "-",
                          f"{b['spread']:.3f}")
            tot = {r: sum(rows[m][r]["measured"] for m in models) for r in RULES}
            cand = sum(rows[m]["default"]["candidates"] for m in models)
            geo = {r: math.exp(sum(math.log(rows[m][r]["plan_ms"] / rows[m][r]["optimum_ms"]) for m in models) / len(models))
                   for r in RULES}
            singles = [rows[m]["default"] for m in models if rows[m]["default"]["single_ms"]]
            geo_single = (math.exp(sum(math.log(r["plan_ms"] / r["single_ms"]) for r in singles) / len(singles))
                          if singles else None)
            t.add_row("[bold]total / geomean[/]", str(cand), *(f"{tot[r]} ({tot[r] / cand:.1%})" for r in RULES), "",
                      *(f"{geo[r]:.3f}" for r in RULES), "-" if geo_single is None else f"{geo_single:.3f}", "")
            console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    from collage_ml.errors import CollageError

    try:
        main()
    except CollageError as e:  # a corrupt database, an artifact of another schema, a missing backend: one line
        raise SystemExit(f"guided_replay: {e}")
