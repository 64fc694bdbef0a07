"""One Ray worker SIGKILLed mid-shard during ``collect --ray``: does any committed row get lost?

    .venv/bin/python benchmarks/ray_kill.py                  # 3 trials, Ray's retry resumes the shard
    .venv/bin/python benchmarks/ray_kill.py --retries 0      # the shard fails; a rerun resumes it

Starts a local Ray instance on loopback (2 CPUs; ``RAY_LOCAL_ENV``: no usage reports, every
address 127.0.0.1; workers import this checkout), then per trial runs ``collect --ray`` with 2
shards on a -tiny zoo model into a fresh database, in a thread. Once the shards have committed a
random number of rows (uniform in 1..total/3), it SIGKILLs the Ray worker process running one
shard task, then checks that every row committed in the shard databases before the kill ends up
in the merged database with the same timestamp, and that the work completes: by Ray's retry
(default), or with ``--retries 0`` by running the same command again after the shard failed.
Prints one line per trial and the figure; exit status 1 when a row was lost or the work did not
complete.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collage_ml.collector import RAY_LOCAL_ENV, collect, plan, ray_run_key, ray_shard_dir  # noqa: E402

for _k, _v in RAY_LOCAL_ENV.items():  # before Ray is imported
    os.environ.setdefault(_k, _v)


def rows(path: Path) -> dict[tuple[str, str, str, str], float]:
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
    except sqlite3.OperationalError:  # the schema is not committed yet
        return {}
    finally:
        conn.close()


def shard_rows(run_dir: Path) -> dict:
    out: dict = {}
    for f in sorted(run_dir.glob("shard-*.db")):
        try:
            out.update(rows(f))
        except sqlite3.Error:
            pass
    return out


def shard_task_pids() -> list[int]:
    """Ray workers of this process's Ray instance that are running a shard task."""
    me, pids = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if not (d / "cmdline").read_bytes().startswith(b"ray::_ray_shard_task"):
                continue
            pid = int(d.name)
            while pid > 1:
                pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if pid == me:
                    pids.append(int(d.name))
                    break
        except (OSError, ValueError, IndexError):
            pass
    return pids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenetv2-tiny")
    ap.add_argument("--backends", default="onnxruntime,torch")
    ap.add_argument("--max-region-size", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--retries", type=int, default=None, help="Ray task retries (default: collage-ml's, 3)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import ray

    from dataclasses import replace

    from collage_ml.measure.timing import TimingConfig

    # commit each candidate as it is measured (chunks of one), so the kill lands between commits
    kw = dict(models=args.model, backends=args.backends, max_region_size=args.max_region_size, threads=1,
              timing=replace(TimingConfig(), pass_chunk=1))
    total = plan(**kw).keys()
    rng = random.Random(args.seed)
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    print(f"collect --ray (2 shards, local Ray at {ray.nodes()[0]['NodeManagerAddress']}) {args.model} on "
          f"{args.backends} (max region {args.max_region_size}): {len(total)} candidates; retries "
          f"{'default' if args.retries is None else args.retries}")
    lost_all = 0
    ok_trials = 0
    try:
        for trial in range(1, args.trials + 1):
            with tempfile.TemporaryDirectory(prefix="collage-ml-ray-kill-") as tmp:
                path = Path(tmp) / "ray.db"
                run_dir = ray_shard_dir(ray_run_key(path))
                target = rng.randint(1, max(1, len(total) // 3))
                result: dict = {}

                def run():
                    try:
                        result["summary"] = collect(**kw, db=path, ray_address="local", ray_shards=2,
                                                    ray_retries=args.retries, progress=False, recalibrate_hours=None)
                    except BaseException as e:  # noqa: BLE001
                        result["error"] = e

                t = threading.Thread(target=run, daemon=True)
                t.start()
                deadline = time.monotonic() + 120
                while t.is_alive() and time.monotonic() < deadline:
                    pids = shard_task_pids()
                    if pids and len(shard_rows(run_dir)) >= target:
                        break
                    time.sleep(0.02)
                if not t.is_alive():
                    print(f"trial {trial}: the collection ended before {target} rows were committed: {result}")
                    continue
                before = shard_rows(run_dir)
                os.kill(pids[0], signal.SIGKILL)
                t.join(300)
                how = "retried by Ray"
                if "error" in result:
                    how = f"shard failed ({str(result['error'])[:60]}...), rerun"
                    result["summary"] = collect(**kw, db=path, ray_address="local", ray_shards=2, progress=False,
                                                recalibrate_hours=None)
                s = result["summary"]
                after = rows(path)
                lost = sum(after.get(k) != ts for k, ts in before.items())
                complete = {k[:3] for k in after} == total and s.stopped == "complete"
                lost_all += lost
                ok_trials += complete and lost == 0
                print(f"trial {trial}: killed pid {pids[0]} with {len(before)} rows committed in the shards; "
                      f"{how}: {s.measured} measured, {s.cache_hits} cache hits; final {len(after)}/{len(total)}, "
                      f"lost {lost}; shard folder {'left' if run_dir.exists() else 'removed'}")
    finally:
        ray.shutdown()
    print(f"FIGURE: one Ray worker killed mid-shard, {lost_all} rows lost ({ok_trials}/{args.trials} trials "
          "complete with every committed row kept)")
    return 0 if lost_all == 0 and ok_trials == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
