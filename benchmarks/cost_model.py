"""Cost models side by side: leave-one-family-out, a random split, and few-shot transfer to other hardware.

    .venv/bin/python benchmarks/cost_model.py --plot docs/cost-model-scatter.png --json results.json
    .venv/bin/python benchmarks/cost_model.py --quick          # 3 families, smaller models, N = 0, 10, 50

1. **Leave one family out** over every source family of ``--db`` (default
   ``datasets/cpu-2core-zen4``): each model is trained on all other families
   (their random subgraphs included) and scored on the held-out family; the
   metrics (``collage_ml.models.evaluate``) are printed per family and
   averaged over families (unweighted). ``--extra-train-db`` adds rows that
   join every fold's training set and are never scored (a dataset of
   synthetic networks, ``collect --models synthetic:N``). ``--rerun`` adds
   another sitting of ``--db``'s candidates (``datasets/reruns/``), merged
   into one sample per candidate as ``collage-ml train`` merges them, so
   every section trains and scores on the sittings' mean.
2. **Random split** (80/20 by subgraph): not held out by family, so it is an
   optimistic number, printed for comparison only.
3. **Few-shot transfer** to ``--target-db`` (default
   ``datasets/cpu-2core-zen4-t1``, the same machine at 1 thread): a model
   trained on all of ``--db`` is updated with N samples of the target and
   scored on the rest of it (the same rest for every N).

4. **Leave one hardware out** over ``--hardware-dbs`` (default: every
   dataset under ``datasets/`` but the backend-configuration one): each
   machine (a hardware fingerprint: a CPU kind at one thread count) is held
   out in turn; the model trains on every other machine and is scored on this
   one, which it knows only by its description and its probe results (the
   held-out machine's own probe rows are not scored). Machines without probes
   (datasets measured before the probe set existed) are scored too, on their
   static description only, and marked so.
   **Leave one CPU kind out**: the same with every thread count of one CPU
   kind held out at once, so the CPU itself is new to the model (a probed
   machine is scored on its rows that carry probes).
5. **Hardware and family out at once**: the same, also leaving out one
   family (``--hw-families``), scored on that family on that machine.

Sections 4 and 5 compare ``--variants``: ``xgb`` (XGBoost with its default
parameters, the probe columns included; its default target is
``roofline-mean``, log(latency / the mean of the machine's backends' roofline
estimates), since 2026-12-03), ``xgb-mean`` (that target explicitly),
``xgb-roof`` (``target=roofline``: the candidate's own backend's estimate, the
default of 2026-12-02), ``xgb-log`` (the log latency itself, ``target=log``,
the default before), ``xgb-static`` (probes removed from every sample: the
static description only, i.e. what the model knew before the probe set),
``gnn`` and ``blend`` (both, their log predictions averaged).

Each database's samples carry the probe table it was calibrated with;
``--pool-probes`` gives every machine (fingerprint, threads, protocol) one
table instead, the median of its databases' calibrations
(``models.dataset.pool_probes``), in every section; ``--pool-probes node``
one per instance of the machine (the node its rows recorded: a VM's boot).

``--plot`` draws predicted against measured latency from the
leave-one-family-out predictions, one log-log panel per backend, one colour
per model. ``--json`` writes every number. Models are made with
``collage_ml.models.base.create_model(kind, **params)``; ``--param
xgb:n_estimators=200`` overrides a parameter of one kind.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import dataclasses

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # shipped_datasets, when this file is loaded by path (the tests)

from collage_ml.featurize import roofline  # noqa: E402
from shipped_datasets import dataset_dbs  # noqa: E402
from collage_ml.models.base import create_model  # noqa: E402
from collage_ml.defaults import POOL_BY  # noqa: E402
from collage_ml.models.dataset import Dataset, pool_probes  # noqa: E402
from collage_ml.models.training import load_dataset  # noqa: E402
from collage_ml.models.evaluate import (  # noqa: E402
    HIGHER_IS_BETTER,
    METRIC_LABELS,
    METRICS,
    average_metrics,
    evaluate,
    evaluate_predictions,
    few_shot,
    format_metric,
    json_safe,
    leave_one_family_out,
)

DEFAULT_DB = ROOT / "datasets" / "cpu-2core-zen4" / "measurements.db"
#: the machine-out sections' datasets: every shipped one but the backend-configuration and synthetic-network sets
#: (those would change what a machine's held-out rows are; pass them with --hardware-dbs to include them)
DEFAULT_HW_DBS = dataset_dbs(synthetic=False)
VARIANTS = ("xgb", "xgb-log", "xgb-roof", "xgb-mean", "xgb-static", "gnn", "blend")
DEFAULT_VARIANTS = ("xgb", "xgb-roof", "xgb-log", "xgb-static", "gnn")  # xgb-mean is xgb under today's defaults
HW_FAMILIES = ("bert", "mobilenetv2", "nasnet", "resnet50")
#: display names of the CPU kinds seen so far (vendor-family-model-stepping from /proc/cpuinfo)
CPU_KINDS = {"AuthenticAMD-25-1": "Zen 3", "AuthenticAMD-25-17": "Zen 4", "AuthenticAMD-26-2": "Zen 5",
             "GenuineIntel-6-167": "Xeon AMX"}
DEFAULT_TARGET = ROOT / "datasets" / "cpu-2core-zen4-t1" / "measurements.db"
QUICK_FAMILIES = ("dcgan", "mobilenetv2", "nasrnn")
QUICK_PARAMS: dict[str, dict[str, Any]] = {
    "xgb": {"n_members": 2, "n_estimators": 150},
    "gnn": {"epochs": 12, "finetune_epochs": 8, "mc_samples": 4},
}

console = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


def log(msg: str) -> None:
    err.print(f"[dim]{time.strftime('%H:%M:%S')} {msg}[/]")


def write_json(path: Path, results: Any) -> None:
    """``results`` as JSON at ``path`` (its folder made), said on stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(results), indent=1, default=str))
    log(f"wrote {path}")


def parse_params(items: list[str], kinds: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {k: {} for k in kinds}
    for it in items:
        kind, sep, rest = it.partition(":")
        key, sep2, value = rest.partition("=")
        if not sep or not sep2 or not key:
            raise SystemExit(f"--param expects KIND:KEY=VALUE (e.g. xgb:n_estimators=200), got {it!r}")
        try:
            v: Any = json.loads(value)
        except json.JSONDecodeError:
            v = value
        out.setdefault(kind, {})[key] = v
    return out


def side_by_side(title: str, rows: dict[str, dict[str, dict[str, Any]]], models: list[str], extra: tuple[str, ...] = ()) -> None:
    """rows: row label -> model -> metrics. One column per metric; each cell lists the models' values, the best marked."""
    t = Table(title=title, caption=" / ".join(models) + " per cell" + ("; * = best" if len(models) > 1 else ""))
    t.add_column("")
    t.add_column("n", justify="right")
    for k in METRICS + extra:
        t.add_column(METRIC_LABELS.get(k, k), justify="right")
    for label, per_model in rows.items():
        n = next((str(m.get("n", "")) for m in per_model.values() if m), "")
        cells = []
        for k in METRICS + extra:
            vals = [per_model.get(m, {}).get(k) for m in models]
            finite = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
            best = None
            if len(finite) > 1 and k in METRICS:
                best = max(finite) if k in HIGHER_IS_BETTER else min(finite)
            parts = []
            for v in vals:
                s = format_metric(k, v) if k in METRICS else ("-" if v is None else f"{v:.1f}")
                parts.append(f"[bold]{s}*[/]" if best is not None and v == best else s)
            cells.append(" / ".join(parts))
        t.add_row(label, n, *cells)
    console.print(t)


def plot(path: Path, preds: dict[str, dict[str, dict[str, Any]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = sorted({b for per_fam in preds.values() for p in per_fam.values() for b in p["backend"]})
    if not backends:
        return
    cols = min(len(backends), 2)
    rows = math.ceil(len(backends) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.8 * rows), squeeze=False)
    colours = {m: c for m, c in zip(preds, ("tab:blue", "tab:orange", "tab:green", "tab:red"))}
    markers = {m: mk for m, mk in zip(preds, ("o", "^", "s", "D"))}
    for ax, b in zip(axes.flat, backends):
        lo, hi = math.inf, 0.0
        for model, per_fam in preds.items():
            t = np.concatenate([np.asarray(p["true"])[np.array(p["backend"]) == b] for p in per_fam.values()])
            y = np.concatenate([np.asarray(p["pred"])[np.array(p["backend"]) == b] for p in per_fam.values()])
            if not len(t):
                continue
            ape = np.median(np.abs(y / t - 1))
            ax.scatter(t * 1e3, y * 1e3, s=5, alpha=0.35, c=colours[model], marker=markers[model], linewidths=0,
                       label=f"{model} (n={len(t)}, median APE {100 * ape:.0f}%)")
            lo, hi = min(lo, t.min(), y.min()), max(hi, t.max(), y.max())
        if hi > 0:
            ax.plot([lo * 1e3, hi * 1e3], [lo * 1e3, hi * 1e3], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(b)
        ax.set_xlabel("measured latency (ms)")
        ax.set_ylabel("predicted latency (ms)")
        ax.legend(loc="upper left", fontsize=8, markerscale=3)
    for ax in list(axes.flat)[len(backends):]:
        ax.axis("off")
    fig.suptitle("leave-one-family-out predictions (each point predicted by a model that never saw its family)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    log(f"wrote {path}")


def blend(data: Dataset, preds: dict[str, dict[str, dict[str, Any]]], kinds: list[str]) -> dict[str, dict[str, Any]]:
    """Leave-one-family-out metrics of the models' blend: per held-out family, the mean of the models' log
    predictions on the same test rows (each model trained without that family)."""
    out = {}
    for fam in preds[kinds[0]]:
        if not all(fam in preds[k] for k in kinds):
            continue
        _, test = data.split_by_source([fam])
        logs = np.mean([np.log(np.asarray(preds[k][fam]["pred"], dtype=np.float64)) for k in kinds], axis=0)
        out[fam] = evaluate_predictions(test, np.exp(logs))
    return out


def hardware_labels(paths: list[Path]) -> dict[str, str]:
    """fingerprint -> "Zen 5 t1 (AuthenticAMD-26-2-1)" from each database's hardware table."""
    from collage_ml.db import Database

    out = {}
    for p in paths:
        with Database(p, readonly=True) as db:
            for fp in db.stats()["hardware"]:
                info = db.hardware_info(fp) or {}
                cpu = str(info.get("cpu_id", "?"))
                kind = CPU_KINDS.get(cpu.rsplit("-", 1)[0], cpu)
                out[fp] = f"{kind} t{info.get('threads', '?')}"
    return out


def variant_model(name: str, params: dict[str, dict[str, Any]]):
    if name == "blend":  # xgb and gnn with their --param settings, log predictions averaged
        return create_model("blend", member_params={k: dict(params.get(k, {})) for k in ("xgb", "gnn")})
    kind = "gnn" if name.startswith("gnn") else "xgb"
    p = dict(params.get(kind, {}))
    if name == "xgb-roof":
        p["target"] = "roofline"
    elif name == "xgb-mean":
        p["target"] = "roofline-mean"
    elif name == "xgb-log":
        p["target"] = "log"
    return create_model(kind, **p)


def strip_probes(data: Dataset) -> Dataset:
    return Dataset([dataclasses.replace(s, hw=s.hw.with_probes(None)) for s in data])


def select_folds(folds: list, only: str) -> list:
    """The folds whose label contains ``only`` whole (a label may hold a comma: "Xeon AMX, every thread
    count"), or else one of its comma-separated parts; none is an error that lists the labels."""
    whole = only.strip()
    kept = [f for f in folds if whole in f[1]]
    if not kept:
        parts = [o.strip() for o in only.split(",") if o.strip()]
        kept = [f for f in folds if any(o in f[1] for o in parts)]
    if not kept:
        raise SystemExit(f"--hw-folds {only!r}: no hardware-out fold matches; the folds are: "
                         + "; ".join(f[1] for f in folds))
    return kept


def hardware_out(data: Dataset, labels: dict[str, str], variants: list[str], params, families: tuple[str, ...],
                 only: str = ""):
    """Sections 4 and 5: {section: {fold label: {variant: metrics}}} for machine-out, CPU-kind-out and
    machine-and-family-out folds.

    A fold leaves out a set of fingerprints: one machine (``machine``), or every thread count of one CPU kind
    (``cpu``: the CPU itself is new to the model). A probed machine is scored on its rows that carry probes
    ("given only its probes"; a dataset collected before the probe set keeps its rows unprobed even where
    another dataset of the same machine has probes), an unprobed one on all its rows."""
    scored = data.filter(lambda s: s.source != "probe")
    machines = sorted({s.hardware for s in scored})
    probed = {s.hardware for s in data if s.hw.calibrated}
    folds = []
    for fp in machines:
        test = scored.filter(lambda s, fp=fp: s.hardware == fp)
        if len(test) < 100:
            continue
        folds.append(("machine", f"{labels.get(fp, fp)}{'' if fp in probed else ' (no probes)'}", {fp}, None))
    machine_folds = {next(iter(f[2])) for f in folds}
    kinds: dict[str, set[str]] = {}
    for fp in machines:
        kinds.setdefault(labels.get(fp, fp).rsplit(" t", 1)[0], set()).add(fp)
    for kind, fps in sorted(kinds.items()):
        # a kind whose one machine has a machine fold is that fold already: the same training and test sets
        if len(kinds) > 1 and fps & probed and not (len(fps) == 1 and fps <= machine_folds):
            folds.append(("cpu", f"{kind}, every thread count", fps, None))
    for fp in sorted(probed & set(machines)):
        for fam in families:
            folds.append(("machine+family", f"{labels.get(fp, fp)} + {fam}", {fp}, fam))
    if only.strip():  # --hw-folds: keep the folds whose label names one of these (e.g. "Zen 3")
        folds = select_folds(folds, only)
    out: dict[str, dict[str, dict[str, Any]]] = {"machine": {}, "cpu": {}, "machine+family": {}}
    stripped = strip_probes(data) if "xgb-static" in variants else None
    for section, label, fps, fam in folds:
        out[section][label] = {}
        scored_probed = bool(fps & probed)
        for v in variants:
            d = stripped if v == "xgb-static" else data

            def held(s, fps=fps, fam=fam):
                return s.hardware in fps or (fam is not None and s.source == fam)

            def tested(s, fps=fps, fam=fam, only_probed=scored_probed):
                return (s.hardware in fps and s.source != "probe" and (fam is None or s.source == fam)
                        and (not only_probed or s.hw.calibrated))

            train = d.filter(lambda s: not held(s))
            # xgb-static's samples lost their probes: score it on the rows the others are scored on
            test = d.filter(tested) if v != "xgb-static" else strip_probes(data.filter(tested))
            if not len(test) or not len(train):
                continue
            log(f"hardware out [{label}] {v}: training on {len(train)}, testing on {len(test)}")
            m = variant_model(v, params)
            t1 = time.perf_counter()
            m.fit(train)
            fit_s = time.perf_counter() - t1
            r = evaluate(m, test)
            r["fit_seconds"] = fit_s
            r["n_train"] = len(train)
            out[section][label][v] = r
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=DEFAULT_DB, help="main measurement database")
    ap.add_argument("--target-db", type=Path, default=DEFAULT_TARGET, help="few-shot target database")
    ap.add_argument("--rerun", type=Path, action="append", default=[], metavar="PATH",
                    help="another sitting of --db's candidates (datasets/reruns/): merged into --db's samples "
                         "as collage-ml train merges them (models.dataset.merge_sittings), so every section "
                         "trains and scores on the sittings' mean")
    ap.add_argument("--extra-train-db", type=Path, action="append", default=[], metavar="PATH",
                    help="rows that join every leave-one-family-out training set (less the held-out family), "
                         "never scored: e.g. a synthetic-network dataset; repeatable")
    ap.add_argument("--models", default="xgb,gnn", help="model kinds, comma-separated (default: xgb,gnn)")
    ap.add_argument("--families", default=None, help="hold out only these families, comma-separated (default: all)")
    ap.add_argument("--quick", action="store_true",
                    help=f"faster: families {','.join(QUICK_FAMILIES)}, smaller models, N = 0, 10, 50")
    ap.add_argument("--param", action="append", default=[], metavar="KIND:KEY=VALUE", help="model parameter")
    ap.add_argument("--shots", default=None, help="few-shot N, comma-separated (default 10,50,200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-random-split", action="store_true")
    ap.add_argument("--pool-probes", nargs="?", const="machine", default=None, choices=POOL_BY,
                    help="give each machine (or each instance of it: 'node') one probe table, the median of its "
                         "databases' calibrations (models.dataset.pool_probes; `collage-ml train --pool-probes`)")
    ap.add_argument("--roofline-fit", choices=("two-point", "joint"), default=None,
                    help="how the probes' rates are fitted (featurize.roofline.FIT; default: the featurizer's)")
    ap.add_argument("--no-few-shot", action="store_true")
    ap.add_argument("--no-lofo", action="store_true", help="skip leave-one-family-out (and the plot)")
    ap.add_argument("--blend", action="store_true",
                    help="with two or more --models, also score their blend in leave-one-family-out: the mean of "
                         "their log predictions (a geometric mean of the predicted latencies)")
    ap.add_argument("--hardware-dbs", default=None,
                    help="comma-separated databases for the hardware-out sections (default: every dataset but "
                         "the configurations and synthetic ones); 'none' skips those sections")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="models compared in the hardware-out sections")
    ap.add_argument("--hw-families", default=",".join(HW_FAMILIES),
                    help="families held out with each machine in section 5")
    ap.add_argument("--hw-folds", default="",
                    help="run only the hardware-out folds whose label contains this text (e.g. 'Zen 3' for every fold "
                         "of that CPU kind; a label may hold a comma), or else one of its comma-separated parts "
                         "(default: all)")
    ap.add_argument("--save-preds", type=Path, default=None, metavar="NPZ",
                    help="write the leave-one-family-out predictions (per model and family: backend, subgraph "
                         "hash, true, pred, and std, the model's log-space uncertainty)")
    ap.add_argument("--plot", type=Path, default=None, metavar="PNG")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = ap.parse_args()

    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    params = {k: dict(QUICK_PARAMS.get(k, {})) if args.quick else {} for k in kinds}
    for k, p in parse_params(args.param, kinds).items():
        params.setdefault(k, {}).update(p)
    for k in kinds:
        create_model(k, **params[k])  # fail early on a bad kind or parameter
    shots = [int(x) for x in args.shots.split(",")] if args.shots else ([10, 50] if args.quick else [10, 50, 200])

    if args.roofline_fit:
        roofline.FIT = args.roofline_fit
    t0 = time.perf_counter()
    log(f"loading {args.db}")
    if args.rerun:  # as `collage-ml train` reads a dataset and its reruns: one sample per candidate
        data = load_dataset([args.db, *args.rerun], progress=sys.stderr.isatty())
        log(f"{len(args.rerun)} rerun(s) merged: {data.merged['candidates']} candidates from "
            f"{data.merged['rows']} rows ({data.merged['by_shared']} scaled by the candidates their sittings share)")
    else:
        data = Dataset.from_db(args.db, progress=sys.stderr.isatty())
    fams = [f for f in data.sources() if f != "probe"]  # the probe set is the machine's description, not a family
    if args.families:
        fams = [f.strip() for f in args.families.split(",") if f.strip()]
    elif args.quick:
        fams = [f for f in QUICK_FAMILIES if f in fams] or fams[:3]
    log(f"{len(data)} samples, sources {', '.join(data.sources())}; holding out {', '.join(fams)}")
    extra = Dataset()
    for p in args.extra_train_db:
        part = Dataset.from_db(p).filter(lambda s: s.source != "probe")
        log(f"extra training rows from {p}: {len(part)} (sources {', '.join(part.sources())})")
        extra = extra + part
    if args.pool_probes:
        pooled = pool_probes([data, extra], args.pool_probes)
        log("pooled probe tables: " + (", ".join(f"{fp} ({n} calibrations)" for fp, n in pooled.items()) or "none"))
    results: dict[str, Any] = {
        "db": str(args.db),
        "target_db": str(args.target_db),
        "models": kinds,
        "params": params,
        "families": fams,
        "quick": args.quick,
        "seed": args.seed,
        "n": len(data),
        "reruns": [str(p) for p in args.rerun],
        "merged_sittings": getattr(data, "merged", None),
        "extra_train_dbs": [str(p) for p in args.extra_train_db],
        "n_extra_train": len(extra),
        "pool_probes": args.pool_probes or False,
        "roofline_fit": roofline.FIT,
    }

    # 1. leave one family out
    lofo: dict[str, dict[str, dict[str, Any]]] = {}
    preds: dict[str, dict[str, dict[str, Any]]] = {}
    for k in ([] if args.no_lofo else kinds):
        log(f"leave-one-family-out: {k} {params[k] or '(defaults)'}")
        preds[k] = {}
        lofo[k] = leave_one_family_out(lambda k=k: create_model(k, **params[k]), data, fams, progress=log,
                                       predictions=preds[k], extra_train=extra if len(extra) else None)
    shown = list(kinds)
    if lofo and args.blend and len(kinds) > 1:
        name = "+".join(kinds)
        lofo[name] = blend(data, preds, kinds)
        shown.append(name)
    if lofo:
        means = {k: average_metrics(lofo[k]) for k in shown}
        rows = {f: {k: lofo[k].get(f, {}) for k in shown} for f in fams}
        rows["mean over families"] = means
        side_by_side("leave one family out (each row: trained on every other family)", rows, shown, ("fit_seconds",))
        results["lofo"] = lofo
        results["lofo_mean"] = means

    # 2. random split
    if not args.no_random_split:
        train, test = data.random_split(0.2, seed=args.seed)
        rs: dict[str, dict[str, Any]] = {}
        for k in kinds:
            log(f"random split: {k} on {len(train)} samples, testing on {len(test)}")
            m = create_model(k, **params[k])
            t1 = time.perf_counter()
            m.fit(train)
            fit_s = time.perf_counter() - t1
            rs[k] = evaluate(m, test)
            rs[k]["fit_seconds"] = fit_s
        side_by_side("random split (not held out by family), 80/20 by subgraph", {"all": rs}, kinds, ("fit_seconds",))
        results["random_split"] = rs

    # 3. few-shot transfer
    if not args.no_few_shot:
        if not args.target_db.exists():
            log(f"no target database at {args.target_db}: few-shot transfer skipped")
        else:
            target = Dataset.from_db(args.target_db)
            log(f"few-shot target {args.target_db}: {len(target)} samples, hardware "
                f"{', '.join(sorted({s.hardware for s in target}))}")
            fs: dict[str, dict[int, dict[str, Any]]] = {}
            for k in kinds:
                log(f"few-shot: training {k} on all of {args.db.name} ({len(data)} samples)")
                base = create_model(k, **params[k]).fit(data)
                fs[k] = few_shot(base, target, ns=shots, seed=args.seed, progress=log)
            rows = {f"N = {n}": {k: fs[k].get(n, {}) for k in kinds} for n in [0, *shots]}
            side_by_side(f"few-shot transfer to {args.target_db.parent.name} (update on N target samples, "
                         f"score on the same {next(iter(fs.values()))[0]['n']} others)", rows, kinds,
                         ("update_seconds",))
            results["few_shot"] = fs

    # 4-5. hardware out
    if args.hardware_dbs != "none":
        paths = [Path(p) for p in args.hardware_dbs.split(",")] if args.hardware_dbs else DEFAULT_HW_DBS
        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANTS]
        if bad:
            raise SystemExit(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
        hw_data = Dataset()
        for p in paths:
            part = Dataset.from_db(p)
            log(f"{p}: {len(part)} samples ({part.protocols})")
            hw_data = hw_data + part
        if args.pool_probes:
            pool_probes([hw_data], args.pool_probes)
        labels = hardware_labels(paths)
        hw_fams = tuple(f.strip() for f in args.hw_families.split(",") if f.strip())
        ho = hardware_out(hw_data, labels, variants, params, hw_fams, args.hw_folds)
        side_by_side("leave one machine out (trained on every other machine; scored on this one, known by its "
                     "probes)", ho["machine"], variants, ("fit_seconds",))
        side_by_side("leave one CPU kind out (every thread count of it; scored on its probed rows)", ho["cpu"],
                     variants, ("fit_seconds",))
        side_by_side("machine and family out at once", ho["machine+family"], variants, ("fit_seconds",))
        results["hardware_out"] = ho
        results["hardware_dbs"] = [str(p) for p in paths]
        results["hardware_labels"] = labels

    results["seconds"] = time.perf_counter() - t0
    if args.plot and preds:
        plot(args.plot, preds)
    if args.save_preds and preds:
        args.save_preds.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.save_preds, **{f"{k}/{fam}/{col}": np.asarray(v[col])
                                                for k, per in preds.items() for fam, v in per.items()
                                                for col in ("backend", "hash", "true", "pred", "std")})
        log(f"wrote {args.save_preds}")
    if args.json:
        write_json(args.json, results)
    log(f"done in {results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    from collage_ml.errors import CollageError

    try:
        sys.exit(main())
    except CollageError as e:  # a missing or corrupt database, an artifact of another schema: one line
        raise SystemExit(f"cost_model: {e}")
