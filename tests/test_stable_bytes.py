"""The same inputs give the same output bytes whatever the thread count (#40 item 8): floats that
hashed outputs carry are rounded by io.stable_floats before they are written."""

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd

from biasaudit.pipeline.io import EMBEDDING_DECIMALS, TABLE_DECIMALS, stable_floats

# One stage's float work under `threads` threads (OMP_NUM_THREADS, torch, threadpoolctl): the tiny CLIP
# embedding of a few images (faces stage: unrounded, 43 of its 384 floats differ between 1 and 2 threads
# on the development machine) and a BLAS product of unit rows (homogeneity's cosines), written as the
# stages write them; prints the md5 of the bytes.
RECOMPUTE = textwrap.dedent("""
    import hashlib, io, sys
    import numpy as np, torch
    from threadpoolctl import threadpool_limits
    from biasaudit.faces.embeddings import ClipEmbedder
    from biasaudit.pipeline.io import EMBEDDING_DECIMALS, stable_floats
    threads = int(sys.argv[1])
    torch.set_num_threads(threads)
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (96, 80, 3), dtype=np.uint8) for _ in range(12)]
    with threadpool_limits(threads):
        clip = ClipEmbedder("ViT-B-32", "tiny", device="cpu", batch_size=5).embed(images)
        wide = rng.standard_normal((300, 257))
        wide /= np.linalg.norm(wide, axis=1, keepdims=True)
        sims = wide @ wide.T
    buf = io.BytesIO()
    np.save(buf, stable_floats(clip, EMBEDDING_DECIMALS))
    np.save(buf, stable_floats(sims))
    print(hashlib.md5(buf.getvalue()).hexdigest())
""")


def _recompute(threads: int, tiny_dir) -> str:
    env = {"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "BIASAUDIT_TINY_DIR": str(tiny_dir)}
    import os

    out = subprocess.run([sys.executable, "-c", RECOMPUTE, str(threads)], capture_output=True, text=True, check=True,
                         env=os.environ | env)
    return out.stdout.strip().splitlines()[-1]


def test_a_stage_recomputed_with_one_or_two_threads_writes_the_same_bytes(tmp_path):
    assert _recompute(1, tmp_path) == _recompute(2, tmp_path)


def test_stable_floats_maps_neighbouring_floats_to_the_same_bytes_and_keeps_reported_digits():
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, 2000)
    q = 10.0 ** -TABLE_DECIMALS
    x = x[np.abs(x / q - np.floor(x / q) - 0.5) < 0.4]  # away from a rounding boundary
    jittered = np.nextafter(np.nextafter(x, np.inf), np.inf)  # two ulps off: what another kernel gives
    assert stable_floats(x).tobytes() == stable_floats(jittered).tobytes()
    assert np.max(np.abs(stable_floats(x) - x)) <= 0.5 * q * (1 + 1e-9)  # no reported digit changes
    e = rng.standard_normal((50, 32)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    r = stable_floats(e, EMBEDDING_DECIMALS)
    assert r.dtype == np.float32 and np.max(np.abs(r @ r.T - e @ e.T)) < 1e-3  # cosines keep 3 digits


def test_stable_floats_rounds_only_float_columns_and_drops_the_sign_of_zero():
    df = pd.DataFrame({"v": [-1e-12, 0.123456789], "n": [1, 2], "s": ["a", "b"]})
    out = stable_floats(df)
    assert out["v"].tolist() == [0.0, round(0.123456789, TABLE_DECIMALS)]
    assert not np.signbit(out["v"].to_numpy()).any()
    assert out["n"].tolist() == [1, 2] and out["s"].tolist() == ["a", "b"] and df["v"][0] == -1e-12
    assert hashlib.md5(stable_floats(np.array([-0.0])).tobytes()).digest() == hashlib.md5(np.array([0.0]).tobytes()).digest()


def test_the_tiny_clip_checkpoint_has_the_same_bytes_in_every_fresh_build(tmp_path):
    """Its sha256 is the embedder's revision, recorded in every embedding output: two builds in two fresh
    folders (as two clones make) must hash alike."""
    from biasaudit.tiny.clip import build_tiny_open_clip

    digests = {hashlib.sha256(build_tiny_open_clip(tmp_path / str(k))[1].read_bytes()).hexdigest() for k in (1, 2)}
    assert len(digests) == 1
