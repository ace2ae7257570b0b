"""The biasaudit command: `check` (offline passes; paper lists every missing weight, key and server in
one run and exits non-zero), `weights list|verify`, `profile`, and `python -m biasaudit`."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from biasaudit import cli, weights

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("GEMINI_API_KEY", "OPENAI_API_KEY", "GOOGLE_API_KEY", "DASHSCOPE_API_KEY", "VLLM_API_KEY", "HF_TOKEN")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A sandbox with this repository's params and profiles and no models/ folder."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.insightface
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_check_offline_passes(repo, capsys):
    assert cli.main(["check"]) == 0
    assert "valid (profile offline)" in capsys.readouterr().out


def test_check_paper_lists_everything_missing_in_one_run(repo, capsys):
    assert cli.main(["check", "--profile", "paper"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  - ")]
    expected = ["models/sd35-large-turbo/model_index.json", "models/flux-schnell/model_index.json",
                "models/insightface/models/buffalo_l", "models/bisenet/79999_iter.pth",
                "models/clip-vit-h-14/open_clip_model.safetensors", "GEMINI_API_KEY", "OPENAI_API_KEY",
                "GOOGLE_API_KEY", "DASHSCOPE_API_KEY", "http://localhost:8000/v1", "http://localhost:8001/v1",
                "data/vlm/source_photos", "data/t2i/annotations/rater1.csv", "data/t2i/annotations/rater2.csv",
                "data/vlm/realism/rater1.csv", "data/vlm/realism/rater2.csv", "data/vlm/realism/identity/rater1.csv",
                "data/vlm/realism/identity/rater2.csv",
                "retired model imagen-4.0-fast-generate-001"]  # its quoted shutdown date, 2026-08-17, has passed
    for item in expected:
        assert sum(item in line for line in lines) == 1, item  # one line per missing item
    assert len(lines) == len(expected)
    assert all(": " in line and ("biasaudit weights fetch" in line or "export " in line or "start the server" in line
                                 or "put " in line or "its replacement is" in line) for line in lines)  # each with its fix
    assert "HF_TOKEN" in next(line for line in lines if "sd35" in line)  # the gating step
    sheet = next(line for line in lines if "rater1.csv" in line)  # the human raters' sheets: how to make them
    assert "missing input" in sheet and "data/t2i/annotations/annotation_sheet.csv" in sheet and "docs/raters.md" in sheet
    assert (repo / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()  # --profile switches nothing


# Issue #46, from the providers' own pages (an oracle independent of data/reference/models/lifecycle.yaml): Google's
# changelog of 2026-09-18 says gemini-2.5-flash and gemini-2.5-pro "are not deprecated and continue to be served …
# until further notice"; their "retired 2026-12-01" comes from a third-party blog. So both are unconfirmed, and
# `check` cites both pages. Firebase's Imagen migration guide says "All Imagen models are deprecated and will shut
# down as early as August 17, 2026.": a quoted provider page, a date that has passed, so Imagen 4 Fast is retired.
CHANGELOG = ("https://ai.google.dev/gemini-api/docs/changelog", "2026-09-18",
             "are not deprecated and continue to be served … until further notice")
THIRD_PARTY = "https://dev.to/aideprecations"


def test_check_names_the_unconfirmed_models_of_the_paper_with_both_pages(repo, capsys):
    assert cli.main(["check", "--profile", "paper"]) == 1  # weights, keys, servers and inputs are missing (docs)
    captured = capsys.readouterr()
    retired = [line for line in captured.out.splitlines() if "retired model" in line]
    assert len(retired) == 1 and "imagen-4.0-fast-generate-001" in retired[0], retired  # the one quoted retirement
    assert "as early as August 17, 2026" in retired[0] and "firebase.google.com" in retired[0]
    warned = [line for line in captured.err.splitlines() if line.startswith("warning: ") and " unconfirmed: " in line]
    for model in ("gemini-2.5-flash", "gemini-2.5-pro"):
        line = next(x for x in warned if f": {model} (Google) unconfirmed: " in x)
        assert "claimed retired on 2026-12-01" in line and THIRD_PARTY in line and "third-party page" in line, line
        assert all(part in line for part in CHANGELOG), line
    assert "gemini-2.5-flash-image (Google) unconfirmed: " in captured.err
    assert "gemini-2.5-flash-image → " not in captured.err and "no replacement named" in captured.err
    imagen = retired[0]  # the chain Google documents, in order
    assert imagen.index("→ gemini-3.1-flash-image") < imagen.index("→ gemini-nano-banana-2.1 "), imagen
    assert cli.main(["check", "--profile", "current"]) == 1  # keys and weights are missing here too
    captured = capsys.readouterr()
    assert "retired" not in captured.out and "note: deprecated" not in captured.err
    assert "claimed retired" not in captured.err and "claimed deprecated" not in captured.err


def test_a_value_the_model_rejects_is_refused_naming_the_allowed_ones(repo, capsys):
    """gpt-6.1-sol takes reasoning_effort low and up, gemini-3.8-flash thinking_level LOW, MEDIUM or HIGH (issue
    #46): `minimal` / `MINIMAL` would fail every request; check refuses them before any, exit 2."""
    text = (repo / "profiles/current.yaml").read_text()
    assert "reasoning_effort: low}" in text and "thinking_level: LOW," in text
    (repo / "profiles/current.yaml").write_text(text.replace("reasoning_effort: low}", "reasoning_effort: minimal}")
                                                .replace("thinking_level: LOW,", "thinking_level: MINIMAL,"))
    before = (repo / "params.yaml").read_text()
    assert cli.main(["check", "--profile", "current"]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "vlms.gpt-6.1-sol.reasoning_effort" in x)
    assert "accepts low, medium, high, not 'minimal'" in line and "https://developers.openai.com/" in line
    line = next(x for x in err.splitlines() if "vlms.gemini-3.8-flash.thinking_level" in x)
    assert "accepts LOW, MEDIUM, HIGH, not 'MINIMAL'" in line
    assert (repo / "params.yaml").read_text() == before
    from biasaudit import check

    assert cli.main(["profile", "current", "--no-stash"]) == 0  # the check stage refuses it too, touching nothing
    assert check.main(["params.yaml", str(repo / "data/check")]) == 2
    assert "vlms.gpt-6.1-sol.reasoning_effort" in capsys.readouterr().err and not (repo / "data/check").exists()
    from biasaudit.report.execute import preflight

    blocked = preflight("reflect@gpt-6.1-sol")  # the stage itself, run alone (dvc repro -s), stops before its notebook
    assert "vlms.gpt-6.1-sol.reasoning_effort" in blocked and "accepts low, medium, high" in blocked
    assert "reasoning_effort" not in preflight("reflect@qwen3-vl-plus")  # another stage is not blocked by it


def test_check_one_stage_and_keys_from_the_environment(repo, capsys, monkeypatch):
    assert cli.main(["check", "--profile", "paper", "--stage", "reflect@gpt-5"]) == 1
    assert "OPENAI_API_KEY" in capsys.readouterr().out
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    assert cli.main(["check", "--profile", "paper", "--stage", "reflect@gpt-5"]) == 0
    assert cli.main(["check", "--profile", "paper", "--stage", "classify@flux-schnell"]) == 1


def test_check_invalid_params_exit_2(repo, capsys):
    text = (repo / "params.yaml").read_text().replace("  top_k:", "  top_kk:", 1)
    (repo / "params.yaml").write_text(text)
    assert cli.main(["check"]) == 2
    assert "top_kk" in capsys.readouterr().err


def test_weights_list_paper_shows_sources_sizes_licences(repo, capsys):
    assert cli.main(["weights", "list", "--profile", "paper"]) == 0
    out = capsys.readouterr().out
    for w in ("sd35-large-turbo", "flux-schnell", "clip-vit-h-14", "insightface-buffalo_l", "bisenet-face-parsing",
              "llama-3.2-90b-vision"):
        block = out.split(f"{w}: ", 1)[1].split("\n  path:", 1)[0]
        assert "source:" in block and " GB" in block and "licence:" in block, w
    assert "hf:stabilityai/stable-diffusion-3.5-large-turbo@" in out and "buffalo_l.zip" in out
    vlms = ("gemini-2.5-pro", "gpt-5", "llama-3.2-90b-vision", "qwen3-vl-plus", "deepseek-vl2")
    assert all(f"\n{v}: " in "\n" + out for v in vlms)  # the paper's five VLMs, served or hosted
    assert "--tensor-parallel-size 4" in out and "--max-model-len" in out and "European Union" in out
    assert cli.main(["weights", "list"]) == 0  # offline profile without --profile: the whole table
    assert cli.main(["weights", "list", "--needed"]) == 0
    assert "no model weights needed" in capsys.readouterr().out.splitlines()[-1]


def test_weights_verify_against_the_lock(repo, capsys):
    w = weights.BY_NAME["bisenet-face-parsing"]
    assert cli.main(["weights", "verify", "--only", w.name]) == 1
    path = repo / w.local_path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"checkpoint bytes")
    assert weights.verify(w)[0] is False and "not in" in weights.verify(w)[1]  # present, never fetched
    lock = {w.name: {"commit": "c0ffee", "files": {"79999_iter.pth": weights.sha256_path(path)}}}
    (repo / "models" / "weights.lock.json").write_text(json.dumps(lock))
    assert cli.main(["weights", "verify", "--only", w.name]) == 0
    path.write_bytes(b"corrupted")
    ok, message = weights.verify(w)
    assert not ok and "sha256 mismatch" in message
    capsys.readouterr()


def test_profile_switch_and_python_m(repo):
    assert cli.main(["profile", "paper"]) == 0
    assert "profile: paper" in (repo / "params.yaml").read_text()
    assert cli.main(["profile", "offline"]) == 0
    from biasaudit.config import load_params

    assert load_params(repo / "params.yaml") == load_params(ROOT / "params.yaml")
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(repo), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "biasaudit", "check"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_fetch_zip_records_checksums_and_verify_checks_them(repo):
    """The model-zoo path end to end through urllib (a file:// URL stands in for the release URL)."""
    import hashlib
    import zipfile
    from dataclasses import replace

    archive = repo / "buffalo_l.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("det_10g.onnx", b"detector bytes")
        zf.writestr("w600k_r50.onnx", b"recogniser bytes")
    w = replace(weights.BY_NAME["insightface-buffalo_l"], source=archive.as_uri())
    lock = repo / "models" / "weights.lock.json"
    with pytest.raises(ValueError, match="not the pinned"):  # the real pin: these bytes are not buffalo_l.zip
        weights.fetch(w, lock_path=lock)
    assert not list((repo / w.local_path).glob("*.onnx"))  # nothing unchecked was extracted
    w = replace(w, sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    entry = weights.fetch(w, lock_path=lock)
    assert entry["files"] == {"det_10g.onnx": hashlib.sha256(b"detector bytes").hexdigest(),
                              "w600k_r50.onnx": hashlib.sha256(b"recogniser bytes").hexdigest()}
    assert weights.verify(w, lock)[0]
    (repo / w.local_path / "det_10g.onnx").write_bytes(b"tampered")
    assert "sha256 mismatch" in weights.verify(w, lock)[1]


def test_fetch_hub_repo_pins_the_commit_and_checks_published_sha256(repo, monkeypatch):
    """Our bookkeeping around huggingface_hub (the Hub itself is not reachable here): the commit the
    Hub resolves is locked, every file is checked against the LFS sha256 the Hub publishes."""
    import hashlib
    from types import SimpleNamespace

    import huggingface_hub

    files = {"model_index.json": b"{}", "transformer/diffusion_pytorch_model.safetensors": b"weights"}
    published = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}

    class Api:
        def __init__(self, token=None):
            pass

        def model_info(self, repo_id, revision=None, files_metadata=False, token=None):
            assert files_metadata
            return SimpleNamespace(sha="a" * 40, siblings=[SimpleNamespace(rfilename=n, lfs=SimpleNamespace(sha256=d))
                                                           for n, d in published.items()])

    def snapshot_download(repo_id, revision, local_dir, allow_patterns, token):
        assert revision == "a" * 40
        for name, data in files.items():
            p = Path(local_dir) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    w = weights.BY_NAME["flux-schnell"]
    entry = weights.fetch(w)
    assert entry["commit"] == "a" * 40 and entry["files"] == published
    assert weights.verify(w) == (True, f"2 files verified (commit {'a' * 40})")
    assert "hf:black-forest-labs/FLUX.1-schnell@" + "a" * 40 in weights.format_table(weights.table_rows((w,)))
    files["model_index.json"] = b"corrupted in transit"
    with pytest.raises(ValueError, match="the Hub publishes"):
        weights.fetch(w)


def _run_stage_with_params(tmp_path, monkeypatch, edit, stage: str) -> tuple[int, list[str]]:
    """Run a never-to-run notebook as `stage` under params.yaml changed by `edit` (a function of the raw
    mapping): (exit status, terminal lines). The notebook must not run."""
    import io

    import yaml

    from biasaudit.report import execute

    from .conftest import ROOT

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    edit(raw)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True))
    monkeypatch.chdir(tmp_path)
    term = io.StringIO()
    nb = tmp_path / "never.py"
    nb.write_text("raise SystemExit('the notebook must not run')\n")
    status = execute.run(nb, "never", {}, stage=stage, out_dir=tmp_path / "nb", terminal=term)
    assert not (tmp_path / "nb" / "never.ipynb").exists()
    return status, term.getvalue().splitlines()


def test_a_stage_lacking_its_weights_stops_before_its_notebook_with_the_fix_first(tmp_path, monkeypatch):
    """The runner checks the stage's own needs (biasaudit.weights) before its start line: the first line
    is the cause, the next names the missing weight and its fix; a stage that needs nothing still runs."""
    from biasaudit.report import execute

    def add_sd(raw):
        raw["models"]["sd"] = {"backend": "diffusers", "model_id": "models/sd35-large-turbo", "width": 64, "height": 64}

    status, lines = _run_stage_with_params(tmp_path, monkeypatch, add_sd, "generate@sd")
    assert status == 1
    assert lines[0].startswith("✗ generate@sd: needs 1 thing")  # its cause first: no start line
    assert "missing weight models/sd35-large-turbo" in lines[1] and "biasaudit weights fetch" in lines[1]
    assert execute.missing_needs("generate@planted-a") == []


def test_missing_rater_sheets_are_listed_but_let_reliability_write_the_annotation_sheet(repo, capsys):
    """`check --stage reliability` names each rater's sheet (exit 1), but the stage's preflight does not stop it:
    the stage itself writes the annotation_sheet.csv the raters fill (then stops with its own message)."""
    from biasaudit.report import execute

    assert cli.main(["check", "--profile", "paper", "--stage", "reliability"]) == 1
    out = capsys.readouterr().out
    assert "data/t2i/annotations/rater1.csv" in out and "data/t2i/annotations/rater2.csv" in out
    cfg = cli.profile_params("paper", repo / "params.yaml")
    sheets = [n for n in weights.sheet_needs(cfg) if n.stage == "reliability"]
    assert [n.what for n in sheets] == ["data/t2i/annotations/rater1.csv", "data/t2i/annotations/rater2.csv"]
    assert not any(n.blocks_stage for n in sheets)
    from biasaudit.config import apply_profile

    apply_profile("paper", repo / "params.yaml", repo / "profiles")  # the sandbox's params.yaml, as a paper run reads it
    assert execute.missing_needs("reliability") == []  # the stage starts and writes the annotation sheet
    assert any("generate@flux-schnell" in n.stage for n in weights.missing(cfg)) and \
        execute.missing_needs("generate@flux-schnell")  # (a weight still stops its stage)
    offline = cli.profile_params("offline", repo / "params.yaml")
    assert offline.reliability.simulate and [n for n in weights.sheet_needs(offline) if n.stage == "reliability"] == []
    (repo / "data" / "t2i" / "annotations").mkdir(parents=True)
    for rater in ("rater1", "rater2"):
        (repo / "data" / "t2i" / "annotations" / f"{rater}.csv").write_text("item,image_id,model,path,label\n")
    assert weights.missing(cfg, stage="reliability") == []


def test_an_invalid_params_file_is_the_first_line_of_the_stage(tmp_path, monkeypatch):
    """A bad value stops the stage before its start line, naming the key (ParamsError)."""
    status, lines = _run_stage_with_params(tmp_path, monkeypatch, lambda raw: raw["analyze"].update(ci_level=1.5),
                                           "analyze")
    assert status == 1
    assert lines[0].startswith("✗ analyze: ParamsError") and "analyze.ci_level" in lines[0], lines[0]


def test_check_warns_when_a_gpu_has_the_cpu_onnxruntime():
    from biasaudit.gpu_extra import onnxruntime_warning

    cpu_build = ["AzureExecutionProvider", "CPUExecutionProvider"]
    assert "make setup-gpu" in onnxruntime_warning(gpu=True, providers=cpu_build)
    assert onnxruntime_warning(gpu=True, providers=["CUDAExecutionProvider", "CPUExecutionProvider"]) == ""
    assert onnxruntime_warning(gpu=False, providers=cpu_build) == ""  # no GPU: nothing to warn about


def test_an_interrupted_download_resumes_with_a_range_request(tmp_path):
    """A local HTTP server that honours Range: the second call asks only for the missing bytes."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    payload = bytes(range(256)) * 4096  # 1 MiB
    ranges = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            start = int(self.headers.get("Range", "bytes=0-")[6:].rstrip("-") or 0)
            ranges.append(self.headers.get("Range"))
            body = payload[start:]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "pack.zip"
        (tmp_path / "pack.zip.part").write_bytes(payload[:300_000])  # what an interrupted download left
        url = f"http://127.0.0.1:{server.server_port}/pack.zip"
        digest = weights.download_resumable(url, dest, hashlib.sha256(payload).hexdigest())
    finally:
        server.shutdown()
    assert ranges == ["bytes=300000-"] and dest.read_bytes() == payload
    assert digest == hashlib.sha256(payload).hexdigest() and not (tmp_path / "pack.zip.part").exists()


# --- conventions: --version, help and choices on every argument, exit codes, wording ------------------

@pytest.fixture
def project(repo):
    """The sandbox with dvc.yaml too (check --stage validates stage names against it)."""
    shutil.copy(ROOT / "dvc.yaml", repo / "dvc.yaml")
    return repo


def test_version_is_the_package_version(capsys):
    import tomllib

    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"biasaudit {expected}"


def _actions(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield parser.prog, action


def test_every_argument_has_help_and_profiles_are_choices():
    for prog, action in _actions(cli.build_parser()):
        assert action.help, f"{prog} {action.dest}: no help"
        if action.dest in ("profile", "name"):
            assert sorted(action.choices) == sorted(p.stem for p in (ROOT / "profiles").glob("*.yaml")), prog
        if action.dest == "only":
            assert list(action.choices) == [w.name for w in weights.WEIGHTS]


@pytest.mark.parametrize("argv", [
    ["check", "--stage", "nosuch@x"], ["check", "--stage", "faces@nosuch"], ["check", "--profile", "nosuch"],
    ["check", "--params", "nosuch.yaml"], ["weights", "verify", "--only", "nosuch"], ["weights", "nosuch"],
    ["profile", "nosuch"], ["nosuch"], [],
])
def test_usage_errors_exit_2(project, argv, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert "error" in capsys.readouterr().err
    assert (project / "params.yaml").read_text() == (ROOT / "params.yaml").read_text()


def test_one_missing_input_is_one_thing_and_not_a_weight(project, capsys):
    """sources.input_dir (a photo folder) is the only need of `sources` in the paper profile."""
    assert cli.main(["check", "--profile", "paper", "--stage", "sources"]) == 1
    out = capsys.readouterr().out
    assert "but 1 thing it needs is missing:" in out
    line = next(line for line in out.splitlines() if line.startswith("  - "))
    assert line.startswith("  - missing input data/vlm/source_photos"), line
    assert "things" not in out and "weight" not in out


def test_a_stage_that_needs_nothing_says_so(project, capsys):
    assert cli.main(["check", "--stage", "faces@planted-a"]) == 0
    out = capsys.readouterr().out
    assert "needs nothing from outside this repository" in out and "all 0" not in out


def test_the_help_examples_run(project, monkeypatch):
    """Every `biasaudit …` line of the --help text, run as written (in a sandbox): none is a usage
    error (2); 0 or 1 (something missing, listed) are both answers."""
    examples = [line.split("#")[0].split()[1:] for line in cli.build_parser().format_help().splitlines()
                if line.strip().startswith("biasaudit ")]
    assert len(examples) >= 5
    for argv in examples:
        assert cli.main(argv) in (0, 1), argv
    assert "profile: paper" in (project / "params.yaml").read_text()  # the last example switched the copy
