"""Fixed cost of one notebook stage: the old `scripts/run-notebook` (three command lines: jupytext →
papermill → nbconvert HTML) vs the new one (one process: jupytext's API, papermill's parameter
injection, nbclient (papermill's engine) without importing papermill; no per-stage HTML, the report
stage exports every notebook once).

The notebook is trivial (one cell that imports numpy and prints), so the time measured is the
overhead alone. Each side is warmed once, then the two alternate (old, new, old, new, …) and the
medians are compared; each phase of the old path is timed separately so the ratio can be traced to
papermill, nbconvert and jupytext. Also printed: the export of all notebooks once, as the report
stage does it (per notebook, in-process).

    python benchmarks/bench_stage_overhead.py [--repeats 5]
    python benchmarks/bench_stage_overhead.py --fixed-cost [--baseline REV] [--stage NAME] [--repeats 5]

Measured on the 2-core development machine, shared with other jobs (load average 5-6), 2026-12-01:
    old 3.37 s (jupytext 0.42 + papermill 1.62 + nbconvert 1.28), new 1.43 s: 2.36x less per stage;
    HTML of 19 notebooks once in the report stage 3.4 s (old: 19 x nbconvert = 24.3 s); 33.5 s saved.
Whole offline demo (`dvc repro` from nothing, old commit e12c3c1 vs this one, both copies run at the
same time so they share the load): old 512 s, new 455 s (-11%); the work inside the stages dominates
under that load, so the idle-machine ratio (the issue's 5.5 s per stage, 39% of the demo) is not shown.

`--fixed-cost` (#40 item 7): the cost above a plain `python -c pass`, with rfc3987_syntax imported as before
and without it (report.execute.skip_unused_imports; pandas no longer imported by biasaudit.pipeline.io), median of 5,
same 2-core machine shared with 3 other jobs (load 1.8-2.1): 3.65 s before, 1.74 s after (2.10x); a single
run by hand at load 1.3: 1.35-1.45 s wall in all, of which ~0.8-1.3 s is the kernel's own start.

`--fixed-cost --baseline a8a768f` (#40 item 6): the runner of that commit vs this one, median of 7, same
machine at load 2.3-2.9: 1.29 s before, 0.91 s after (1.41x); with `--stage analyze` (params.yaml and
weights checked, as under dvc repro) 1.96 s before, 1.35 s after (1.46x). At load 0.7 (before the last
two cuts) 1.14 s vs 0.97 s. What changed: the kernel is launched first and boots (0.5-0.8 s) while the
runner looks up the stage, checks params.yaml and converts the notebook; no 0.2 s wait for IOPub
silence after it is ready; neither the kernel imports debugpy (0.07 s) nor the runner tornado.web or
jsonschema's unused format checkers (0.08 s); params.yaml is loaded once and dvc.yaml/params.yaml are
parsed with libyaml. What is left on the trivial notebook, 0.9 s: the kernel's start, ready ~0.5 s
after launch (imports 0.26 s: ipykernel with jupyter_client, zmq and IPython 0.15, biasaudit+numpy 0.07;
then IPython's shell and the sockets), which the runner's own ~0.5 s (imports, jupytext 0.22) now
overlaps on two cores; then execute + write 0.05 s. `--stage` adds the stage check (pydantic models
and validation of params.yaml, 0.35 s, in parallel with the kernel) and, in this benchmark's scratch
folder without a DVC repository, a failed attempt to plan the stage order (0.2-0.3 s; in the repository
the plan is cached).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = """# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% tags=["parameters"]
n = 1

# %%
import numpy as np
print(np.arange(n).sum())
"""


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def old_stage(nb: Path, out: Path) -> dict[str, float]:
    """The previous scripts/run-notebook, phase by phase."""
    ipynb = out / "old.ipynb"
    times = {}
    for phase, cmd in (
        ("jupytext", [_bin("jupytext"), "--quiet", "--to", "ipynb", "--output", str(ipynb), str(nb)]),
        ("papermill", [_bin("papermill"), str(ipynb), str(ipynb), "-k", "python3", "--cwd", str(out),
                       "--no-progress-bar", "--log-level", "WARNING", "-p", "n", "3"]),
        ("nbconvert", [_bin("jupyter"), "nbconvert", "--to", "html", "--log-level", "WARN", "--output", "old.html",
                       str(ipynb)]),
    ):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=out)
        times[phase] = time.perf_counter() - t
    times["total"] = sum(times.values())
    return times


# The runner as it was before #40 item 7: rfc3987_syntax imported (through jupytext → nbformat's
# validator → jsonschema) before the runner marks it unused, so its 1.2 s Earley grammar is built.
WITH_RFC3987 = "import sys, rfc3987_syntax; from biasaudit.report.execute import main; sys.exit(main(sys.argv[1:]))"


def new_stage(nb: Path, out: Path, preload_rfc3987: bool = False, src: Path | None = None,
              stage: str = "") -> dict[str, float]:
    """One run of the runner; `src`: another checkout's src/ (--baseline); `stage`: DVC_STAGE, so the
    runner also checks params.yaml and the stage's weights as in `dvc repro` (--stage), against copies
    of params.yaml and dvc.yaml in `out` (the stage's real outputs are never touched)."""
    head = ["-c", WITH_RFC3987] if preload_rfc3987 else ["-m", "biasaudit.report.execute"]
    env = {**os.environ, "DVC_STAGE": stage}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    t = time.perf_counter()
    subprocess.run([sys.executable, *head, str(nb), "new", "-p", "n", "3"], check=True, capture_output=True,
                   cwd=out, env=env)
    return {"total": time.perf_counter() - t}


def bare_python() -> float:
    """A plain `python -c pass`: the start no stage can go below."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t


def baseline_src(rev: str, dest: Path) -> Path:
    """The src/ folder of git revision `rev`, extracted under `dest` (with data/reference, which the
    package finds next to src/)."""
    archive = subprocess.run(["git", "archive", rev, "src", "data/reference"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def fixed_cost(nb: Path, out: Path, repeats: int, baseline: str = "", stage: str = "") -> None:
    """Per-stage cost above a plain Python start, before and after (interleaved, medians). Before: the
    runner with rfc3987_syntax imported, or the runner of git revision `baseline`."""
    src = baseline_src(baseline, out) if baseline else None
    if stage:
        for name in ("params.yaml", "dvc.yaml"):
            shutil.copy(ROOT / name, out / name)
    before_label = f"runner at {baseline}" if baseline else "with rfc3987_syntax imported"
    after_label = "this runner" if baseline else "without it (skip_unused_imports)"

    def before_run() -> float:
        return new_stage(nb, out, preload_rfc3987=not baseline, src=src, stage=stage)["total"]

    def after_run() -> float:
        return new_stage(nb, out, stage=stage)["total"]

    before_run(), after_run()  # warm
    bare, before, after = [], [], []
    for _ in range(repeats):
        bare.append(bare_python())
        before.append(before_run())
        after.append(after_run())
    b, pre, post = (statistics.median(x) for x in (bare, before, after))
    load = os.getloadavg()[0]
    print(f"per-stage fixed cost above `python -c pass` ({b:.2f} s), median of {repeats} interleaved runs"
          f"{f' as stage {stage}' if stage else ''} (load average at the end {load:.2f}):")
    print(f"  {before_label + ' (before)':<40} {pre - b:6.2f} s")
    print(f"  {after_label + ' (after)':<40} {post - b:6.2f} s")
    print(f"  ratio before / after                     {(pre - b) / (post - b):6.2f}x")


def export_once(out: Path, n: int) -> float:
    """In-process HTML export of n executed notebooks (what the report stage does once)."""
    code = ("import sys, shutil; from pathlib import Path; from biasaudit.report.trail import export_all\n"
            f"d = Path(sys.argv[1]); [shutil.copy(d / 'reports/notebooks/new.ipynb', d / f'nb/{{i}}.ipynb') for i in range({n})]\n"
            "export_all(d / 'nb', d / 'html')")
    (out / "nb").mkdir(exist_ok=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stages", type=int, default=19, help="notebook stages in the demo (dvc.yaml)")
    ap.add_argument("--fixed-cost", action="store_true",
                    help="only the cost above a plain Python start, with and without rfc3987_syntax (#40 item 7)")
    ap.add_argument("--baseline", default="", metavar="REV",
                    help="with --fixed-cost: compare with the runner of this git revision instead")
    ap.add_argument("--stage", default="", help="with --fixed-cost: run as this DVC stage (params and weights "
                    "checked, as in dvc repro; the trivial notebook still replaces the stage's own)")
    args = ap.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        nb = out / "stage.py"
        nb.write_text(NOTEBOOK)
        if args.fixed_cost:
            return fixed_cost(nb, out, args.repeats, args.baseline, args.stage)
        old_stage(nb, out), new_stage(nb, out)  # warm both (imports, kernel spec lookup, disk cache)
        olds, news = [], []
        for _ in range(args.repeats):
            olds.append(old_stage(nb, out))
            news.append(new_stage(nb, out))
        export = export_once(out, args.stages)
    med = {k: statistics.median(o[k] for o in olds) for k in olds[0]}
    new = statistics.median(n["total"] for n in news)
    print(f"per-stage fixed cost, median of {args.repeats} interleaved runs (trivial notebook):")
    print(f"  old scripts/run-notebook  {med['total']:6.2f} s  (jupytext {med['jupytext']:.2f} + papermill "
          f"{med['papermill']:.2f} + nbconvert {med['nbconvert']:.2f})")
    print(f"  new scripts/run-notebook  {new:6.2f} s  (one process, no per-stage HTML)")
    print(f"  ratio old / new           {med['total'] / new:6.2f}x")
    print(f"  report stage: HTML of {args.stages} notebooks once, in-process: {export:.2f} s "
          f"(old: {args.stages} × nbconvert = {args.stages * med['nbconvert']:.1f} s)")
    saved = args.stages * (med["total"] - new) - export
    print(f"  fixed cost saved over {args.stages} stages: {saved:.1f} s")


if __name__ == "__main__":
    main()
