"""The quick starts of the README and docs/your-data.md, run as written: their code blocks are read from the
markdown (a YAML block is merged into params.yaml, as the text tells; each line of a bash block runs in a
fresh copy of the repository), with a local server on the port a block names where it names a hosted API.
`biasaudit check` must fail a folder generator paired with the SIMULATED classifier, naming the fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from .conftest import ROOT

DOCS = (ROOT / "README.md", ROOT / "docs" / "your-data.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
TITLE = re.compile(r"^\*\*(.+?)\*\*", re.M)


def quick_starts(md: Path) -> dict[str, list[tuple[str, str]]]:
    """Title (the bold lead of a paragraph) → its code blocks (language, text), in the README's "Quick starts"
    section or anywhere in another chapter; a block belongs to the last bold lead before it."""
    text = md.read_text()
    if md.name == "README.md":
        text = text.split("## Quick starts", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[tuple[str, str]]] = {}
    for fence in FENCE.finditer(text):
        leads = TITLE.findall(text[:fence.start()])
        if leads:
            out.setdefault(leads[-1], []).append((fence.group(1), fence.group(2)))
    return out


def block(md: Path, title: str, lang: str, k: int = 0) -> str:
    return [b for lg, b in quick_starts(md)[title] if lg == lang][k]


def lead(md: Path, title: str) -> str:
    """The text of a quick start from its bold lead to its first code block."""
    text = md.read_text()
    return text.split(f"**{title}**", 1)[1].split("```", 1)[0]


# every quick start with code, and the test that runs it (a new one without a test fails the first test)
RUN_BY = {
    ("README.md", "The published setup, and today's models."): "test_published_setup_quick_start",
    ("README.md", "Audit your own images (Method A)."): "test_own_images_quick_start",
    ("README.md", "Audit your own VLM behind an OpenAI-compatible server (Method B)."): "test_own_vlm_quick_start",
    ("your-data.md", "Another country's groups."): "test_another_country_quick_start",
}


def test_every_quick_start_with_code_has_its_test():
    found = {(md.name, title) for md in DOCS for title in quick_starts(md)}
    assert found == set(RUN_BY), found ^ set(RUN_BY)
    assert all(name in globals() for name in RUN_BY.values())


def merge(into: dict, extra: dict) -> dict:
    """`extra` merged into `into` key by key (a table entry added, a section's keys set), as the text says."""
    for k, v in extra.items():
        into[k] = merge(dict(into.get(k) or {}), v) if isinstance(v, dict) and isinstance(into.get(k), dict) else v
    return into


REPLACE = re.compile(r"replace\s+`params\.yaml`'s\s+`(\w+):`\s+table", re.I)


def apply_quick(params: Path, quick: dict, text: str) -> None:
    """The quick start's YAML block written into `params`, as its text tells: a table it says to replace
    ("replace `params.yaml`'s `models:` table") replaced whole, every other key merged."""
    replaced = set(REPLACE.findall(text))
    assert replaced <= set(quick), (replaced, set(quick))
    doc = merge(yaml.safe_load(params.read_text()), {k: v for k, v in quick.items() if k not in replaced})
    params.write_text(yaml.safe_dump(doc | {k: quick[k] for k in replaced}, sort_keys=False))


def fresh_copy(dest: Path) -> tuple[Path, dict[str, str]]:
    """The working tree (tracked and new files, no outputs) in a new git repository, with the shared .venv
    (the quick starts call .venv/bin/...) importing the copy's sources."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to((ROOT / ".venv").resolve())
    (dest / "dvc.lock").unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(dest / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0", "DVC_NO_ANALYTICS": "1"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=qs", "-c", "user.email=qs@example.org", "commit", "-qm", "quick start"]):
        subprocess.run(cmd, cwd=dest, check=True, capture_output=True, env=env)
    return dest, env


def run_bash(code: str, cwd: Path, env: dict[str, str], timeout: int = 3000) -> list[subprocess.CompletedProcess]:
    """Each line of a bash block, as written (comments included), in `cwd`."""
    return [subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            for line in code.splitlines() if line.strip()]


def ok(proc: subprocess.CompletedProcess) -> bool:
    assert proc.returncode == 0, f"{proc.args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return True


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# ------------------------------------------------------------------------------------ check: the pairing

def test_check_fails_a_folder_generator_beside_the_simulated_classifier(tmp_path, monkeypatch, capsys):
    from biasaudit.cli import main

    monkeypatch.chdir(tmp_path)
    readme = ROOT / "README.md"
    quick = yaml.safe_load(block(readme, "Audit your own images (Method A).", "yaml"))
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert base["classify"]["vlm"]["backend"] == "simulated"  # the default profile's classifier
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(merge(base, {"models": quick["models"]})))
    assert main(["check", "--params", "params.yaml"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("  - models.mine"))
    assert "classify.vlm.backend 'simulated'" in line and "no planted label" in line
    assert "Fix: set classify.vlm to a classifier that looks at the images" in line
    assert "models.planted-a" not in out  # planted images carry their label: no complaint
    # the quick start as written (with its classifier): no pairing complaint
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(merge(base, quick)))
    main(["check", "--params", "params.yaml"])
    assert "cannot be classified" not in capsys.readouterr().out


# ------------------------------------------------------------------------------------ the quick starts

@pytest.mark.slow
def test_published_setup_quick_start(tmp_path):
    """Its first two lines as written: the switch, then `check` listing each missing weight, key and server
    with its fix. The last two (fetching weights, running hosted models) need the network and are not run."""
    repo, env = fresh_copy(tmp_path / "repo")
    lines = [x for x in block(ROOT / "README.md", "The published setup, and today's models.", "bash").splitlines()]
    assert lines[2].startswith(".venv/bin/biasaudit weights fetch") and lines[3].startswith(".venv/bin/dvc repro")
    switch, check = run_bash("\n".join(lines[:2]), repo, env)
    assert ok(switch) and yaml.safe_load((repo / "params.yaml").read_text())["profile"] == "current"
    assert check.returncode == 1, check.stdout + check.stderr
    missing = [x for x in check.stdout.splitlines() if x.startswith("  - ")]
    assert missing and all(": " in x.split(")", 1)[-1] for x in missing)  # each with its fix
    assert any("GEMINI_API_KEY" in x for x in missing)


@pytest.mark.slow
def test_another_country_quick_start(tmp_path):
    repo, env = fresh_copy(tmp_path / "repo")
    code = block(ROOT / "docs" / "your-data.md", "Another country's groups.", "bash")
    *setup, last = [x for x in code.splitlines() if x.strip()]
    for proc in run_bash("\n".join(setup), repo, env):
        ok(proc)
    assert last.startswith(".venv/bin/dvc repro")
    assert yaml.safe_load((repo / "params.yaml").read_text())["profile"] == "offline-ca-vm"


# per label of the local server (servers_vlm.LABELS: mean grey 0–50, 51–101, …, 204–255), the skin L* targets
# whose packaged-photo variants land inside its bin, tried in turn
L_TRIES = {0: (15.0, 20.0), 1: (50.0, 55.0, 60.0), 2: (70.0, 75.0), 3: (82.0, 85.0, 88.0), 4: (92.0, 94.0, 96.0, 98.0)}
MARGIN = 5.0  # grey levels from a bin's edge: JPEG re-encoding before sending moves a mean far less


def face_photo(label: int, start: int) -> np.ndarray:
    """A real face whose mean grey lies `MARGIN` inside the server's bin of `label`: the packaged-photos producer's
    seeded variant (packaged_photos.make_variant: a crop of a public-domain portrait keeping the whole face, its
    lightness shifted to a target skin L*), the first seed from `start` and target L* that lands there."""
    from biasaudit.backends.generators.packaged_photos import make_variant

    lo, hi = 51.0 * label, 51.0 * label + 50.0 if label < 4 else 255.0
    for seed in range(start, start + 50):
        for target in L_TRIES[label]:
            rgb, _ = make_variant(seed, 160, 160, (target, target))
            grey = float(np.asarray(Image.fromarray(rgb).convert("L"), dtype=float).mean())
            if lo + MARGIN <= grey <= hi - MARGIN:
                return rgb
    raise AssertionError(f"no packaged-photo variant lands in grey bin {label}")


def own_images(repo: Path, mapping_csv: Path, folder: Path) -> dict[tuple[str, int], str]:
    """Face photos, generate.images_per_prompt for every prompt of the copy's prompts table (as the quick start
    asks): eight distinct faces per server label (four variants and their mirror images), the labels taking turns
    over prompts and indices. (prompt_id, index) → the label the local server answers for that image
    (servers_vlm.label_for_pixels of the file)."""
    from .servers_vlm import label_for_pixels

    per_prompt = int(yaml.safe_load((repo / "params.yaml").read_text())["generate"]["images_per_prompt"])
    ids = pd.read_csv(repo / "data" / "t2i" / "prompts.csv")["prompt_id"].astype(str).tolist()
    variants = {j: [face_photo(j, 100 * (4 * j + v)) for v in range(4)] for j in range(5)}
    variants = {j: faces + [f[:, ::-1] for f in faces] for j, faces in variants.items()}
    folder.mkdir(parents=True, exist_ok=True)
    rows, truth = [], {}
    for i, pid in enumerate(ids):
        for k in range(per_prompt):
            j = (i + k) % 5
            name = f"{pid}_{k}.png"
            img = Image.fromarray(np.ascontiguousarray(variants[j][(i * per_prompt + k) // 5 % 8]))
            img.save(folder / name)
            rows.append({"file": name, "prompt_id": pid, "index": k})
            truth[(pid, k)] = label_for_pixels(img)
    pd.DataFrame(rows).to_csv(mapping_csv, index=False)
    assert len(set(truth.values())) == 5  # every answer the server can give, on real faces
    return truth


@pytest.mark.slow
@pytest.mark.timeout(2400)  # Method A's stages for the user's generator alone (the quick start replaces the table)
def test_own_images_quick_start(tmp_path):
    from .servers_vlm import VLMServer

    if not port_free(8000):
        pytest.skip("port 8000 (the quick start's server) is taken")
    repo, env = fresh_copy(tmp_path / "repo")
    ok(subprocess.run([".venv/bin/dvc", "repro", "prompts"], cwd=repo, env=env, capture_output=True, text=True))
    title = "Audit your own images (Method A)."
    quick = yaml.safe_load(block(ROOT / "README.md", title, "yaml"))
    spec = quick["models"]["mine"]
    truth = own_images(repo, repo / spec["mapping_csv"], repo / spec["folder"])
    params = repo / "params.yaml"
    apply_quick(params, quick, lead(ROOT / "README.md", title))
    assert list(yaml.safe_load(params.read_text())["models"]) == ["mine"]  # the text replaces the planted ones
    with VLMServer(port=8000):
        check, repro = run_bash(block(ROOT / "README.md", title, "bash"), repo, env)
        assert ok(check) and ok(repro)
    labels = pd.read_parquet(repo / "data" / "t2i" / "labels" / "mine.parquet")
    got = labels.drop_duplicates("image_id").set_index("image_id")
    assert (got["status"] == "ok").all(), got["status"].value_counts()
    made = pd.read_parquet(repo / "data" / "t2i" / "images" / "mine" / "manifest.parquet")  # image_id per mapped file
    assert {(r.prompt_id, r.index): got.loc[r.image_id, "label"] for r in made.itertuples()} == truth
    faces = pd.read_parquet(repo / "data" / "t2i" / "faces" / "mine.parquet")
    assert (faces["status"] == "ok").all(), faces["status"].value_counts()  # real faces: every one found
    per_prompt = pd.read_csv(repo / "reports" / "t2i" / "tables" / "tvd_per_prompt.csv")
    assert "mine" in set(per_prompt["model"])


@pytest.mark.slow
@pytest.mark.timeout(2400)  # Method B's stages for the user's VLM alone (the quick start replaces the table)
def test_own_vlm_quick_start(tmp_path):
    from .test_vlm_reflect import ScriptedChat

    if not port_free(8000):
        pytest.skip("port 8000 (the quick start's server) is taken")
    repo, env = fresh_copy(tmp_path / "repo")
    title = "Audit your own VLM behind an OpenAI-compatible server (Method B)."
    quick = yaml.safe_load(block(ROOT / "README.md", title, "yaml"))
    params = repo / "params.yaml"
    apply_quick(params, quick, lead(ROOT / "README.md", title))
    server = ScriptedChat()
    server.port = 8000
    server.model_routes("openai")
    with server:
        check, repro = run_bash(block(ROOT / "README.md", title, "bash"), repo, {**env, "MY_KEY": "local-test-key"})
        assert ok(check) and ok(repro)
    assert list(yaml.safe_load(params.read_text())["vlms"]) == ["my-vlm"]  # the text replaces the stand-ins
    answers = pd.read_parquet(repo / "data" / "vlm" / "responses" / "my-vlm.parquet")
    assert len(answers) and (answers["status"] == "ok").mean() > 0.5, answers["status"].value_counts()
    assert "local-test-key" not in params.read_text()
