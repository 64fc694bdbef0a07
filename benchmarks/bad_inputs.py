"""Runs the bad-input corpus (tests/bad_corpus.py) through the real ``collage-ml`` CLI and counts.

Every case is one command on one bad input (a broken ONNX model, database, placed-model folder or
cost-model artifact), run as its own process, as a user would. A case is clean when it exits 1 with exactly
one error line that names the file, and no traceback (a command's progress log before that line is allowed).

    .venv/bin/python benchmarks/bad_inputs.py            # subprocesses (about 2 s each)
    .venv/bin/python benchmarks/bad_inputs.py --in-process   # through collage_ml.cli.main, much faster

Prints "N bad inputs tried, N clean one-line errors, 0 tracebacks" and every case that was not clean;
exits 1 when any was not.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import bad_corpus  # noqa: E402
from tests.test_bad_inputs import verdict  # noqa: E402


def run_case(case: bad_corpus.Case, in_process: bool) -> tuple[object, str]:
    if not in_process or case.argv is None:
        r = subprocess.run(case.command(), capture_output=True, text=True, cwd=ROOT, timeout=600)
        return r.returncode, r.stderr
    from collage_ml.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(case.argv)
        except SystemExit as e:
            rc = e.code
        except BaseException:  # an uncaught exception is what a user would see as a traceback
            import traceback

            rc, _ = 1, err.write("Traceback (most recent call last):\n" + traceback.format_exc())
    return rc, err.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in-process", action="store_true", help="call collage_ml.cli.main instead of subprocesses")
    ap.add_argument("--kind", choices=["model", "db", "placed", "artifact"], action="append",
                    help="only these kinds (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="collage-bad-") as tmp:
        cases = [c for c in bad_corpus.build(Path(tmp)) if not args.kind or c.kind in args.kind]
        clean, tracebacks, bad = 0, 0, []
        t0 = time.perf_counter()
        for c in cases:
            rc, err = run_case(c, args.in_process)
            why = verdict(c, rc, err)
            tracebacks += "Traceback" in err
            if why is None:
                clean += 1
            else:
                bad.append(f"  {c.label}: {why}")
        if bad_corpus.marker_of(Path(tmp)).exists():
            bad.append("  a malicious placed model ran code (the marker file exists)")
        seconds = time.perf_counter() - t0
    kinds = {k: sum(c.kind == k for c in cases) for k in ("model", "db", "placed", "artifact")}
    print(f"{len(cases)} bad inputs tried, {clean} clean one-line errors, {tracebacks} tracebacks "
          f"({', '.join(f'{n} {k}' for k, n in kinds.items() if n)}; {seconds:.0f} s)")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
