"""The ``collage-ml`` command line: a thin layer over :mod:`collage_ml.api`.

Exit status: 0 on success, 2 on a usage error, 1 on a model, backend,
database or file error (one line on stderr; ``--debug`` shows the traceback),
141 when the reader of standard output went away. With ``--json``, standard
output holds only the JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import os
import sys
from typing import Iterator, Sequence

from collage_ml.argtypes import arg, nonneg_float, positive_int, shape
from collage_ml.defaults import MAX_REGION_SIZE, RECALIBRATE_HOURS
from collage_ml.errors import CollageError, first_line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="collage-ml",
        description="Place each subgraph of a DL model on the backend that runs it fastest.",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    z = sub.add_parser("zoo", help="list the model zoo, or export a zoo model to ONNX")
    z.add_argument("--json", action="store_true", help="print JSON")
    zsub = z.add_subparsers(dest="zoo_command", metavar="export")
    ze = zsub.add_parser("export", help="write a zoo model as an ONNX file")
    ze.add_argument("name")
    ze.add_argument("-o", "--output", required=True, help="output .onnx path")
    ze.add_argument("--batch", type=arg(positive_int), default=1)

    i = sub.add_parser("inspect", help="summarise a model: nodes, FLOPs, parameters, op histogram")
    i.add_argument("model", help="a zoo name or an .onnx path")
    i.add_argument("--batch", type=arg(positive_int), default=1, help="batch size (zoo models)")
    i.add_argument("--input-shape", type=arg(shape), action="append", default=[], metavar="NAME=D1,D2,...",
                   help="pin a dynamic input's shape (repeatable)")
    i.add_argument("--json", action="store_true", help="print JSON")
    pl = sub.add_parser("place", help="place a model's subgraphs on the fastest backends")
    pl.add_argument("model", help="a zoo name or an .onnx path")
    pl.add_argument("--backends", default=None, help="comma-separated backend names (default: the CPU default set)")
    pl.add_argument("--mode", default="exhaustive", choices=["exhaustive", "guided"],
                    help="exhaustive: measure every candidate (Collage); guided: the cost model picks what to measure")
    pl.add_argument("--cost-model", default="default", metavar="ARTIFACT",
                    help="guided mode's cost model: an artifact from `collage-ml train`, or 'default' (the model "
                         "updated next to --db if any, else the shipped one for this machine), or 'default:KIND' "
                         "(the same of one kind: xgb, gnn or blend)")
    pl.add_argument("--measure-budget", type=arg(positive_int), default=None, metavar="N",
                    help="guided mode: measure at most N new candidates")
    pl.add_argument("--stale-after", type=arg(nonneg_float), default=None, metavar="HOURS",
                    help="cache hits older than this are of another hour of the machine: time a few per backend "
                         "again and rescale that backend's old hits by the drift (default: use them as stored)")
    pl.add_argument("--no-in-context", action="store_true",
                    help="price a plan as the sum of its parts timed alone, without what each partition pays "
                         "inside a plan (cold calls, evicted weights)")
    pl.add_argument("--db", default=None, metavar="PATH", help="measurement database (default: per-user)")
    pl.add_argument("--out", default=None, metavar="DIR", help="save the placed model here")
    pl.add_argument("--report", default=None, metavar="FILE.json",
                    help="write the JSON report here, and a picture of the placed graph beside it (FILE.svg)")
    pl.add_argument("--max-region-size", type=arg(positive_int), default=MAX_REGION_SIZE,
                    help=f"largest region candidate, in nodes (whole-model regions are always tried; default: "
                         f"{MAX_REGION_SIZE})")
    pl.add_argument("--threads", type=arg(positive_int), default=None, help="intra-op threads for every backend")
    pl.add_argument("--batch", type=arg(positive_int), default=1, help="batch size (zoo models)")
    pl.add_argument("--input-shape", type=arg(shape), action="append", default=[], metavar="NAME=D1,D2,...")
    pl.add_argument("--no-graph-level", action="store_true",
                    help="skip the graph-level evolutionary search (op-level DP and single backends only)")
    pl.add_argument("--generations", type=arg(positive_int), default=6, help="graph-level search generations")
    pl.add_argument("--no-progress", action="store_true", help="no progress bar")
    sh = sub.add_parser("show", help="draw a saved placed model's plan (SVG) and print its partition table")
    sh.add_argument("placed_dir", metavar="PLACED_DIR", help="a directory written by `place --out`")
    sh.add_argument("--svg", default=None, metavar="OUT", help="write the picture here (default: PLACED_DIR/plan.svg)")
    sh.add_argument("--db", default=None, metavar="PATH",
                    help="read partition latencies and hand-off costs from this database (default: per-user)")

    ca = sub.add_parser("calibrate", help="measure the probe set on this machine (again once the newest calibration is an hour old)")
    ca.add_argument("--backends", default=None, help="comma-separated backend names (default: the CPU set)")
    ca.add_argument("--db", default=None, help="measurement database (default: the per-user one)")
    ca.add_argument("--threads", type=arg(positive_int), default=None, help="intra-op threads for every backend")
    ca.add_argument("--max-age", type=arg(nonneg_float), default=RECALIBRATE_HOURS, metavar="HOURS",
                    help="measure again when the newest calibration is this old, as a sitting of its own "
                         f"(default: {RECALIBRATE_HOURS:g})")
    ca.add_argument("--check", action="store_true",
                    help="measure the probes again, store nothing, and say how far the machine moved since the "
                         "database's newest calibration")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.add_argument("--no-progress", action="store_true", help="no progress bar")

    b = sub.add_parser("backends", help="list the backends with availability, version and device")
    b.add_argument("--json", action="store_true", help="print JSON")

    d = sub.add_parser("db", help="inspect, export or merge measurement databases")
    dsub = d.add_subparsers(dest="db_command", metavar="stats|export|merge")
    dsub.required = True
    ds = dsub.add_parser("stats", help="counts of valid/invalid measurements by backend, family and hardware")
    ds.add_argument("path")
    ds.add_argument("--json", action="store_true", help="print JSON")
    de = dsub.add_parser("export", help="export the measurements")
    de.add_argument("path")
    de.add_argument("--parquet", required=True, metavar="OUT", help="write a Parquet file")
    dm = dsub.add_parser("merge", help="merge database B into A (idempotent; A is created if missing)")
    dm.add_argument("into", metavar="A")
    dm.add_argument("other", metavar="B")
    from collage_ml.cli_collect import add_parser as add_collect_parser

    add_collect_parser(sub)
    from collage_ml.models.cli import add_parser as add_model_parsers

    add_model_parsers(sub)
    return p


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    from collage_ml.ui import print_table

    print_table(title, columns, rows)


def _cmd_backends(args) -> int:
    from collage_ml import api

    info = api.backends_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    _table(
        "collage-ml backends", ["name", "device", "available", "version", "patterns", "note"],
        [(b["name"], b["device"], "yes" if b["available"] else "no", b["version"], ",".join(b["kinds"]),
          b["reason"] or "") for b in info],
    )
    from collage_ml.backends import configs

    print("configurations (use as backend names, e.g. --backends 'onnxruntime,onnxruntime[spin=on]'):")
    for grid in configs.grids().values():
        print(f"  {grid}")
    return 0


def _cmd_calibrate(args) -> int:
    from collage_ml import api

    if args.check:
        return _calibrate_check(args)

    res = api.calibrate(args.backends, db=args.db, threads=args.threads, progress=not (args.json or args.no_progress),
                        say=None if args.json else print, max_age_hours=args.max_age)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    names = sorted(res)
    probes = list(next(iter(res.values()), {}))
    _table("probe latencies (us)", ["probe", *names],
           [(p, *("-" if res[b].get(p) is None else f"{res[b][p] * 1e6:.1f}" for b in names)) for p in probes])
    return 0


def _calibrate_check(args) -> int:
    import time

    from collage_ml import api

    res = api.calibration_drift(args.backends, db=args.db, threads=args.threads,
                                progress=not (args.json or args.no_progress))
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    rows = []
    for name, r in sorted(res["backends"].items()):
        age = "-" if r["calibrated_at"] is None else f"{(time.time() - r['calibrated_at']) / 3600:.1f}"
        rows.append((name, age, r["probes"], "-" if r["ratio"] is None else f"{r['ratio']:.3f}"))
    _table("probe latencies now / at calibration (median over probes)", ["backend", "hours ago", "probes", "now / then"],
           rows)
    if res["ratio"] is not None:
        pct = (1 - res["ratio"]) * 100
        print(f"the machine runs {abs(pct):.1f}% {'faster' if pct >= 0 else 'slower'} than when the database was "
              f"calibrated last (median over every probe: {res['ratio']:.3f}); `collect` calibrates again once "
              f"that calibration is an hour old, `collage-ml calibrate --max-age 0` does it now")
    return 0


def _cmd_db(args) -> int:
    from collage_ml import api

    if args.db_command == "stats":
        st = api.db_stats(args.path)
        if args.json:
            print(json.dumps(st, indent=2))
            return 0
        print(f"{args.path}: {st['valid']} valid ({st['contended']} of them contended, which training leaves out), "
              f"{st['invalid']} invalid, {st['failed']} failed measurements; "
              f"{st['retimed']} had a timing window taken again")
        print(f"{st.get('boundaries', 0)} boundary costs ({st.get('boundaries_valid', 0)} valid), "
              f"{st.get('plan_timings', 0)} plans timed end to end ({st.get('plan_timings_valid', 0)} valid)")
        for what in ("backends", "families", "hardware"):
            _table(what, [what[:-1] if what != "families" else "family", "count"], sorted(st[what].items()))
        for fp, c in sorted(st.get("calibrations", {}).items()):
            when = datetime.datetime.fromtimestamp(c["newest"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            checks = (f"; {c['checked']} backend calibrations checked by a second pass, {c['third_pass']} of them "
                      "measured a third time" if c.get("checked") else "")
            print(f"{fp}: calibrated {c['sittings']} time{'s' * (c['sittings'] != 1)}, the newest {when}{checks}")
        return 0
    if args.db_command == "export":
        n = api.db_export_parquet(args.path, args.parquet)
        print(f"wrote {n} measurements to {args.parquet}")
        return 0
    n = api.db_merge(args.into, args.other, counts=True)
    print(f"merged {args.other} into {args.into}: {n['measurements']} new measurements, "
          f"{n['boundaries']} boundary costs, {n['plan_runs']} plan runs, {n['calibrations']} calibrations")
    return 0


def _cmd_place(args) -> int:
    from rich.console import Console
    from rich.markup import escape

    from collage_ml import api
    from collage_ml.search.evolutionary import EvoConfig

    console = Console(stderr=True)
    pm = api.place(
        args.model, backends=args.backends, mode=args.mode, db=args.db, batch=args.batch,
        input_shapes=dict(args.input_shape) or None, max_region_size=args.max_region_size, threads=args.threads,
        progress=not args.no_progress, log=lambda s: console.print(f"[dim]{escape(s)}[/]"),
        graph_level=not args.no_graph_level, evo_config=EvoConfig(generations=args.generations),
        stale_after_hours=args.stale_after, in_context=not args.no_in_context,
        **({"cost_model": args.cost_model, "measure_budget": args.measure_budget} if args.mode == "guided" else {}),
    )
    rep = pm.report
    rows = []
    predicted = rep.get("baselines_predicted_ms") or {}
    for name, native in rep["baselines_ms"].items():
        e2e = rep["baselines_e2e_ms"].get(name)
        shown = _ms(native) if native is not None or name not in predicted else f"~{predicted[name]:.3f} (predicted)"
        rows.append((f"all on {name}", shown, _ms(e2e), _ratio(e2e, rep["plan_latency_ms"])))
    rows.append((f"placed ({rep['chosen']}, {len(rep['partitions'])} partitions)", "", _ms(rep["plan_latency_ms"]), "1.00x"))
    _table(f"{rep['model']} on {rep['hardware']} ({rep['threads']} threads)",
           ["plan", "native ms", "end-to-end ms", "speed-up of placed"], rows)
    print(f"op-level plan {_ms(rep['op_level_ms'])} ms, graph-level {_ms(rep['graph_level_ms'])} ms "
          f"({rep['generations']} generations, {rep['e2e_measurements']} end-to-end measurements)")
    print(f"measurements: {rep['measurements']} new, {rep['cache_hits']} cache hits, {rep['candidates']} candidates; "
          f"search {rep['search_seconds']:.1f} s; max abs error {rep['max_abs_error']:.3g}")
    if rep.get("cache_drift"):
        drift = ", ".join(f"{b} x{d['ratio']:.3f} ({d['age_hours']:.1f} h old)" for b, d in rep["cache_drift"].items())
        print(f"stale cache hits rescaled by {rep['anchor_measurements']} anchors timed again: {drift}")
    if rep["mode"] == "guided":
        g = rep["guided"]
        print(f"guided ({rep['cost_model']}): {rep['predicted_candidates']} predicted, {rep['pruned']} pruned "
              f"(never measured), {g['rounds']} re-plans, {rep['model_updates']} model update(s)"
              + (" - the model disagreed with the measurements, so every candidate was measured"
                 if g["fell_back_to_exhaustive"] else ""))
    if args.report:
        from pathlib import Path

        try:
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.report).write_text(json.dumps(dict(rep), indent=1))
        except OSError as e:
            raise CollageError(f"cannot write the report to {args.report}: {e.strerror or e}") from None
        _show(api.show(pm, db=args.db), Path(args.report).with_suffix(".svg"), required=False)
    if args.out:
        pm.save(args.out)
        print(f"saved the placed model to {args.out}")
    if not rep["outputs_match"]:
        print(f"collage-ml: error: the placed model's outputs do not match the reference: {rep['mismatch']}",
              file=sys.stderr)
        return 1
    return 0


def _show(view, svg, required: bool) -> None:
    """Prints the partition table and writes the picture; without Graphviz, a warning unless ``required``."""
    from rich.console import Console

    from collage_ml.viz import GraphvizMissing

    Console().print(view.table())
    try:
        view.write_svg(svg)
    except GraphvizMissing as e:
        if required:
            raise
        print(f"collage-ml: warning: no picture of the plan: {e}", file=sys.stderr)
        return
    print(f"wrote {svg}")


def _cmd_show(args) -> int:
    from pathlib import Path

    from collage_ml import api

    _show(api.show(args.placed_dir, db=args.db), args.svg or Path(args.placed_dir) / "plan.svg", required=True)
    return 0


def _ms(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ratio(base, plan) -> str:
    return "-" if not base or not plan else f"{base / plan:.2f}x"


def _cmd_zoo(args) -> int:
    from collage_ml import api
    from collage_ml.ir import zoo

    if args.zoo_command == "export":
        g = api.export_zoo(args.name, args.output, batch=args.batch)
        print(f"wrote {args.output}: {len(g)} nodes, inputs {[list(g.tensors[n].shape) for n in g.input_names]}")
        return 0
    rows = [
        {"name": e.name, "family": e.family, "tiny": e.tiny, "description": e.description} for e in zoo.entries()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title="collage-ml model zoo")
    for col in ("name", "family", "description"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["family"], r["description"])
    Console().print(t)
    return 0


def _cmd_inspect(args) -> int:
    from collage_ml import api

    info = api.inspect_model(args.model, batch=args.batch, input_shapes=dict(args.input_shape) or None)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"[bold]{info['name']}[/]: {info['nodes']} nodes, {info['flops'] / 1e9:.3f} GFLOPs, "
            f"{info['param_bytes'] / 2**20:.1f} MiB of parameters")
    c.print(f"inputs: {info['inputs']}\noutputs: {info['outputs']}")
    t = Table("op", "count")
    for op, n in info["op_histogram"].items():
        t.add_row(op, str(n))
    c.print(t)
    return 0


def _cmd_collect(args) -> int:
    from collage_ml.cli_collect import run

    return run(args)


def _cmd_models(args) -> int:
    from collage_ml.models.cli import run

    return run(args)


COMMANDS = {"collect": _cmd_collect, "train": _cmd_models, "eval": _cmd_models, "place": _cmd_place, "show": _cmd_show, "zoo": _cmd_zoo, "inspect": _cmd_inspect, "backends": _cmd_backends, "calibrate": _cmd_calibrate, "db": _cmd_db}


def _c_flush() -> None:
    """Flushes C stdio buffers (a library's printf to a pipe sits there until exit otherwise)."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # pragma: no cover - no libc
        pass


@contextlib.contextmanager
def _json_stdout() -> Iterator[None]:
    """For ``--json``: file descriptor 1 goes to stderr while the command runs, so whatever a library
    writes there (MNN's CPU-feature line, a converter's log) cannot corrupt the JSON; Python's
    ``sys.stdout``, which the JSON is printed to, still writes to the real standard output."""
    out = sys.stdout
    try:
        out.flush()
        real_fd = out.fileno() == 1
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        real_fd = False  # not a file (e.g. pytest's capture): only fd 1 itself is redirected
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all
        yield
        return
    json_out = None
    if real_fd:
        json_out = io.TextIOWrapper(io.FileIO(saved, "w", closefd=False), encoding=out.encoding or "utf-8",
                                    errors=getattr(out, "errors", None) or "strict", line_buffering=True)
        sys.stdout = json_out
    os.dup2(2, 1)
    try:
        yield
    finally:
        _c_flush()
        try:
            if json_out is not None:
                sys.stdout = out
                json_out.close()  # flushes (a closed pipe raises BrokenPipeError here, after closing)
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _naming_the_model(args, e: CollageError) -> str:
    """The error's line, led by the model file when it is about one that the line does not name yet
    (the importer's checks, e.g. a cycle or an unknown op, name only the problem)."""
    from collage_ml.errors import ModelError

    text = str(e)
    given = [getattr(args, "model", None)] + str(getattr(args, "models", "") or "").split(",")
    files = [m for m in given if m and os.path.isfile(m)]
    if isinstance(e, ModelError) and len(files) == 1 and files[0] not in text:
        return f"{files[0]}: {text}"
    return text


def _error(args, e: BaseException, text: str, status: int = 1) -> int:
    if args.debug:
        raise e
    print(f"collage-ml: error: {text}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 on usage errors
    try:
        with _json_stdout() if getattr(args, "json", False) else contextlib.nullcontext():
            return COMMANDS[args.command](args)
    except CollageError as e:
        return _error(args, e, _naming_the_model(args, e))
    except ValueError as e:  # bad argument values detected past argparse (e.g. a zoo batch size)
        return _error(args, e, str(e), 2)
    except BrokenPipeError:  # the reader went away (`... --json | head`): stop quietly, as CLIs do
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe
    except OSError as e:  # a path that cannot be written or read (--out, --report, -o, a database folder)
        where = f"{e.filename}: " if e.filename else ""
        return _error(args, e, f"{where}{e.strerror or first_line(e)}")
    except RuntimeError as e:  # e.g. a measurement worker that did not start
        return _error(args, e, f"{first_line(e)} (--debug shows the traceback)")
    except KeyboardInterrupt:
        print("collage-ml: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
