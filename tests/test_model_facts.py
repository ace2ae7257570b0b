"""Model facts with their evidence, and the runs that refuse what cannot be right (issue #46).

- lifecycle.yaml: every entry rests on a page of its provider's own domains; a status that is not `unconfirmed`
  needs that page's own words (a quote); `parse` refuses a status resting on a third-party page or on no quote.
- A deprecated model whose shutdown date has passed is retired (a fixed clock): `check` lists it, and the probe
  stops its stage without a request.
- The probe's last resort: a 400 "Model not exist." to the one-token chat request stops the stage after the
  probe with 0 item requests; a 400 that names a rejected request parameter still counts as served.
- An answer naming no model is recorded as unverified, or stops the stage (execution.require_verified_model).
- Bad input is refused naming the file and key, and nothing changes: an unknown profile, a malformed lifecycle
  file (file and line), a duplicate key in params.yaml (as DVC refuses it), a link out of a photo folder.
"""

from __future__ import annotations

import os
import shutil
from datetime import date
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd
import pytest
import yaml

from biasaudit import cli, lifecycle
from biasaudit.config import ParamsError, load_params, read_yaml, validate
from biasaudit.pipeline.engine import StageStopped
from biasaudit.pipeline.work import UNVERIFIED

from .conftest import ROOT
from .servers_vlm import VLMServer, classify_config, grey_image, grey_manifest
from .test_check_stage import pipeline_copy  # noqa: F401  (the fixture: the pipeline copied, outputs present)

LIFECYCLE = ROOT / lifecycle.LIFECYCLE_FILE

# each provider's own pages (independent of the file's `providers:`): where its statements about its models live
PROVIDER_DOMAINS = {"Google": ("ai.google.dev", "firebase.google.com", "cloud.google.com"),
                    "OpenAI": ("developers.openai.com", "platform.openai.com", "openai.com"),
                    "Alibaba Cloud": ("alibabacloud.com",)}


def _own(url: str, provider: str) -> bool:
    host = urlparse(url).hostname or ""
    return any(host == d or host.endswith("." + d) for d in PROVIDER_DOMAINS[provider])


# --- the file: evidence for every fact ------------------------------------------------------------------

def test_every_entry_cites_a_provider_page_and_every_confirmed_status_its_quote():
    raw = yaml.safe_load(LIFECYCLE.read_text())["models"]
    assert raw, "the lifecycle file lists no model"
    for model, entry in raw.items():
        pages = entry["evidence"]
        assert any(_own(p["url"], entry["provider"]) for p in pages), f"{model}: no page of {entry['provider']}"
        assert all(p["url"].startswith("https://") and p["says"] for p in pages), model
        if entry["status"] == "unconfirmed":  # what is claimed, and what evidence is lacking
            assert entry["claimed"] in ("served", "deprecated", "retired") and entry["missing"].strip(), model
        else:
            assert any(p.get("quote") and _own(p["url"], entry["provider"]) for p in pages), model
        for step in entry.get("replacements") or []:
            assert step["model"] and step["url"].startswith("https://") and step["says"], model
    table = lifecycle.table(LIFECYCLE)
    assert set(table) == set(raw)


def test_the_two_gemini_2_5_models_are_unconfirmed_citing_the_changelog_and_the_blog():
    """Issue #46: Google's changelog of 2026-09-18 says they "are not deprecated and continue to be served …
    until further notice"; the date 2026-12-01 comes from a third-party blog."""
    table = lifecycle.table(LIFECYCLE)
    for model in ("gemini-2.5-flash", "gemini-2.5-pro"):
        entry = table[model]
        assert (entry.status, entry.claimed, entry.date) == ("unconfirmed", "retired", "2026-12-01")
        own = [e for e in entry.evidence if not e.third_party]
        assert [(e.url, e.page_date, e.quote) for e in own] == [
            ("https://ai.google.dev/gemini-api/docs/changelog", "2026-09-18",
             "are not deprecated and continue to be served … until further notice")]
        assert [e.url for e in entry.evidence if e.third_party] == ["https://dev.to/aideprecations"]


def test_each_replacement_is_the_chain_its_provider_documents():
    table = lifecycle.table(LIFECYCLE)
    imagen = table["imagen-4.0-fast-generate-001"]
    assert [s.model for s in imagen.replacements] == ["gemini-3.1-flash-image", "gemini-nano-banana-2.1"]
    assert "MINIMAL" in imagen.replacements[0].says and "imagen-models-migration" in imagen.replacements[0].url
    assert imagen.replacements[1].page_date == "2026-10-06" and "changelog" in imagen.replacements[1].url
    assert table["gemini-2.5-flash-image"].replacements == () and table["gemini-2.5-flash-image"].replacement == ""


def _entry(**over):
    entry = {"provider": "P", "status": "retired", "date": "2026-01-01",
             "evidence": [{"url": "https://docs.p.example/deprecations", "says": "shut down", "quote": "shut down"}]}
    return {"providers": {"P": ["p.example"]}, "models": {"m": entry | over}}


@pytest.mark.parametrize("over, message", [
    ({"evidence": [{"url": "https://docs.p.example/x", "says": "shut down"}]}, "needs a quote from a page of P"),
    ({"evidence": [{"url": "https://blog.example/x", "says": "gone", "quote": "gone"}]}, "needs a quote from a page of P"),
    ({"status": "unconfirmed", "claimed": "retired"}, "models.m.missing is required"),
    ({"status": "unconfirmed", "missing": "a quote"}, "models.m.claimed must be one of"),
    ({"evidence": []}, "models.m.evidence is required"),
    ({"evidence": [{"url": "http://docs.p.example/x", "says": "s", "quote": "q"}]}, r"evidence\[0\].url"),
    ({"date": ""}, "models.m.date is required"),
    ({"provider": "Q"}, "models.m.provider"),
])
def test_parse_refuses_a_fact_without_its_evidence(over, message):
    assert lifecycle.parse(_entry())["m"].status == "retired"  # the unchanged entry is valid
    with pytest.raises(lifecycle.LifecycleError, match=message) as refused:
        lifecycle.parse(_entry(**over), "data/reference/models/lifecycle.yaml")
    assert str(refused.value).startswith("data/reference/models/lifecycle.yaml: ")


# --- dates against today's (a fixed clock) --------------------------------------------------------------

@pytest.fixture
def own_lifecycle(tmp_path, monkeypatch):
    """A working directory whose data/reference/models/lifecycle.yaml is written by the test."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / lifecycle.LIFECYCLE_FILE
    path.parent.mkdir(parents=True)

    def write(text: str) -> Path:
        path.write_text(text)
        os.utime(path, ns=(1, len(text) * 1000 + 7))  # a new mtime per content (the table is cached by it)
        return path
    return write


DEPRECATED = """providers: {OpenAI: [developers.openai.com]}
models:
  gpt-old:
    provider: OpenAI
    status: deprecated
    date: 2026-12-11
    evidence:
      - {url: "https://developers.openai.com/api/docs/deprecations", page_date: 2026-06-11,
         quote: "shutdown date 2026-12-11", says: "shutdown 2026-12-11"}
    replacements:
      - {model: gpt-new, url: "https://developers.openai.com/api/docs/deprecations", says: "use gpt-new"}
"""


@pytest.mark.parametrize("today, status", [(date(2026, 12, 10), "deprecated"), (date(2026, 12, 11), "retired"),
                                           (date(2027, 1, 5), "retired")])
def test_a_shutdown_date_that_has_passed_makes_a_deprecated_model_retired(own_lifecycle, monkeypatch, today, status):
    own_lifecycle(DEPRECATED)
    monkeypatch.setattr(lifecycle, "today", lambda: today)
    found = lifecycle.status_of("gpt-old")
    assert found.status == "deprecated" and found.effective() == status
    from biasaudit import weights

    raw = read_yaml(ROOT / "params.yaml")
    raw["vlms"] = {"old": {"backend": "openai", "model_id": "gpt-old", "api_key_env": "OPENAI_API_KEY"}}
    cfg = validate(raw)
    needs = [n for n in weights.needs(cfg) if n.kind == "retired"]
    if status == "retired":  # a need nothing can meet: check exits 1, the stage's runner stops before its notebook
        assert [(n.what, n.stage) for n in needs] == [("gpt-old", "reflect@old")]
        assert "its shutdown date has passed" in needs[0].fix and "gpt-new" in needs[0].fix
        assert '(dated 2026-06-11): "shutdown date 2026-12-11"' in needs[0].fix  # the provider's words, cited
        assert weights.lifecycle_notes(cfg) == []
    else:
        assert needs == [] and "shutdown 2026-12-11" in weights.lifecycle_notes(cfg)[0]


def test_the_probe_of_a_model_past_its_shutdown_sends_no_request(own_lifecycle, monkeypatch):
    from biasaudit.backends.vlm import make_vlm_backend
    from biasaudit.params import VLMSpec

    own_lifecycle(DEPRECATED)
    monkeypatch.setattr(lifecycle, "today", lambda: date(2026, 12, 12))
    with VLMServer() as server:
        why = make_vlm_backend(VLMSpec(backend="openai", model_id="gpt-old", base_url=server.openai_url,
                                       api_key_env="NOPE")).probe()
        assert server.probes == [] and server.requests == []
    assert "gpt-old" in why and "retired on 2026-12-11" in why and "shutdown date has passed" in why


# --- the probe's last resort ----------------------------------------------------------------------------

# the body a server answers for a model it does not have (DeepSeek's and other OpenAI-compatible APIs' wording)
MODEL_NOT_EXIST = (400, {"error": {"message": "Model not exist.", "type": "invalid_request_error", "param": None,
                                   "code": "invalid_request_error"}})


def test_a_400_model_not_exist_on_the_one_token_probe_stops_the_stage_with_no_item_request(tmp_path, monkeypatch):
    from biasaudit.t2i import classify

    monkeypatch.chdir(tmp_path)
    grey_manifest(tmp_path, range(10, 250, 15))
    with VLMServer(retrieve=False, lists=False, chat_probe=MODEL_NOT_EXIST) as server:
        cfg = classify_config(tmp_path, {"backend": "openai", "model_id": "no-such-model",
                                       "base_url": server.openai_url})
        with pytest.raises(StageStopped, match="no item sent or recorded: .*no-such-model.*HTTP 400: Model not exist"):
            classify.run_classify("m", cfg, progress=False)
        # retrieve, list, the one-token chat request: then nothing (16 items, 0 item requests)
        assert server.probes == ["no-such-model", "(list)", "(chat)"] and server.requests == []
    log = Path(classify.C.CLASSIFY_LOGS) / "m.jsonl"
    assert not log.exists() or not log.read_text().strip()


@pytest.mark.parametrize("answer, served", [
    # OpenAI's own body for a reasoning model sent max_tokens: the request's shape, the model is there
    ((400, {"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                                 "'max_completion_tokens' instead.", "type": "invalid_request_error",
                      "param": "max_tokens", "code": "unsupported_parameter"}}), True),
    (MODEL_NOT_EXIST, False),
    ((400, {"error": {"message": "The model `x` does not exist", "type": "invalid_request_error", "param": "model",
                      "code": "model_not_found"}}), False),
    ((400, {"error": {"message": "Invalid value", "type": "invalid_request_error", "param": None, "code": None}}),
     False),  # names no parameter: nothing shows the model is served
    ((403, {"error": {"message": "Project does not have access to model x", "type": "invalid_request_error"}}), False),
    ((404, {"error": {"message": "not found", "type": "invalid_request_error"}}), False),
])
def test_the_last_resort_counts_a_400_as_served_only_when_it_is_about_the_request(answer, served):
    from biasaudit.backends.vlm import make_vlm_backend
    from biasaudit.params import VLMSpec

    with VLMServer(retrieve=False, lists=False, chat_probe=answer) as server:
        why = make_vlm_backend(VLMSpec(backend="openai", model_id="x", base_url=server.openai_url,
                                       api_key_env="NOPE")).probe()
        assert server.probes == ["x", "(list)", "(chat)"]
    assert (why == "") is served
    if not served:
        assert f"HTTP {answer[0]}" in why and answer[1]["error"]["message"][:20] in why


# --- answers that name no model --------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["gemini", "openai"])
def test_an_answer_without_a_model_field_stops_the_stage_or_is_recorded_unverified(tmp_path, monkeypatch, backend):
    from biasaudit.t2i import classify

    monkeypatch.chdir(tmp_path)
    grey_manifest(tmp_path, range(10, 70, 15))
    with VLMServer(omit_model=True) as server:
        url = server.gemini_url if backend == "gemini" else server.openai_url
        vlm = {"backend": backend, "model_id": "gemini-3.5-flash-lite" if backend == "gemini" else "gpt-4.1",
               "base_url": url}
        with pytest.raises(StageStopped, match="model not verified.*require_verified_model"):
            classify.run_classify("m", classify_config(tmp_path, vlm), progress=False)  # the default: on
        log = Path(classify.C.CLASSIFY_LOGS) / "m.jsonl"
        assert not log.exists() or not log.read_text().strip()  # nothing of it logged
        out = classify.run_classify("m", classify_config(tmp_path, vlm, require_verified_model=False), progress=False)
    table = out["table"]
    assert (table["status"] == "ok").all() and (table["model_version"] == UNVERIFIED).all()
    import json

    record = json.loads(Path(out["out_path"]).with_suffix(".run.json").read_text())["model_lifecycle"]
    assert record["unverified_answers"] == 4 and record["answering_versions"] == []  # the run record says so


def test_the_audit_card_says_the_answering_model_was_not_verified():
    from biasaudit.report import audit_card

    shown = audit_card._versions(pd.Series([UNVERIFIED, UNVERIFIED]))
    assert "unverified" in shown


# --- bad input: refused with the file and key named, nothing changed ---------------------------------------

@pytest.fixture
def repo(tmp_path, monkeypatch):
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_unknown_profile_is_refused_before_any_stage_runs(repo, capsys):
    from biasaudit import check
    from biasaudit.notebook import stage_params

    text = (repo / "params.yaml").read_text()
    assert "\nprofile: offline" in text
    (repo / "params.yaml").write_text(text.replace("\nprofile: offline", "\nprofile: nosuch", 1))
    before = (repo / "params.yaml").read_text()
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert "params.yaml: profile: unknown profile 'nosuch'" in err and "available: " in err and "paper" in err
    assert check.main(["params.yaml", str(repo / "data/check")]) == 2  # the check stage: dvc repro stops there
    assert "unknown profile 'nosuch'" in capsys.readouterr().err
    assert not (repo / "data/check").exists() and (repo / "params.yaml").read_text() == before
    with pytest.raises(ParamsError, match="unknown profile 'nosuch'"):  # a notebook run by hand too
        stage_params("prompts")
    (repo / "params.yaml").write_text(before.replace("profile: nosuch", "profile: paper"))
    assert load_params(repo / "params.yaml").profile == "paper"  # a profile that exists is a name, not a switch


def test_a_duplicate_key_in_params_yaml_is_refused_naming_file_key_and_lines(repo, capsys):
    from biasaudit import check

    text = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(text + "\nseed: 7\n")  # `seed:` is already a top-level key
    first = 1 + next(i for i, line in enumerate(text.splitlines()) if line.startswith("seed:"))
    last = len((text + "\nseed: 7\n").splitlines())
    before = (repo / "params.yaml").read_text()
    assert cli.main(["check"]) == 2
    err = capsys.readouterr().err
    assert f"params.yaml, line {last}" in err and f"duplicate key 'seed' (first at line {first}" in err
    assert "Traceback" not in err
    assert check.main(["params.yaml", str(repo / "data/check")]) == 2
    assert "duplicate key 'seed'" in capsys.readouterr().err
    assert (repo / "params.yaml").read_text() == before and not (repo / "data/check").exists()


@pytest.mark.slow
def test_dvc_repro_refuses_the_same_duplicate_key_and_runs_no_stage(pipeline_copy):  # noqa: F811
    """DVC reads params.yaml with ruamel.yaml, which refuses a repeated key: `check` refuses what DVC refuses,
    and the real `dvc repro` stops before any stage, touching nothing."""
    from .pipeline_copy import dvc
    from .test_check_stage import tree_hash

    root, env = pipeline_copy
    (root / "params.yaml").write_text((root / "params.yaml").read_text() + "\nseed: 7\n")
    before = tree_hash(root)
    run = dvc(root, env, "repro")
    log = run.stdout + run.stderr
    assert run.returncode != 0 and "params.yaml" in log and "Running stage" not in log, log[-2000:]
    assert tree_hash(root) == before


@pytest.mark.parametrize("text, line", [
    ("models:\n  m:\n    provider: [Google\n    status: served\n", 4),   # an unclosed flow sequence
    ("providers: {}\nmodels:\n  m: {provider: x}\n  m: {provider: y}\n", 4),  # a duplicate entry
])
def test_a_malformed_lifecycle_file_is_named_with_its_line_and_no_traceback(repo, own_lifecycle, capsys, text, line):
    own_lifecycle(text)
    (repo / "profiles/current.yaml").exists()
    assert cli.main(["check", "--profile", "current"]) == 2
    err = capsys.readouterr().err
    assert f"data/reference/models/lifecycle.yaml, line {line}: " in err and "Traceback" not in err


def test_a_lifecycle_entry_without_its_evidence_is_named_by_file_and_key(repo, own_lifecycle, capsys):
    own_lifecycle("providers: {Google: [ai.google.dev]}\nmodels:\n  gemini-3.8-flash:\n    provider: Google\n"
                  "    status: served\n    evidence: [{url: 'https://ai.google.dev/x', says: served}]\n")
    assert cli.main(["check", "--profile", "current"]) == 2
    err = capsys.readouterr().err
    assert "data/reference/models/lifecycle.yaml: models.gemini-3.8-flash.status: 'served' needs a quote" in err


def _photo(path: Path) -> None:
    grey_image(path, 120, size=96)


def test_a_link_out_of_the_photo_folder_is_not_followed(tmp_path):
    from biasaudit import check
    from biasaudit.pipeline.entries import LEAVES, folder_problems
    from biasaudit.vlm.sources import folder_candidates

    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir()
    _photo(secret)
    root = tmp_path / "photos"
    (root / "doctor").mkdir(parents=True)
    _photo(root / "doctor" / "a.png")
    (root / "doctor" / "b.png").symlink_to(secret)                  # a link to a file outside the folder
    (root / "doctor" / "c.png").symlink_to(root / "doctor" / "a.png")  # a link inside it: followed
    (root / "doctor" / "hostname").symlink_to("/etc/hostname")
    found = {Path(c["origin"]).name: c for c in folder_candidates(root, ["doctor"])}
    assert found["a.png"]["path"] is not None and found["c.png"]["path"] is not None
    for name in ("b.png", "hostname"):
        assert found[name]["path"] is None and found[name]["skip"].startswith(LEAVES), found[name]
    problems = folder_problems(root)
    assert sorted(p.split(":")[0] for p in problems) == ["doctor/b.png", "doctor/hostname"]
    assert all("not followed" in p for p in problems)
    printed = check.fingerprint([str(root)])[str(root)]
    assert printed["doctor/b.png"] == f"{LEAVES}: not followed" and printed["doctor/hostname"] == printed["doctor/b.png"]
    assert len(printed["doctor/a.png"]) == 64 and printed["doctor/c.png"] == printed["doctor/a.png"]


def test_a_folder_generator_does_not_read_a_mapped_file_outside_its_folder(tmp_path):
    from biasaudit.backends.generators.folder import read_mapping

    folder = tmp_path / "images"
    folder.mkdir()
    _photo(folder / "a.png")
    (folder / "b.png").symlink_to("/etc/hostname")
    pd.DataFrame({"file": ["a.png", "b.png", "../outside.png"], "prompt_id": ["p", "p", "p"]}).to_csv(
        tmp_path / "map.csv", index=False)
    _photo(tmp_path / "outside.png")
    _, problems = read_mapping(folder, tmp_path / "map.csv")
    unusable = next(p for p in problems if "cannot be read" in p)
    assert "b.png (leaves the folder: link 'b.png' → '/etc/hostname'" in unusable
    assert "../outside.png (leaves the folder: " in unusable and "a.png (" not in unusable.replace("b.png (", "")


def test_the_docs_give_the_weights_url_the_code_fetches():
    from biasaudit import weights

    text = (ROOT / "docs/real-models.md").read_text()
    for w in weights.WEIGHTS:
        if w.source.startswith("https://"):
            name = w.source.rsplit("/", 1)[-1]
            cited = {u for u in __import__("re").findall(r"https://[^\s`)|]+", text) if u.endswith("/" + name)}
            assert cited <= {w.source}, (name, cited)


def test_a_generated_image_without_a_model_version_stops_generate_or_is_recorded_unverified(tmp_path, monkeypatch):
    import json

    from biasaudit.t2i.generate import run_generate

    from .servers_images import GeminiImageServer
    from .test_model_lifecycle import _generate_cfg, _prompts

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEST_GEMINI_KEY", "k")
    _prompts(tmp_path)
    with GeminiImageServer() as server:
        server.version_of = lambda req: ""  # the answer names no model
        cfg = _generate_cfg(server, "gemini-nano-banana-2.1")
        with pytest.raises(StageStopped, match="model not verified"):
            run_generate("g", cfg, progress=False)
        log = tmp_path / "data/t2i/images/g/log.jsonl"
        assert not log.exists() or not log.read_text().strip()
        lax = cfg.model_copy(update={"execution": cfg.execution.model_copy(update={"require_verified_model": False})})
        res = run_generate("g", lax, progress=False)
    assert len(res.manifest) == 6 and (res.manifest["model_version"] == UNVERIFIED).all()
    record = json.loads((tmp_path / "data/t2i/images/g/summary.json").read_text())["model_lifecycle"]
    assert record["unverified_answers"] == 6
