"""Models from the wild: place every corpus model (tests/wild_corpus.py), one row per model.

    .venv/bin/python benchmarks/wild_models.py [--mode guided|exhaustive] [--backends a,b]
        [--max-region-size 3] [--large [--fires 30]] [--only a,b] [--out FILE.json] [--table-only FILE.json]

Each model is placed from a fresh database with the shipped cost model (guided
mode, the default), on the default CPU backends unless ``--backends`` says
otherwise. A row says: nodes (after import), candidates (distinct), measured
(new measurements), invalid candidates by backend with the commonest reason,
what import converted, the chosen plan, the speed-up of the placed plan over
the best single backend (end to end), and the wall time of the ``place`` call.

``--large`` adds ``squeezenet-ir3-large``: the corpus's IR-3 / opset-9
SqueezeNet-style classifier with ``--fires`` Fire modules (30: 313 nodes in the
file, 222 after import, 128x128 input), the size of the model in issue 18.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import collage_ml  # noqa: E402
import collage_ml.errors  # noqa: E402
from tests.wild_corpus import CORPUS, squeezenet_ir3  # noqa: E402


def models(large: bool, fires: int, only: list[str] | None) -> dict:
    out = {name: builder for name, (builder, _) in CORPUS.items()}
    if large:
        out["squeezenet-ir3-large"] = lambda: squeezenet_ir3(fires=fires, size=128, width=16)
    if only:
        out = {k: v for k, v in out.items() if k in only}
    return out


def place_one(name: str, model, args, console: Console) -> dict:
    with tempfile.TemporaryDirectory(prefix="wild-") as d:
        t = time.perf_counter()
        try:
            pm = collage_ml.place(model, backends=args.backends, mode=args.mode, db=Path(d) / "m.db",
                                  max_region_size=args.max_region_size, progress=False,
                                  log=(lambda s: console.print(f"[dim]{name}: {s}[/]")) if args.verbose else None)
        except collage_ml.errors.CollageError as e:
            return {"model": name, "error": str(e), "wall_s": time.perf_counter() - t}
        wall = time.perf_counter() - t
    r = pm.report
    return {
        "model": name,
        "mode": args.mode,
        "nodes": len(pm.graph),
        "candidates": r["distinct_candidates"],
        "measured": r["measurements"],
        "invalid_by_backend": r["invalid_by_backend"],
        "systematic_failures": r["systematic_failures"],
        "import": r["import"],
        "chosen": r["chosen"],
        "partitions": [(p["backend"], p["nodes"]) for p in r["partitions"]],
        "plan_ms": r["plan_latency_ms"],
        "baselines_e2e_ms": r["baselines_e2e_ms"],
        "speedup": r["speedup_vs_best_single"],
        "fallback": r["fallback"],
        "outputs_match": r["outputs_match"],
        "wall_s": wall,
        "search_s": r["search_seconds"],
    }


def _plan(row: dict) -> str:
    parts = row["partitions"]
    if len(parts) == 1:
        return f"all {parts[0][0]}"
    counts: dict[str, int] = {}
    for b, n in parts:
        counts[b] = counts.get(b, 0) + n
    return f"{len(parts)} parts: " + ", ".join(f"{b} {n}" for b, n in counts.items())


def _invalid(row: dict) -> str:
    out = []
    for b, v in row["invalid_by_backend"].items():
        if v["invalid"]:
            reason = (v["main_reason"] or "").split(" at ")[0][:70]
            out.append(f"{b} {v['invalid']}/{v['measured']} ({reason})")
    return "; ".join(out) or "none"


def table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("model", "nodes", "candidates", "measured", "invalid (main reason)", "plan", "speed-up", "wall s"):
        t.add_column(col)
    for r in rows:
        if "error" in r:
            t.add_row(r["model"], "-", "-", "-", r["error"][:90], "no plan", "-", f"{r['wall_s']:.0f}")
            continue
        sp = f"{r['speedup']:.3f}x" if r["speedup"] else "-"
        t.add_row(r["model"], str(r["nodes"]), str(r["candidates"]), str(r["measured"]), _invalid(r), _plan(r), sp,
                  f"{r['wall_s']:.0f}")
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="guided", choices=["guided", "exhaustive"])
    ap.add_argument("--backends", default=None)
    ap.add_argument("--max-region-size", type=int, default=3)
    ap.add_argument("--large", action="store_true", help="add the 222-node IR-3 classifier")
    ap.add_argument("--fires", type=int, default=30)
    ap.add_argument("--only", default=None, help="comma-separated model names")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--table-only", default=None, metavar="FILE.json", help="reprint a saved run")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    console = Console(width=200)
    if args.table_only:
        data = json.loads(Path(args.table_only).read_text())
        console.print(table(data["rows"], data["title"]))
        return 0
    rows = []
    title = f"wild models, {args.mode}, backends {args.backends or 'default'}, max region {args.max_region_size}"
    for name, build in models(args.large, args.fires, args.only.split(",") if args.only else None).items():
        row = place_one(name, build(), args, console)
        rows.append(row)
        console.print(f"[dim]{json.dumps(row, default=str)[:400]}[/]")
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"title": title, "rows": rows}, indent=1, default=str))
    console.print(table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
