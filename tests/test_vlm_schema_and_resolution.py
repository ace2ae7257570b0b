"""Request capture against a local server (tests/servers_vlm.py):

- structured-output fallback: a server that rejects the JSON-schema response_format (400) gets the same
  question once more without it; the plain answer is parsed, and each row records which mode answered;
- equal pixels per face: all five VLMs of the paper profile, through their own backends, receive each
  face at the same resolution (Llama 3.2 Vision's one-image composite included), counted in the decoded
  request images; every row records that resolution (face_px).
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.backends.vlm import CachedVLM, VLMRequest, make_vlm_backend
from biasaudit.backends.vlm.openai_chat import PLAIN_AFTER_REJECTION, SCHEMA
from biasaudit.cli import profile_params
from biasaudit.params import VLMSpec
from biasaudit.vlm import tasks

from .servers_vlm import LABELS, VLMServer, grey_image

ROOT = Path(__file__).resolve().parents[1]
LEVEL = {"WM": 25, "BM": 229}  # each variant a flat grey: its pixels are countable in what was sent


def _decode(b64: str) -> np.ndarray:
    raw = base64.urlsafe_b64decode(b64.replace("+", "-").replace("/", "_") + "=" * (-len(b64) % 4))
    return np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=int)


def _pair(tmp_path: Path, side: int) -> pd.DataFrame:
    rows = []
    for race, group in (("White", "WM"), ("Black", "BM")):
        p = tmp_path / f"{race}_man_{side}.png"
        grey_image(p, LEVEL[group], size=side)
        rows.append({"occupation": "doctor", "base_id": "d1", "race": race, "gender": "man", "path": str(p)})
    return pd.DataFrame(rows)


def _sent_images(body: dict) -> list[np.ndarray]:
    if "messages" in body:
        return [_decode(p["image_url"]["url"].split(",", 1)[1]) for p in body["messages"][0]["content"]
                if p["type"] == "image_url"]
    return [_decode((p.get("inlineData") or p["inline_data"])["data"]) for p in body["contents"][0]["parts"]
            if "inlineData" in p or "inline_data" in p]


# --- structured-output fallback -------------------------------------------------------------------

def _qwen_spec(url: str) -> VLMSpec:
    return VLMSpec(backend="openai", model_id="qwen3-vl-plus", base_url=url, api_key_env="NOPE", max_retries=1,
                   retry_backoff_s=0.0, timeout_s=5.0, concurrency=1, max_tokens=32, image_format="PNG")


def test_a_server_rejecting_the_schema_gets_the_question_once_more_without_it(tmp_path):
    paths = []
    for level, name in ((25, "white"), (76, "black")):
        grey_image(tmp_path / f"{name}.png", level)
        paths.append(str(tmp_path / f"{name}.png"))
    with VLMServer(reject_schema=True) as server:
        backend = make_vlm_backend(_qwen_spec(server.openai_url))
        out = backend.generate([VLMRequest(images=(p,), prompt="race?", options=LABELS) for p in paths])
        formats = [(b.get("response_format") or {}).get("type") for b in server.requests]
    # question 1: with the schema (rejected), then once without; question 2: without (the server said no)
    assert formats == ["json_schema", None, None]
    assert [r.status for r in out] == ["ok", "ok"] and [r.text for r in out] == ["white", "black"]
    assert [r.meta["answer_mode"] for r in out] == [PLAIN_AFTER_REJECTION, PLAIN_AFTER_REJECTION]
    assert backend.stats["schema_fallbacks"] == 1


def test_a_server_with_schema_mode_answers_in_it_and_the_row_says_so(tmp_path):
    with VLMServer() as server:
        backend = make_vlm_backend(_qwen_spec(server.openai_url))
        grey_image(tmp_path / "w.png", 25)
        [r] = backend.generate([VLMRequest(images=(str(tmp_path / "w.png"),), prompt="race?", options=LABELS)])
        assert server.calls == 1 and server.requests[0]["response_format"]["type"] == "json_schema"
    assert r.status == "ok" and r.text == "white" and r.meta["answer_mode"] == SCHEMA


def test_other_400s_are_not_retried_without_the_schema(tmp_path):
    grey_image(tmp_path / "w.png", 25)
    with VLMServer() as server:  # gpt-5 rejects max_tokens: a 400 that is not about the schema
        spec = _qwen_spec(server.openai_url).model_copy(update={"model_id": "gpt-5"})
        backend = make_vlm_backend(spec)
        backend.caps = type(backend.caps)(False, "max_tokens", True, "")
        [r] = backend.generate([VLMRequest(images=(str(tmp_path / "w.png"),), prompt="q", options=LABELS)])
        assert server.calls == 1 and r.status == "failed" and not backend.schema_rejected


def test_reflect_rows_record_the_mode_that_answered(tmp_path):
    params = profile_params(None, ROOT / "params.yaml").reflect.model_copy(
        update={"composite_dir": str(tmp_path / "c")})
    items = tasks.two_afc_items(_pair(tmp_path, 64), ["income"], tasks.two_afc_prompts(params), both_orders=True)
    with VLMServer(reject_schema=True) as server:
        vlm = CachedVLM(make_vlm_backend(_qwen_spec(server.openai_url)), tmp_path / "cache.sqlite")
        records = tasks.make_batch_fn(vlm, "qwen3-vl-plus", params)(items)
    # the server answers a label that is not A/B: parsed as plain text by the strict parser → failed, with reason
    assert [r["answer_mode"] for r in records] == [PLAIN_AFTER_REJECTION] * 2
    assert all(r["status"] == "failed" and r["reason"] for r in records)


# --- equal pixels per face across the five VLMs -----------------------------------------------------

@pytest.fixture(scope="module")
def paper():
    return profile_params("paper", ROOT / "params.yaml")


def test_the_paper_profile_has_five_vlms(paper):
    assert sorted(paper.vlms) == ["deepseek-vl2", "gemini-2.5-pro", "gpt-5", "llama-3.2-90b-vision",
                                  "qwen3-vl-plus"]


@pytest.mark.parametrize("source_side", [1024, 300])
def test_every_vlm_sees_each_face_at_the_same_resolution(paper, tmp_path, monkeypatch, source_side):
    monkeypatch.setenv("GEMINI_API_KEY", "test-key-not-real")
    for var in ("OPENAI_API_KEY", "DASHSCOPE_API_KEY", "VLLM_API_KEY"):
        monkeypatch.setenv(var, "test-key-not-real")
    params = paper.reflect.model_copy(update={"composite_dir": str(tmp_path / "composites")})
    face = min(source_side, params.face_side)  # never enlarged; the published setup: 512 px per face
    pair = _pair(tmp_path, source_side)
    items = tasks.two_afc_items(pair, ["income"], tasks.two_afc_prompts(params), both_orders=False)
    items += tasks.single_items(pair.iloc[:1], params)[:1]
    assert [i["kind"] for i in items] == ["2afc", "mcq"]
    modes = {}
    for name, spec in paper.vlms.items():
        with VLMServer() as server:
            url = server.gemini_url if spec.backend == "gemini" else server.openai_url
            spec = spec.model_copy(update={"base_url": url, "max_retries": 0, "timeout_s": 5.0, "concurrency": 1})
            vlm = CachedVLM(make_vlm_backend(spec), tmp_path / f"{name}.sqlite")
            records = tasks.make_batch_fn(vlm, name, params)(items)
            bodies = list(server.requests)
        modes[name] = spec.two_afc_mode
        assert len(bodies) == 2, name
        two_afc, mcq = (_sent_images(b) for b in bodies)
        if spec.two_afc_mode == "composite":
            [img] = two_afc  # one picture: count each flat-grey face's pixels in it
            for group in ("WM", "BM"):
                pixels = int((np.abs(img - LEVEL[group]) <= 6).sum())
                assert pixels == pytest.approx(face * face, rel=0.02), (name, group, pixels)
        else:
            assert [im.shape for im in two_afc] == [(face, face)] * 2, name
        assert mcq[0].shape == (face, face), name
        assert [r["face_px"] for r in records] == [face, face], name
        assert all(r["answer_mode"] in ("json_schema", "response_schema (enum)") for r in records), name
    assert modes["llama-3.2-90b-vision"] == "composite" and list(modes.values()).count("interleaved") == 4


def test_face_px_without_face_side_is_what_the_backend_downscaling_leaves(tmp_path):
    """face_side 0 (each VLM its own image_max_side): the legacy 512-px composite tiles, then the whole
    1040 × 560 composite shrunk to 512 px → 512 × 512 / 1040 = 252 px per face; a single image: 512."""
    pair = _pair(tmp_path, 1024)
    item = {"kind": "2afc", "image_a": pair.path[0], "image_b": pair.path[1]}
    assert tasks.face_px(item, 0, "composite", 512) == 252
    assert tasks.face_px(item, 0, "interleaved", 512) == 512 and tasks.face_px(item, 0, "interleaved", 0) == 1024
    assert tasks.face_px(item, 512, "composite", 512) == 512  # face_side: each face keeps its 512 px
