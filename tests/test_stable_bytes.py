"""The same inputs give the same output bytes whatever the thread count (#40 item 8): floats that
hashed outputs carry are rounded by io.stable_floats before they are written."""

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

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


@pytest.mark.slow
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


# Method A's analysis sections on the synthetic tree, written by the OutputWriter (tables, metrics.json,
# manifest, figures' index) under one OpenBLAS kernel; prints the md5 of every written file except the
# figures' pixels, then the md5 of the sections' metrics at full precision (what was written before the
# writer rounded), so the test can tell that the two kernels did differ.
ANALYSIS = textwrap.dedent("""
    import hashlib, json, sys
    from pathlib import Path
    import numpy as np
    np.random.seed(0)  # as stage_params does: seaborn jitters the strip plots' points with the global RNG
    sys.path.insert(0, sys.argv[2])
    from tests.fixtures_t2i import analysis_config, write_tree
    from biasaudit.contracts import GROUPS
    from biasaudit.pipeline.outputs import OutputWriter
    from biasaudit.t2i.analysis import corrected, homogeneity, reliability, representation, skin
    from biasaudit.t2i.analysis.inputs import PLOTS, load_inputs
    root = Path(sys.argv[1])
    write_tree(root)
    data = load_inputs(root, groups=GROUPS)
    cfg = analysis_config(n_boot=100, n_permutations=50, min_group_size=5)
    writer = OutputWriter(root / "reports/t2i", dpi=30)
    raw = []
    for section in (representation, skin, homogeneity, reliability, corrected):
        result = section.compute(data, cfg)
        raw.append(json.dumps(result.metrics, sort_keys=True, default=repr))
        raw.extend(t.to_csv(float_format="%.17g") for t in result.tables.values())
        writer.add(result)
    writer.finish(PLOTS, profile="offline", stand_in=True)
    out = root / "reports/t2i"
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.suffix != ".png"):
        print(path.relative_to(out).as_posix(), hashlib.md5(path.read_bytes()).hexdigest())
    print("RAW", hashlib.md5("".join(raw).encode()).hexdigest())
""")


def _analysis_hashes(coretype: str, folder) -> tuple[dict[str, str], str]:
    import os

    from .conftest import ROOT

    folder.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"OPENBLAS_CORETYPE": coretype, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                        "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0"}
    out = subprocess.run([sys.executable, "-c", ANALYSIS, str(folder), str(ROOT)], capture_output=True, text=True,
                         check=True, env=env, cwd=folder)
    lines = [line.rsplit(" ", 1) for line in out.stdout.strip().splitlines() if line.count(" ") == 1]
    files = {name: digest for name, digest in lines if name != "RAW"}
    return files, dict(lines)["RAW"]


@pytest.mark.slow
def test_the_analysis_writes_the_same_bytes_under_two_cpu_kernels(tmp_path):
    """The t2i analysis sections under OpenBLAS's Haswell kernels and its oldest x86-64 ones (Prescott: SSE3,
    another summation order): every table, metrics.json, manifest and figure file (pixels aside) hashes alike.
    The sections' full-precision metrics differ between the two, so the equality is the writer's doing."""
    fast, fast_raw = _analysis_hashes("Haswell", tmp_path / "haswell")
    old, old_raw = _analysis_hashes("Prescott", tmp_path / "prescott")
    assert len(fast) > 30 and "metrics.json" in fast and "tables/tvd_summary.csv" in fast
    assert {k for k in fast if fast[k] != old.get(k)} == set()
    assert fast.keys() == old.keys()
    if fast_raw == old_raw:
        pytest.skip("this machine's OpenBLAS gave both kernels the same full-precision floats: nothing was tested")


def test_the_writer_rounds_every_float_to_the_declared_significant_digits(tmp_path):
    """The issue's pair (the same number from two OpenBLAS kernels) is written alike, with 10 significant digits;
    a cancellation's residue is 0; NaN stays NaN (JSON: null). Expected values written out by hand."""
    import json
    import math

    from biasaudit.pipeline.io import SIGNIFICANT_DIGITS, atomic_write_json, atomic_write_table, stable_float

    assert SIGNIFICANT_DIGITS == 10
    assert stable_float(0.0017567878950580373) == stable_float(0.0017567878950580512) == 0.001756787895
    assert stable_float(123456.78901234) == 123456.789 and stable_float(-2.5e-17) == 0.0
    assert repr(stable_float(-1e-20)) == "0.0" and math.isnan(stable_float(float("nan")))
    assert stable_float(3.0e-9) == 3e-9 and stable_float(1e300) == 1e300
    df = pd.DataFrame({"x": [0.0017567878950580373, 1 / 3, -3e-17], "k": [1, 2, 3], "s": ["a", "b", "c"]})
    atomic_write_table(df, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text() == "x,k,s\n0.001756787895,1,a\n0.3333333333,2,b\n0.0,3,c\n"
    atomic_write_table(df, tmp_path / "t.parquet")
    assert pd.read_parquet(tmp_path / "t.parquet")["x"].tolist() == [0.001756787895, 0.3333333333, 0.0]
    atomic_write_json(tmp_path / "m.json", {"a": np.float64(2 / 3), "b": [1 / 7, None, 5], "c": {"d": np.float32(0.1)}})
    assert json.loads((tmp_path / "m.json").read_text()) == {"a": 0.6666666667, "b": [0.1428571429, None, 5],
                                                             "c": {"d": 0.1000000015}}


# The tiny CLIP's embedding of a few images, unrounded, at one thread: md5 of its float32 bytes and the kernel
# capability torch ran.
RAW_EMBEDDING = textwrap.dedent("""
    import hashlib
    import numpy as np, torch
    from biasaudit.faces.embeddings import ClipEmbedder
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (96, 80, 3), dtype=np.uint8) for _ in range(6)]
    X = ClipEmbedder("ViT-B-32", "tiny", device="cpu", batch_size=6).embed(images)
    print(torch.backends.cpu.get_cpu_capability(), hashlib.md5(np.ascontiguousarray(X).tobytes()).hexdigest())
""")


def _raw_embedding(env: dict[str, str], tiny_dir) -> tuple[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                            "DNNL_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")}
    out = subprocess.run([sys.executable, "-c", RAW_EMBEDDING], capture_output=True, text=True, check=True,
                         env=base | {"OMP_NUM_THREADS": "1", "BIASAUDIT_TINY_DIR": str(tiny_dir)} | env)
    capability, digest = out.stdout.strip().splitlines()[-1].split()
    return capability, digest


def demo_pins() -> dict[str, str]:
    """The Makefile's PINNED_KERNELS as make expands it on this machine."""
    from pathlib import Path

    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "print-pins: ; @echo $(PINNED_KERNELS)",
                          "print-pins"], cwd=Path(__file__).parents[1], capture_output=True, text=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.split())


@pytest.mark.slow
def test_the_demo_pins_torch_kernels_so_another_cpu_writes_the_same_embedding_bytes(tmp_path):
    """`make demo` runs the pipeline under the Makefile's PINNED_KERNELS. Unpinned, the tiny CLIP's float32
    embedding depends on the vector kernels the CPU offers (a fresh clone on an AVX-512 machine wrote other
    embedding bytes, and so another dvc.lock, than the committed one). Pinned, a machine offering fewer
    instructions (emulated: MKL told to stop at AVX2 or SSE4.2, ATen asked for AVX2) writes the same bytes."""

    pins = demo_pins()
    assert pins["ATEN_CPU_CAPABILITY"] == "default"
    pinned = {_raw_embedding(pins | other, tmp_path) for other in
              ({}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})}
    assert len(pinned) == 1 and next(iter(pinned))[0] == "DEFAULT", pinned
    # the bytes hang on the kernels: unpinned, ATen's AVX2 kernels and its default ones write different bytes
    avx2 = _raw_embedding({"ATEN_CPU_CAPABILITY": "avx2"}, tmp_path)
    if avx2[0] != "AVX2":
        pytest.skip(f"this CPU runs no AVX2 kernels ({avx2[0]}): the unpinned contrast was not tested")
    assert _raw_embedding({"ATEN_CPU_CAPABILITY": "default"}, tmp_path)[1] != avx2[1]


def test_an_executed_notebooks_bars_lose_their_clocks_and_padding():
    """Two runs of one stage wrote `824/824 \\n` and `824/824\\n` (tqdm pads a line to cover a longer previous
    one, whose length is its rate's): the executed notebook, a DVC output, must not keep either."""
    import nbformat

    from biasaudit.report.execute import without_clocks

    texts = ["reflect tiny: 100%|██████████| 824/824 [00:12<00:00, 65.90item/s]   \n",
             "reflect tiny: 100%|██████████| 824/824 [01:02<00:00, 13.1item/s]\n"]
    cleaned = []
    for text in texts:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "", outputs=[nbformat.v4.new_output("stream", name="stderr", text="note \n" + text)])])
        without_clocks(nb)
        cleaned.append(nb.cells[0].outputs[0]["text"])
    assert cleaned[0] == cleaned[1] == "note\nreflect tiny: 100%|██████████| 824/824\n"


def test_a_markdown_table_writes_a_residue_of_either_sign_as_zero():
    """The demo's placebo table (planted_placebo_tests.md) read `-0` in its `planted` column on one CPU and `0` on
    another, while its CSV read 0.0 on both: the Markdown rounded the raw floats. Expected text by hand."""
    from biasaudit.pipeline.outputs import to_markdown

    neg = to_markdown(pd.DataFrame({"d": [-3e-9, 0.1234], "k": [1, 2]}))
    pos = to_markdown(pd.DataFrame({"d": [2e-9, 0.1234], "k": [1, 2]}))
    assert neg == pos and "-0" not in neg
    assert neg.splitlines()[2].split("|")[1].strip() == "0"
    assert neg.splitlines()[3].split("|")[1].strip() == "0.123"


@pytest.mark.slow
def test_under_the_demos_pins_an_emulated_avx2_cpu_writes_the_same_analysis_bytes(tmp_path, monkeypatch):
    """`make demo` pins OpenBLAS to its SSE3 kernels, which every x86-64 CPU runs: a fresh clone's demo under an
    emulated AVX2 CPU (OpenBLAS Haswell, numba compiling for haswell, MKL stopped at AVX2) had written other bytes
    in 7 of analyze's and reflect_analysis' tables (an optimiser's residue at 1e-11 .. 1e-7 where the answer is 0).
    Under the pins, the analysis sections write the same files on this CPU and under the emulated one; numba's
    vector width still changes the full-precision floats, which the writer's rounding absorbs."""
    import platform

    if platform.machine() != "x86_64":
        pytest.skip("the emulated CPU and the OpenBLAS pin are x86-64's")
    pins = demo_pins()
    assert pins["OPENBLAS_CORETYPE"] == "Prescott"  # the oldest x86-64 kernels: present on every such CPU
    for key, value in pins.items():
        monkeypatch.setenv(key, value)
    host, _ = _analysis_hashes(pins["OPENBLAS_CORETYPE"], tmp_path / "host")
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    other, _ = _analysis_hashes(pins["OPENBLAS_CORETYPE"], tmp_path / "avx2")
    assert len(host) > 30 and host == other
