"""Cluster-bootstrap CIs of group skin summaries: our vectorised replicates vs a plain loop that
resamples the rows with pandas and recomputes the statistics per replicate (the obvious baseline).

    python benchmarks/bench_skin_summary.py [--rows 2000] [--boot 200]

Prints seconds for both and the ratio; both use the same 5,000-pair cap for the diversity term.
"""

import argparse
import time

import numpy as np
import pandas as pd

from biasaudit.stats.skin_summary import mean_pairwise_de2000, skin_summary


def loop_baseline(g: pd.DataFrame, n_boot: int, rng: np.random.Generator, max_pairs: int = 5_000) -> np.ndarray:
    ids, inv = np.unique(g["prompt_id"].to_numpy(), return_inverse=True)
    members = [np.flatnonzero(inv == k) for k in range(len(ids))]
    boots = []
    for _ in range(n_boot):
        s = g.iloc[np.concatenate([members[k] for k in rng.integers(0, len(ids), len(ids))])]
        lab = s[["L", "a", "b"]].to_numpy(dtype=np.float64)
        boots.append((s["L"].mean(), s["C"].mean(), mean_pairwise_de2000(lab, max_pairs, int(rng.integers(2**31)))[0]))
    return np.quantile(np.array(boots), [0.025, 0.975], axis=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--boot", type=int, default=200)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"model": "m", "label": "black", "prompt_id": rng.choice([f"p{i}" for i in range(50)], args.rows),
                       "L": rng.uniform(20, 80, args.rows), "a": rng.uniform(0, 20, args.rows),
                       "b": rng.uniform(5, 30, args.rows)})
    df["C"] = np.hypot(df["a"], df["b"])
    df["h"] = np.degrees(np.arctan2(df["b"], df["a"])) % 360
    t0 = time.perf_counter()
    ours = skin_summary(df, n_boot=args.boot, boot_max_pairs=5_000)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    base = loop_baseline(df, args.boot, rng)
    t_base = time.perf_counter() - t0
    print(f"rows={args.rows} boot={args.boot}: vectorised {t_ours:.3f} s, pandas loop {t_base:.3f} s, "
          f"ratio {t_base / t_ours:.0f}x")
    print("L* CI ours", ours[["L_mean_lo", "L_mean_hi"]].round(2).to_numpy().ravel(), "loop", base[:, 0].round(2))


if __name__ == "__main__":
    main()
