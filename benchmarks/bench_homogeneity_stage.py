"""The homogeneity section's compute (biasaudit.t2i.analysis.homogeneity) at paper scale: wall and CPU seconds.

Input: bench_analyze.py's SYNTHETIC tree (contract formats; every number made up), here `--models` models ×
3·`--per-category` prompts × 100 images (default 1 × 51 × 100), CLIP 1024-d and face 512-d float32 embeddings.
Settings: params.yaml's analyze values (n_permutations, permutation_stop_after, near_duplicate_cosine, n_boot),
or the paper profile's with --paper; the section's own threads (its (model, space) units on every core, 1 BLAS
thread each). One untimed warm-up, then `--reps` runs; medians, with the load average (shared machine).

    python benchmarks/bench_homogeneity_stage.py [--tree /tmp/biasaudit-homog-tree] [--models 1]
        [--per-category 17] [--reps 3] [--paper]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_analyze as BA


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path("/tmp/biasaudit-homog-tree"))
    ap.add_argument("--models", type=int, default=1)
    ap.add_argument("--per-category", type=int, default=17)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paper", action="store_true", help="the paper profile's analyze values")
    a = ap.parse_args()
    BA.MODELS = BA.MODELS[:a.models]
    BA.PROMPTS_PER_CATEGORY = a.per_category
    tree = BA.write_paper_tree(a.tree / f"m{a.models}-p{a.per_category}")

    from biasaudit.config import read_yaml, validate
    from biasaudit.t2i.analysis import homogeneity, inputs

    cfg = BA.paper_config() if a.paper else validate(read_yaml(Path("params.yaml")))
    data = inputs.load_inputs(tree, cfg.generate.prompts_file, cfg.generate.images_dir, groups=cfg.groups)
    homogeneity.compute(data, cfg)  # warm: numba, page cache
    wall, cpu, load = [], [], []
    for _ in range(a.reps):
        t, c = time.perf_counter(), time.process_time()
        homogeneity.compute(data, cfg)
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        load.append(os.getloadavg()[0])
    an = cfg.analyze
    print(f"homogeneity compute: {a.models} model(s) × {3 * a.per_category} prompts × {BA.IMAGES_PER_PROMPT} images, "
          f"CLIP {BA.CLIP_DIM}-d + face {BA.FACE_DIM}-d; n_boot {an.n_boot}, n_permutations {an.n_permutations} "
          f"(stop after {an.permutation_stop_after}), near-duplicates at {an.near_duplicate_cosine}; "
          f"{len(os.sched_getaffinity(0))} cores")
    print(f"  wall {statistics.median(wall):.2f} s (runs {', '.join(f'{w:.2f}' for w in wall)}), "
          f"CPU {statistics.median(cpu):.2f} s, load average {min(load):.2f}–{max(load):.2f}")


if __name__ == "__main__":
    main()
