"""faces stage: the local process pool (`execution.local_workers: 2`) vs the serial local runner.

Both sides run the stage's real entry point (`run_faces`) from scratch on the same packaged-photos
images (the offline profile's faces settings: dlib HOG + 68 landmarks + dlib face descriptor, tiny
CLIP), each in its own empty work folder. The serial side is today's default (one process; torch and
BLAS use every core). The pool's time includes spawning its workers and loading one set of models
per worker, which is what a user waits for. Reps are interleaved (serial, pool, serial, pool, …) after
one untimed warm-up of each; medians are reported with the 1-minute load average before each rep,
because this machine may be shared. The records of both sides are compared field by field.

    python benchmarks/bench_faces_workers.py [--images 48] [--size 320] [--reps 3] [--workers 2]

Measured (2 shared cores, 96 images of 320×320, 3 interleaved reps, 1-min load 0.7–1.0 before each rep,
i.e. our own run): serial median 11.33 s, pool 6.19 s → 1.83×, records identical. With other jobs on the
machine (load 3–8) the ratio fell to 0.8–1.15×: the pool only helps when its cores are free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def config(workers: int, size: int, images_per_prompt: int):
    from biasaudit.config import read_yaml, validate

    raw = read_yaml(ROOT / "params.yaml")
    raw["models"] = {"photos": {"backend": "packaged-photos", "width": size, "height": size}}
    raw["generate"] = {**raw["generate"], "images_per_prompt": images_per_prompt, "limit": 0}
    raw["faces"] = {**raw["faces"], "limit": 0, "device": "cpu"}
    raw["execution"] = {**raw["execution"], "runner": "local", "local_workers": workers}
    return validate(raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--size", type=int, default=320)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import numpy as np
    import pandas as pd

    from biasaudit.faces.stage import run_faces
    from biasaudit.t2i.generate import run_generate

    here = os.getcwd()
    per_prompt = 4
    n_prompts = max(1, args.images // per_prompt)
    with tempfile.TemporaryDirectory() as ws:
        os.chdir(ws)
        os.environ.setdefault("BIASAUDIT_TINY_DIR", str(Path(ws) / "tiny"))
        Path("data/t2i").mkdir(parents=True)
        pd.DataFrame({"prompt_id": [f"occ_p{i}" for i in range(n_prompts)], "template_version": "v1",
                      "prompt": [f"A person who works as job {i}" for i in range(n_prompts)]}
                     ).to_csv("data/t2i/prompts.csv", index=False)
        run_generate("photos", config(1, args.size, per_prompt), progress=False)
        n = n_prompts * per_prompt

        def once(workers: int):
            shutil.rmtree("data/t2i/.work", ignore_errors=True)
            cfg = config(workers, args.size, per_prompt)
            load = os.getloadavg()[0]
            t = time.perf_counter()
            out = run_faces("photos", cfg, progress=False)
            elapsed = time.perf_counter() - t
            assert out["summary"].processed == n and (out["execution"]["local_workers"] == workers)
            return elapsed, load, out

        once(1), once(args.workers)  # warm-up: tiny CLIP built, files in the page cache
        times: dict[int, list[float]] = {1: [], args.workers: []}
        loads: list[float] = []
        last: dict[int, dict] = {}
        for _ in range(args.reps):
            for w in (1, args.workers):
                elapsed, load, out = once(w)
                times[w].append(elapsed)
                loads.append(load)
                last[w] = out
        os.chdir(here)
    serial, pool = last[1], last[args.workers]
    pd.testing.assert_frame_equal(serial["faces"], pool["faces"])  # every field of every record
    pd.testing.assert_frame_equal(serial["index"], pool["index"])
    same = all(np.array_equal(serial[s], pool[s]) for s in ("clip", "face"))
    assert same, "embeddings differ between serial and pool"
    med = {w: statistics.median(v) for w, v in times.items()}
    result = {"images": n, "size": args.size, "workers": args.workers, "cpus": os.cpu_count(), "reps": args.reps,
              "serial_s": [round(x, 2) for x in times[1]], "pool_s": [round(x, 2) for x in times[args.workers]],
              "serial_median_s": round(med[1], 2), "pool_median_s": round(med[args.workers], 2),
              "speedup_pool_vs_serial": round(med[1] / med[args.workers], 2),
              "load_1min_before_reps": [round(x, 2) for x in loads], "identical_records": True,
              "faces_ok": int((serial["faces"]["status"] == "ok").sum())}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
