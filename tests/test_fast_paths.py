"""The fast paths of the analysis against the direct computation: per-(prompt, group) sums of several
labellings in one pass, the permutation test's per-draw group sums, the figures' shared bounding box, and
sections written by child processes."""

import numpy as np
import pandas as pd
import pytest

from biasaudit.pipeline.lifeline import FORKS
from biasaudit.stats import homogeneity as H
from biasaudit.stats import kernels


def test_cell_sums_many_equals_direct_sums_with_unlabelled_and_bad_rows():
    rng = np.random.default_rng(5)
    N, d, P = 300, 7, 6
    X = rng.normal(size=(N, d)).astype(np.float32)
    X[3] = 0  # no direction: left out
    X[8, 2] = np.nan  # not finite: left out
    prompts = rng.integers(0, P, size=N)
    prompts[11] = -1  # no prompt
    a = rng.integers(-1, 3, size=N)  # −1: unlabelled
    b = rng.integers(-1, 4, size=N)
    got = H.cell_sums_many(X, [a, b], prompts, [3, 4], P, chunk=64)  # several chunks
    for codes, G, (S, n, q) in zip((a, b), (3, 4), got):
        for p in range(P):
            for g in range(G):
                rows = [i for i in range(N) if prompts[i] == p and codes[i] == g and i not in (3, 8)]
                unit = X[rows].astype(np.float64) / np.linalg.norm(X[rows].astype(np.float64), axis=1, keepdims=True)
                np.testing.assert_allclose(S[p, g], unit.sum(axis=0), atol=1e-5)
                assert n[p, g] == len(rows)
                assert q[p, g] == pytest.approx(len(rows), abs=1e-5)  # Σ‖x/‖x‖‖² = count
        assert S.flags.c_contiguous  # kernels.cell_dots reads it in place
        single = H.cell_sums(X, codes, prompts, G, P)
        for x, y in zip(single, (S, n, q)):
            np.testing.assert_allclose(x, y, atol=1e-5)


def test_cell_dots_equal_the_definition():
    rng = np.random.default_rng(9)
    S = rng.normal(size=(4, 3, 5))
    sq, tot = np.empty((4, 3)), np.empty((4, 3))
    kernels.cell_dots(S, sq, tot)
    for p in range(4):
        for g in range(3):
            assert sq[p, g] == pytest.approx(sum(v * v for v in S[p, g]), rel=1e-12)
            assert tot[p, g] == pytest.approx(sum(float(S[p, g] @ S[p, h]) for h in range(3)), rel=1e-12)


@pytest.mark.parametrize("dtype, d, sizes, b", [(np.float32, 9, (7, 0, 12), 6), (np.float64, 9, (7, 0, 12), 6),
                                                 (np.float64, 4096, (40, 0, 17), 70), (np.float32, 4096, (75, 3), 37)])
def test_permuted_cell_dots_equal_the_definition(dtype, d, sizes, b):
    """Per prompt, draw and group: ‖S‖², S · S_p, Σ‖u‖² and the count from explicit sums over the rows coded g
    (the largest group, whose sum the kernel takes as S_p minus the others, varies by draw); two draws that code
    every row alike give bitwise equal results. At d = 4096 a prompt spans several of the kernel's row blocks
    (BLOCK_BYTES: 16 float64 or 32 float32 rows) and the draws several of its chunks (BLOCK_DRAWS) and passes
    (DRAWS_PER_PASS), the last of each partial."""
    rng = np.random.default_rng(4)
    n_rows = sum(sizes) + 6
    U = rng.normal(size=(n_rows, d)).astype(dtype)
    idx = rng.permutation(n_rows)[:sum(sizes)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    P, G = len(sizes), 4
    if d > 9:
        assert max(sizes) * d * U.itemsize > 2 * kernels.BLOCK_BYTES and b > kernels.BLOCK_DRAWS
    codes = rng.integers(0, G, size=(b, sum(sizes))).astype(np.int16)
    codes[5] = codes[2]
    out = [np.zeros((P, b, G)) for _ in range(4)]
    kernels.permuted_cell_dots(U, np.full(len(U), U.shape[1]), idx, bounds, codes, *out)
    sq, tot, q, cnt = out
    for p in range(P):
        rows = np.arange(bounds[p], bounds[p + 1])
        Sp = U[idx[rows]].astype(np.float64).sum(axis=0)
        for t in range(b):
            for g in range(G):
                mine = rows[codes[t, rows] == g]
                S = U[idx[mine]].astype(np.float64).sum(axis=0)
                assert sq[p, t, g] == pytest.approx(S @ S, rel=1e-5, abs=1e-5)
                assert tot[p, t, g] == pytest.approx(S @ Sp, rel=1e-5, abs=1e-5)
                assert q[p, t, g] == pytest.approx((U[idx[mine]].astype(np.float64) ** 2).sum(), rel=1e-9)
                assert cnt[p, t, g] == len(mine)
    for x in out:
        assert (x[:, 5] == x[:, 2]).all()


def test_shared_bounding_box_is_the_tight_one():
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    from biasaudit.pipeline.outputs import tight_bbox

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter(np.arange(50), np.arange(50) ** 2, rasterized=True)
    ax.set(title="a title that sticks out", xlabel="x label", ylabel="y label")
    fig.legend(["points"], loc="center right")
    sizes = []
    for bbox in ("tight", tight_bbox(fig, 150)):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=150, bbox_inches=bbox)
        sizes.append(Image.open(io.BytesIO(buf.getvalue())).size)
    plt.close(fig)
    assert sizes[0] == sizes[1]


def _sample_figure():
    """A figure laid out by tight_layout, with a figure legend and rasterised points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from biasaudit.pipeline.outputs import Figure

    fig, axes = plt.subplots(1, 2, figsize=(5, 3))
    for ax in axes:
        ax.scatter(np.arange(50), np.arange(50) ** 2, rasterized=True)
        ax.plot(np.arange(50), np.sqrt(np.arange(50)), label="a line")
        ax.set(title="a title that sticks out", xlabel="x label", ylabel="y label")
    fig.legend(loc="center right")
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    return Figure(fig, "title", "caption")


def _written(out) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _results():
    from biasaudit.pipeline.outputs import Result

    table = pd.DataFrame({"a": [1.23456, np.nan, 3.0], "b": ["x", "y", "z"]})
    return [Result(f"s{k}", "section", tables={f"t{k}": table}, plots={f"p{k}": table},
                   figures={f"f{k}": _sample_figure()}) for k in range(3)]


def test_a_figure_laid_out_by_tight_layout_is_measured_once_for_png_and_svg(tmp_path):
    """tight_layout() leaves a placeholder layout engine, with which savefig measures the figure again for every
    format; the writer drops it and cuts both formats by one box (tight_bbox): the PNG is the bytes of savefig's
    own bbox_inches="tight", the SVG the same elements and text, its page within two of the PNG's pixels of
    the box that the SVG renderer would have measured."""
    import io
    import re

    import matplotlib.pyplot as plt

    from biasaudit.pipeline.outputs import OutputWriter, Result

    writer = OutputWriter(tmp_path, dpi=60)
    writer.add(Result("s", "section", figures={"f": _sample_figure()}))
    writer.finish()
    fig = _sample_figure().fig
    assert fig.get_layout_engine() is not None  # the placeholder
    direct = {}
    for ext in ("png", "svg"):
        buf = io.BytesIO()
        with plt.rc_context({"svg.hashsalt": "biasaudit"}):
            fig.savefig(buf, format=ext, dpi=60, bbox_inches="tight", metadata={"Date": None} if ext == "svg" else None)
        direct[ext] = buf.getvalue()
    plt.close(fig)
    assert (tmp_path / "figures" / "f.png").read_bytes() == direct["png"]
    from biasaudit.pipeline.outputs import tight_bbox

    again = _sample_figure().fig
    assert not isinstance(tight_bbox(again, 60), str) and again.get_layout_engine() is None  # one box, no engine
    plt.close(again)

    def numbers(svg: bytes) -> tuple[str, list[float]]:
        text = re.sub(r'id="[^"]*"|#[A-Za-z_][\w-]*|base64,[^"]+', "", svg.decode())  # hashed ids, rasters
        rx = r"(?<![\w#])-?\d+(?:\.\d+)?(?:e-?\d+)?"
        return re.sub(rx, "N", text), [float(x) for x in re.findall(rx, text)]

    (a, xa), (b, xb) = numbers(direct["svg"]), numbers((tmp_path / "figures" / "f.svg").read_bytes())
    assert a == b and len(xa) == len(xb)
    assert max(abs(x - y) for x, y in zip(xa, xb)) <= 2 * 72 / 60  # points: two of the PNG's pixels


@pytest.mark.skipif(not FORKS, reason="the writer's child processes fork: Linux only")
def test_sections_written_by_child_processes_are_the_bytes_written_in_process(tmp_path):
    """OutputWriter(processes=2) forks a child per section: the same tables, plots, PNG and SVG bytes and the same
    manifest as written in process, with more sections than processes (the writer waits for one to fork the next)."""
    from biasaudit.pipeline.outputs import OutputWriter

    written = {}
    for processes in (0, 2):
        writer = OutputWriter(tmp_path / str(processes), dpi=60, processes=processes)
        for result in _results():
            writer.add(result)
        writer.finish()
        written[processes] = _written(tmp_path / str(processes))
    assert {n.rsplit(".", 1)[1] for n in written[0]} == {"csv", "md", "png", "svg", "json"}
    assert written[0] == written[2]


@pytest.mark.skipif(not FORKS, reason="the writer's child processes fork: Linux only")
def test_a_section_that_fails_in_its_child_process_fails_the_writer(tmp_path, monkeypatch):
    from biasaudit.pipeline import outputs

    def broken(df, digits=3):
        raise ValueError("cannot write this table")

    monkeypatch.setattr(outputs, "to_markdown", broken)
    writer = outputs.OutputWriter(tmp_path, dpi=60, processes=2)
    writer.add(_results()[0])
    with pytest.raises(RuntimeError, match="(?s)'s0' failed in its process.*ValueError: cannot write this table"):
        writer.finish()
    assert not writer._children  # every child reaped


@pytest.mark.parametrize("bad", ["group", "cluster", "cell"])
def test_codes_out_of_range_are_refused_not_written(bad):
    """The compiled loop has no bounds check: a code past the cells would write outside S (or into another
    labelling's cells), so every entry point refuses it with the range."""
    X = np.ones((10, 3), np.float32)
    g, c = np.zeros(10, int), np.zeros(10, int)
    if bad == "group":
        g[4] = 2  # G = 2: the next prompt's cell, inside S
    elif bad == "cluster":
        c[4] = 10_000_000
    else:
        g[4] = 50_000_000
    with pytest.raises(ValueError, match="out of range"):
        if bad == "cell":
            H.one_pass(X, g, 2)
        else:
            H.cell_sums_many(X, [g], c, [2], 3)


def test_block_size_follows_the_row_order_and_does_not_change_the_sums():
    rng = np.random.default_rng(11)
    N, d = 2000, 5
    grouped = (np.arange(N) // 20 * 3 + rng.integers(0, 3, N))[:, None]  # 100 prompts × 3 groups, rows by prompt
    shuffled = grouped[rng.permutation(N)]
    assert kernels.block_rows(grouped) == kernels.BLOCK and kernels.block_rows(shuffled) == 1
    assert kernels.block_rows(np.zeros((10, 1), np.int64)) == 1  # fewer rows than a block
    X = rng.normal(size=(N, d))
    X[7] = 0
    out = []
    for block in (1, 7, kernels.BLOCK):
        S, n, q, scale = np.zeros((300, d)), np.zeros(300), np.zeros(300), np.zeros(N)
        kernels.accumulate_cell_sums(X, shuffled, True, S, n, q, scale, block)
        out.append((S, n, q, scale))
    for got in out[1:]:
        for a, b in zip(out[0], got):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_blocked_path_with_an_odd_chunk_and_an_unusable_block_equals_direct_sums():
    """Rows grouped by prompt (so blocks of 64 merge), chunks of 100 (blocks straddle chunks), a whole block of
    zero rows and a non-finite row: every cell equals the direct sum of its usable unit rows."""
    rng = np.random.default_rng(12)
    N, d, P, G = 700, 4, 14, 3
    prompts = np.repeat(np.arange(P), N // P)
    groups = rng.integers(-1, G, size=N)
    X = rng.normal(size=(N, d)).astype(np.float32)
    X[128:192] = 0  # one whole block unusable
    X[300, 1] = np.inf
    cell = np.where(groups >= 0, prompts * G + groups, -1)[:, None]
    assert kernels.block_rows(cell) == kernels.BLOCK
    (S, n, q), = H.cell_sums_many(X, [groups], prompts, [G], P, chunk=100)
    usable = np.isfinite(X).all(axis=1) & (np.abs(X).sum(axis=1) > 0)
    for p in range(P):
        for g in range(G):
            rows = np.flatnonzero((prompts == p) & (groups == g) & usable)
            unit = X[rows].astype(np.float64) / np.linalg.norm(X[rows].astype(np.float64), axis=1, keepdims=True)
            np.testing.assert_allclose(S[p, g], unit.sum(axis=0), atol=1e-9)
            assert n[p, g] == len(rows)


def test_the_writer_clears_a_killed_writers_temporaries_and_writes_in_process_when_fork_fails(tmp_path, monkeypatch):
    """A stage killed while its children wrote leaves `.name.svg.xyz.tmp` files in a DVC output (persisted between
    runs): the next writer removes them. A fork that fails (no memory, no process left) writes in process."""
    from biasaudit.pipeline import outputs

    stale = tmp_path / "figures" / ".f0.svg.2kpe381u.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_text("half a figure")

    def no_fork():
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(outputs, "fork_tied", no_fork)
    writer = outputs.OutputWriter(tmp_path, dpi=60, processes=2)
    assert not stale.exists()
    for result in _results():
        writer.add(result)
    writer.finish()
    written = _written(tmp_path)
    assert {n.rsplit(".", 1)[1] for n in written} == {"csv", "md", "png", "svg", "json"}
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_markdown_table_may_repeat_a_column_name():
    from biasaudit.pipeline.outputs import to_markdown

    text = to_markdown(pd.DataFrame([[0.1, -0.0001, "x"]], columns=["a", "a", "s"]))
    assert text.splitlines()[2].replace(" ", "") == "|0.1|0|x|"
