"""Counterfactual editors: hosted APIs against local servers speaking the real wire formats, the tiny
stand-in and the compositing that keeps every pixel outside the face mask, the FOCUS layout import."""

import numpy as np
import pytest
from PIL import Image

from biasaudit.backends.editors import EditRequest, composite, feathered_alpha, make_editor
from biasaudit.params.vlm import Counterfactuals
from biasaudit.vlm import focus

from .servers_edit import GeminiEditServer, OpenAIEditServer, darken_centre


@pytest.fixture
def photo(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 255, (96, 80, 3), dtype=np.uint8)
    path = tmp_path / "src.png"
    Image.fromarray(rgb).save(path)
    return str(path), rgb


def req(path, seed=1, mask=None):
    return EditRequest(path, "Black_woman", "a Black woman", "Make the face that of a Black woman.", seed, mask)


def test_gemini_editor_wire_format(photo, monkeypatch):
    path, rgb = photo
    monkeypatch.setenv("TEST_GEMINI_KEY", "k-123")
    with GeminiEditServer() as server:
        spec = Counterfactuals(backend="gemini", model_id="gemini-2.5-flash-image", base_url=server.url,
                               api_key_env="TEST_GEMINI_KEY", max_retries=2)
        editor = make_editor(spec)
        editor._sleep = lambda s: None
        server.queue(GeminiEditServer.server_error())  # one transient 503, then the edit
        ok = editor.edit([req(path, seed=7)])[0]
        server.queue(GeminiEditServer.image_safety(), GeminiEditServer.prompt_blocked())
        refused = editor.edit([req(path), req(path)])
        body = server.requests[-1].json
        headers = server.requests[-1].headers
    assert ok.status == "ok" and ok.meta["retries"] == 1
    assert np.array_equal(ok.image, darken_centre(_png(rgb)))
    assert [r.status for r in refused] == ["refused", "refused"]
    assert "IMAGE_SAFETY" in refused[0].reason and "SAFETY" in refused[1].reason
    assert body["generationConfig"]["responseModalities"] == ["IMAGE", "TEXT"]
    assert body["generationConfig"]["seed"] == 1
    assert any("text" in p for p in body["contents"][0]["parts"])
    assert headers.get("x-goog-api-key") == "k-123"


def _png(rgb):
    import io

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def test_openai_editor_wire_format(photo, monkeypatch):
    path, rgb = photo
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test")
    with OpenAIEditServer() as server:
        spec = Counterfactuals(backend="openai", model_id="gpt-image-1", base_url=server.url + "/v1",
                               api_key_env="TEST_OPENAI_KEY", max_retries=1)
        editor = make_editor(spec)
        editor._sleep = lambda s: None
        server.queue(OpenAIEditServer.rate_limited())
        ok = editor.edit([req(path)])[0]
        server.queue(OpenAIEditServer.refusal())
        refused = editor.edit([req(path)])[0]
        fields = server.fields[0]
        auth = server.requests[-1].headers["authorization"]
    assert ok.status == "ok" and np.array_equal(ok.image, darken_centre(_png(rgb)))
    assert fields["model"] == "gpt-image-1" and "Black woman" in fields["prompt"]
    assert refused.status == "refused" and "content policy" in refused.reason
    assert auth == "Bearer sk-test"


def test_hosted_editor_without_key_stops_with_the_variable_name(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(RuntimeError, match="NO_SUCH_KEY_VAR"):
        make_editor(Counterfactuals(backend="openai", model_id="gpt-image-1", api_key_env="NO_SUCH_KEY_VAR"))


def test_unreadable_source_is_a_failed_result(tmp_path, monkeypatch):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    editor = make_editor(Counterfactuals())
    res = editor.edit([req(str(bad), mask=np.ones((4, 4), bool)), req(str(bad))])
    assert [r.status for r in res] == ["failed", "failed"] and all(r.reason for r in res)


def test_composite_keeps_every_outside_pixel():
    rng = np.random.default_rng(1)
    src = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    gen = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    mask = np.zeros((64, 64), bool)
    mask[24:40, 24:40] = True
    alpha = feathered_alpha(mask, dilate_px=3, feather_px=1.5)
    out = composite(src, gen, alpha)
    assert np.array_equal(out[alpha == 0], src[alpha == 0])
    assert np.array_equal(out[mask], np.round(src[mask] * (1 - alpha[mask, None]) + gen[mask] * alpha[mask, None]).astype(np.uint8))
    # the feathered band ends within dilate + 3·sigma (+1 px for rounding)
    from scipy import ndimage
    dist = ndimage.distance_transform_edt(~mask)
    assert dist[alpha > 0].max() <= 3 + 3 * 1.5 + 1


def test_tiny_editor_changes_only_the_face_region():
    from skimage import data

    from biasaudit.backends.editors.tiny import TinyEditor

    rgb = data.astronaut()[:256, 96:352].copy()
    mask = np.zeros(rgb.shape[:2], bool)
    mask[60:140, 90:170] = True
    ed = TinyEditor(dilate_px=4, feather_px=1.0)
    dark = ed.edit_array(rgb, mask, "Black_man", seed=3)
    light = ed.edit_array(rgb, mask, "White_woman", seed=3)
    grown = ndimage_grow(mask, 4 + 3 + 1)
    assert np.array_equal(dark[~grown], rgb[~grown]) and np.array_equal(light[~grown], rgb[~grown])
    assert dark[mask].mean() < light[mask].mean()          # darker target, darker face
    assert np.array_equal(dark, ed.edit_array(rgb, mask, "Black_man", seed=3))  # seeded


def ndimage_grow(mask, px):
    from scipy import ndimage
    return ndimage.distance_transform_edt(~mask) <= px


def test_focus_layout_import_without_an_editor(tmp_path):
    src = tmp_path / "FOCUS"
    rgb = np.full((40, 40, 3), 120, np.uint8)
    for occ, base in (("nurse", "n01"), ("ceo", "c07")):
        for race in ("Black", "White"):
            for gender in ("man", "woman"):
                p = focus.focus_path(src, occ, base, race, gender)
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rgb).save(p)
    (src / "nurse" / "n01" / "Martian_man.jpg").write_bytes(b"x")      # not a FOCUS group
    (src / "ceo" / "c07" / "White_woman.jpg").write_bytes(b"broken")  # unreadable
    found, problems = focus.scan_focus(src)
    assert len(found) == 8 and any("Martian_man" in p for p in problems)
    manifest = focus.import_focus_folder(src, tmp_path / "out")
    assert len(manifest) == 8 and set(manifest["backend"]) == {"folder"}
    bad = manifest[manifest["status"] != "ok"]
    assert list(bad["edit_id"]) == ["ceo/c07/White_woman"] and bad["reason"].iloc[0]
    ok = manifest[manifest["status"] == "ok"]
    assert all((tmp_path / "out").joinpath(*e.split("/")).with_suffix(".jpg").is_file() for e in ok["edit_id"])
    assert set(ok["group"]) == {"BM", "BF", "WM", "WF"}


def test_counterfactuals_params_name_the_bad_key():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="instruction"):
        Counterfactuals(instruction="no placeholder")
    with pytest.raises(ValidationError, match="folder_dir"):
        Counterfactuals(backend="folder")


def build_tiny_sd_inpaint(path):
    """A tiny random-weight Stable Diffusion *inpainting* pipeline (UNet with 9 input channels), built
    from diffusers' test-suite sized configs and saved with save_pretrained."""
    import torch
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionInpaintPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    from biasaudit.tiny.diffusion import _clip_config, _clip_tokenizer

    torch.manual_seed(0)
    tok = _clip_tokenizer()
    unet = UNet2DConditionModel(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=9,
                                out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32)
    vae = AutoencoderKL(block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2)
    pipe = StableDiffusionInpaintPipeline(vae=vae, text_encoder=CLIPTextModel(_clip_config(len(tok))), tokenizer=tok,
                                          unet=unet, scheduler=PNDMScheduler(skip_prk_steps=True), safety_checker=None,
                                          feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(path)
    return path


@pytest.mark.slow
def test_diffusers_inpainting_is_composited_inside_the_mask(tmp_path):
    """A tiny random-weight inpainting pipeline loaded by the real loading code (AutoPipelineForInpainting);
    whatever it paints, every pixel outside the feathered face mask is the source's own."""
    from biasaudit.backends.editors.diffusers_inpaint import DiffusersInpaintEditor

    path = build_tiny_sd_inpaint(tmp_path / "tiny-sd-inpaint")
    spec = Counterfactuals(backend="diffusers", model_id=str(path), num_inference_steps=2, guidance_scale=0.0,
                           strength=1.0, image_max_side=64, device="cpu", mask_dilate_px=2, mask_feather_px=1.0)
    editor = DiffusersInpaintEditor(spec, stand_in=True)
    rgb = np.random.default_rng(0).integers(0, 255, (80, 64, 3), dtype=np.uint8)
    src = tmp_path / "src.png"
    Image.fromarray(rgb).save(src)
    mask = np.zeros((80, 64), bool)
    mask[30:50, 20:44] = True
    res = editor.edit([EditRequest(str(src), "Asian_man", "an East Asian man", "a face", 5, mask)])[0]
    assert res.status == "ok", res.reason
    alpha = feathered_alpha(mask, 2, 1.0)
    assert res.image.shape == rgb.shape
    assert np.array_equal(res.image[alpha == 0], rgb[alpha == 0])
    assert not np.array_equal(res.image[mask], rgb[mask])
    assert editor.settings()["pipeline"] == "StableDiffusionInpaintPipeline" and editor.stand_in
