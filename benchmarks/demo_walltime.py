"""The whole offline demo (`dvc repro` from nothing), before and after the runner work of the report
issue, on the same commit and the same content: only how stages are executed differs.

- before: the previous `scripts/run-notebook` (three command lines per stage: jupytext → papermill →
  nbconvert HTML) and `execution.local_workers: 1`;
- after: this commit as it is (one-process runner, HTML once in the report stage, the local process
  pool of `execution.local_workers` for the CPU-bound stages).

Each repetition is a fresh `git clone` of HEAD (sharing this checkout's .venv and models/), so nothing
is resumed; the sides alternate (before, after, before, after, …) after one warm-up run of each, and
the medians are compared. Both sides must write the same metrics/headline.json (checked).

    python benchmarks/demo_walltime.py [--repeats 2] [--no-warmup]   (not in `make bench`: ~5 min per run)

Measured on the 2-core development machine, otherwise idle, 2026-12-01, `--repeats 2 --no-warmup`
(identical headline.json on both sides every time):
    this commit:                                  before 399.5, 392.5 s; after 270.1, 242.1 s: -35% (1.55x)
      (the fork server started before the driver loads its models, workers without torch's import,
       backend names read from source, decoded VLM images kept; "before" shares the last two)
    without those:                                before 363.6, 364.0 s; after 283.6, 271.8 s: -24% (1.31x)
    without the planted-generate pool:            before 362.0, 349.1 s; after 269.7, 281.7 s: -22% (1.29x)
    without that and the instruments pool:        before 357.3, 335.6 s; after 307.7, 276.1 s: -16% (1.19x)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEGACY_RUNNER = """#!/usr/bin/env bash
# the runner before the report issue: jupytext, then papermill, then nbconvert HTML, per stage
set -euo pipefail
if [ -x .venv/bin/python ]; then PATH="$PWD/.venv/bin:$PATH"; fi
nb=$1; name=$2; shift 2
mkdir -p reports/notebooks
out=reports/notebooks/$name.ipynb
jupytext --quiet --to ipynb --output "$out" "$nb"
papermill "$out" "$out" -k python3 --no-progress-bar --log-level WARNING "$@"
jupyter nbconvert --to html --log-level WARN "$out"
"""


def clone(side: str, base: Path) -> Path:
    work = base / side
    if work.exists():
        shutil.rmtree(work)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(work)], check=True)
    (work / ".venv").symlink_to(ROOT / ".venv")
    shutil.copytree(ROOT / "models", work / "models", dirs_exist_ok=True, symlinks=True)
    if side == "before":
        runner = work / "scripts/run-notebook"
        runner.write_text(LEGACY_RUNNER)
        runner.chmod(0o755)
        params = work / "params.yaml"
        text = params.read_text()
        params.write_text(text.replace("  local_workers: 2 ", "  local_workers: 1 ", 1))
    return work


def run(side: str, base: Path) -> tuple[float, dict]:
    work = clone(side, base)
    # the clone's own src first (the shared .venv's editable install points at this checkout's)
    env = {**os.environ, "PATH": f"{work / '.venv/bin'}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1",
           "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0", "PYTHONPATH": str(work / "src")}
    t = time.perf_counter()
    proc = subprocess.run([str(work / ".venv/bin/dvc"), "repro", "--quiet"], cwd=work, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode:
        sys.exit(f"{side}: dvc repro failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, json.loads((work / "metrics/headline.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if not args.no_warmup:
            for side in times:
                run(side, base)
        for i in range(args.repeats):
            heads = {}
            for side in times:
                seconds, heads[side] = run(side, base)
                times[side].append(seconds)
                print(f"repeat {i + 1} {side:6s} {seconds:6.1f} s", flush=True)
            if heads["before"] != heads["after"]:
                sys.exit(f"the two sides wrote different metrics/headline.json:\n{heads}")
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    print(f"whole offline demo, median of {args.repeats} interleaved runs: before {before:.1f} s, "
          f"after {after:.1f} s: {100 * (after - before) / before:+.0f}% ({before / after:.2f}x)")


if __name__ == "__main__":
    main()
