"""K SIGKILLs at random points of a real ``collage-ml collect``: does any committed row get lost?

    .venv/bin/python benchmarks/collect_kill.py        # 8 kills; nasnet-tiny + resnet50-tiny on onnxruntime,torch
    .venv/bin/python benchmarks/collect_kill.py --kills 5 --seed 1 --db /tmp/kill.db

Runs ``python -m collage_ml.cli collect`` (default timing, so each candidate takes a realistic
0.1-2 s) on a -tiny zoo model into one database, in its own session, and SIGKILLs the whole
process group (the collect process and its measurement worker) at a random moment, K times,
starting the collection again each time. The moment is uniform in ``[--min-s, --max-s]`` seconds
after that run's first new commit (so the kill lands while it measures, not while it imports and
plans, which take the first ~5 s of every start); ``--from-start`` counts from the start instead.
After every kill it checks that the database opens cleanly (``Database`` with its quick_check, and
``PRAGMA integrity_check``), that the row count never decreased, and that every row seen before
is still there with the same timestamp. Then it runs the collection to completion and checks that
the database holds exactly the planned keys. It prints one line per kill and the figure.
Exit status 1 when a row was lost or the database did not open.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rows(path: Path) -> dict[tuple[str, str, str, str], float]:
    """Every committed measurement: (hash, backend, version, hardware) -> timestamp; {} before the file exists."""
    if not path.exists():
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return {
            (h, b, v, hw): ts
            for h, b, v, hw, ts in conn.execute(
                "SELECT subgraph_hash, backend, backend_version, hardware, timestamp FROM measurements"
            )
        }
    except sqlite3.OperationalError as e:  # killed before the schema was committed
        if "no such table" in str(e):
            return {}
        raise
    finally:
        conn.close()


def opens_cleanly(path: Path) -> str:
    """'ok', or why not: the project's own open (quick_check) and a full integrity_check."""
    if not path.exists():
        return "ok"
    from collage_ml.db import Database

    try:
        with Database(path, create=False, readonly=True) as db:
            len(db)
    except Exception as e:  # noqa: BLE001
        return f"Database() failed: {e}"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="nasnet-tiny,resnet50-tiny",
                    help="zoo models, comma-separated (default: nasnet-tiny,resnet50-tiny)")
    ap.add_argument("--backends", default="onnxruntime,torch")
    ap.add_argument("--max-region-size", type=int, default=3)
    ap.add_argument("--kills", type=int, default=8, help="SIGKILLs before the run to completion (default 8)")
    ap.add_argument("--min-s", type=float, default=0.0, help="earliest kill, s after the first commit (default 0)")
    ap.add_argument("--max-s", type=float, default=4.0, help="latest kill, seconds after the first commit (default 4)")
    ap.add_argument("--from-start", action="store_true", help="count the kill's moment from the start of the process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", type=Path, default=None, help="database (default: a new temporary file)")
    args = ap.parse_args(argv)

    tmp = None
    if args.db is None:
        tmp = tempfile.TemporaryDirectory(prefix="collage-ml-collect-kill-")
        args.db = Path(tmp.name) / "kill.db"
    rng = random.Random(args.seed)
    cmd = [
        sys.executable, "-m", "collage_ml.cli", "collect", "--models", args.model, "--backends", args.backends,
        "--max-region-size", str(args.max_region_size), "--threads", "1", "--db", str(args.db), "--no-progress",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}

    from collage_ml.collector import plan

    total = plan(models=args.model, backends=args.backends, max_region_size=args.max_region_size, threads=1).planned
    print(f"collect {args.model} on {args.backends} (max region {args.max_region_size}): {total} candidates; "
          f"db {args.db}; kills at U[{args.min_s:g}, {args.max_s:g}] s after each "
          f"{'start' if args.from_start else 'first commit of a run'}, seed {args.seed}")
    seen = rows(args.db)
    lost = 0
    bad_open = 0
    landed = 0  # kills after which the run had committed rows and was not finished
    t0 = time.monotonic()
    for k in range(1, args.kills + 1):
        delay = rng.uniform(args.min_s, args.max_s)
        start_rows = len(seen)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        t_start = time.monotonic()
        if not args.from_start:  # wait for this run's first commit (or its end, or 120 s)
            while proc.poll() is None and len(rows(args.db)) <= start_rows and time.monotonic() < t_start + 120:
                time.sleep(0.05)
        t_first = time.monotonic()
        try:
            proc.wait(delay)
            finished = True  # it ended before the kill
        except subprocess.TimeoutExpired:
            finished = False
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the collect process and its worker
            proc.wait(30)
        state = opens_cleanly(args.db)
        now = rows(args.db)
        missing = [key for key, ts in seen.items() if now.get(key) != ts]
        lost += len(missing)
        bad_open += state != "ok"
        if not finished and start_rows < len(now) < total:
            landed += 1
        when = f"{t_first - t_start + delay:5.2f} s after start"
        if not args.from_start:
            when += f", {delay:4.2f} s after 1st commit"
        print(f"kill {k}: {when}{' (run had ended)' if finished else ''}: rows {start_rows} -> "
              f"{len(now)} of {total}, lost {len(missing)}, db {state}")
        seen = now
        if len(now) >= total:
            print("  (the collection completed before this kill; later kills test restarts only)")
    final = subprocess.run(cmd, env=env, capture_output=True, text=True)
    state = opens_cleanly(args.db)
    now = rows(args.db)
    missing = [key for key, ts in seen.items() if now.get(key) != ts]
    lost += len(missing)
    bad_open += state != "ok"
    complete = final.returncode == 0 and len(now) == total
    print(f"rerun to completion: exit {final.returncode}, {final.stdout.strip()}")
    print(f"  rows {len(now)} of {total}, lost {len(missing)}, db {state}; {time.monotonic() - t0:.0f} s in all")
    print(f"FIGURE: {args.kills} SIGKILLs at random points of collect (real processes, {landed} mid-measurement), "
          f"{lost} committed rows lost, {bad_open} unclean opens; rerun {'complete' if complete else 'INCOMPLETE'} "
          f"({len(now)}/{total})")
    if tmp is not None:
        tmp.cleanup()
    return 0 if lost == 0 and bad_open == 0 and complete else 1


if __name__ == "__main__":
    sys.exit(main())
