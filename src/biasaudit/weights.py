"""Every model weight the pipeline can use: where it comes from, how big it is, its licence or gating
step, where it lives locally, and what the current parameters need.

    biasaudit weights list [--profile paper]     # the table (docs/real-models.md, "Getting the real models")
    biasaudit weights fetch [--profile paper]    # download what is missing into models/ (HF_TOKEN for gated repos)
    biasaudit weights verify [--profile paper]   # offline: every file present and its sha256 as recorded

Pinning: a Hugging Face repo is fetched at `revision` (a branch or commit); `fetch` resolves it to
the commit it downloaded, checks every file against the sha256 the Hub publishes for it (LFS) and
writes both to `models/weights.lock.json`. `verify` recomputes the sha256 of every file offline and
compares it with the lock; a later `fetch` downloads exactly the locked commit again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from biasaudit import contracts as C
from biasaudit import registry

MODELS_DIR = Path("models")
LOCK_FILE = MODELS_DIR / "weights.lock.json"


@dataclass(frozen=True)
class Weight:
    name: str
    what: str
    kind: str                   # hf (a Hub repo, diffusers/open_clip layout) | zip (model-zoo archive) | hf-file
    source: str                 # Hub repo id, or URL
    local_path: str             # where params point (relative to the repository root)
    size_gb: float              # download size, approximate
    licence: str
    gate: str = ""              # what to do before fetching ('' = nothing)
    revision: str = "main"      # pinned to a commit in models/weights.lock.json by `fetch`
    files: tuple[str, ...] = ()  # allow_patterns (hf) / the one file (hf-file)
    published: str = ""         # the original publication location, when we fetch from a mirror
    fetchable: bool = True      # False: served by another program (vLLM) or hosted
    sha256: str = ""            # zip: the archive's pinned sha256 (checked before anything is extracted)


INSIGHTFACE_ZOO = "https://github.com/deepinsight/insightface/releases/download/v0.7/"
# buffalo_l.zip of the v0.7 release: 288,621,354 bytes, this sha256 (the digest other projects that pin the
# same release asset record, e.g. Immich's machine-learning model list)
BUFFALO_L_SHA256 = "80ffe37d8a5940d59a7384c201a2a38d4741f2f3c51eef46ebb28218a7b0ca2f"

# vLLM serve commands of the locally served VLMs. Each installs vLLM into a venv of its own
# (~/.venvs/vllm-<version>), never into the project's .venv: `pip install vllm==...` pins its own torch
# and would replace the one the project's lock installed. Llama 3.2 Vision (MllamaForConditionalGeneration,
# an encoder-decoder model) runs only on vLLM's V0 engine, which vLLM removed in September 2025 (PRs
# #24907, #25321): pin vllm==0.10.1.1 and VLLM_USE_V1=0. 177 GB of bf16 weights need 4 × 80 GB (tensor
# parallel 4); the context is capped at 8192 tokens (one 560² tile image ≈ 1,600 tokens + the prompt), one
# image per request. DeepSeek-VL2 (27.5B MoE, 4.5B active, ≈ 55 GB bf16) fits one 80 GB card and takes two
# images per request, on the same vllm==0.10.1.1 (V1 engine). No --chat-template: examples/ exists only in
# a vLLM source checkout; the wheel ships the template as
# vllm/transformers_utils/chat_templates/template_deepseek_vl2.jinja and picks it by model type
# (deepseek_vl_v2) when the checkpoint has no chat template of its own (chat_templates/registry.py,
# https://github.com/vllm-project/vllm/blob/v0.10.1.1/vllm/transformers_utils/chat_templates/registry.py).
# That template takes the content as one string, and vLLM then puts every image placeholder before all
# the text unless --interleave-mm-strings is on (PR #14047; in vllm 0.10.1.1's engine args; PR #35661
# proposed a per-request switch): with it, "Image A:" / "Image B:" stay right before their images.
VLLM_SERVE = {
    "llama-3.2-90b-vision": (
        "python3 -m venv ~/.venvs/vllm-0.10.1.1 && ~/.venvs/vllm-0.10.1.1/bin/pip install vllm==0.10.1.1 && "
        "VLLM_USE_V1=0 ~/.venvs/vllm-0.10.1.1/bin/vllm serve meta-llama/Llama-3.2-90B-Vision-Instruct "
        "--port 8000 --tensor-parallel-size 4 --max-model-len 8192 --max-num-seqs 16 --enforce-eager "
        "--limit-mm-per-prompt '{\"image\": 1}'"),
    "deepseek-vl2": (
        "python3 -m venv ~/.venvs/vllm-0.10.1.1 && ~/.venvs/vllm-0.10.1.1/bin/pip install vllm==0.10.1.1 && "
        "~/.venvs/vllm-0.10.1.1/bin/vllm serve deepseek-ai/deepseek-vl2 --port 8001 "
        "--hf-overrides '{\"architectures\": [\"DeepseekVLV2ForCausalLM\"]}' "
        "--interleave-mm-strings --max-model-len 4096 --limit-mm-per-prompt '{\"image\": 2}'"),
}
LLAMA_EU_NOTE = ("Llama 3.2 Acceptable Use Policy: the rights of Section 1(a) of the licence are NOT granted for "
                 "its multimodal models to individuals domiciled in, or companies with a principal place of "
                 "business in, the European Union (end users of a product that incorporates them are exempt)")

# The paper profile's local models (hosted ones need keys, not weights).
WEIGHTS: tuple[Weight, ...] = (
    Weight("sd35-large-turbo", "Stable Diffusion 3.5 Large Turbo (diffusers layout, bf16)", "hf",
           "stabilityai/stable-diffusion-3.5-large-turbo", "models/sd35-large-turbo", 27.9,
           "Stability AI Community License (free under USD 1M annual revenue)",
           gate="gated: accept the licence at https://huggingface.co/stabilityai/stable-diffusion-3.5-large-turbo "
                "with your account, then export HF_TOKEN=<a read token>",
           files=("model_index.json", "scheduler/*", "text_encoder/*", "text_encoder_2/*", "text_encoder_3/*",
                  "tokenizer/*", "tokenizer_2/*", "tokenizer_3/*", "transformer/*", "vae/*")),
    Weight("flux-schnell", "FLUX.1-schnell (diffusers layout, bf16)", "hf", "black-forest-labs/FLUX.1-schnell",
           "models/flux-schnell", 33.7, "Apache-2.0",
           files=("model_index.json", "scheduler/*", "text_encoder/*", "text_encoder_2/*", "tokenizer/*",
                  "tokenizer_2/*", "transformer/*", "vae/*")),
    Weight("clip-vit-h-14", "open_clip ViT-H-14 laion2b_s32b_b79k (homogeneity gap)", "hf-file",
           "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", "models/clip-vit-h-14/open_clip_model.safetensors", 3.9, "MIT",
           files=("open_clip_model.safetensors",)),
    Weight("insightface-buffalo_l", "InsightFace buffalo_l (SCRFD-10GF detector + ArcFace ResNet50 w600k_r50)", "zip",
           INSIGHTFACE_ZOO + "buffalo_l.zip", "models/insightface/models/buffalo_l", 0.28,
           "InsightFace models: non-commercial research use only",
           gate="research use only: read https://github.com/deepinsight/insightface#license before fetching",
           sha256=BUFFALO_L_SHA256),
    Weight("bisenet-face-parsing", "BiSeNet face parsing, CelebAMask-HQ (79999_iter.pth; skin class)", "hf-file",
           "ManyOtherFunctions/face-parse-bisent", "models/bisenet/79999_iter.pth", 0.05,
           "MIT (zllrunning/face-parsing.PyTorch); CelebAMask-HQ: non-commercial research",
           files=("79999_iter.pth",),
           published="https://drive.google.com/open?id=154JgKpzCPW82qINcVieuPH3fZ2e0P812 "
                     "(zllrunning/face-parsing.PyTorch README); fetched from a Hugging Face mirror"),
    Weight("llama-3.2-90b-vision", "Llama 3.2 90B Vision Instruct (served by vLLM at localhost:8000)", "hf",
           "meta-llama/Llama-3.2-90B-Vision-Instruct", "(the vLLM server's cache)", 177.0,
           f"Llama 3.2 Community License. {LLAMA_EU_NOTE}",
           gate="gated: accept the licence at https://huggingface.co/meta-llama/Llama-3.2-90B-Vision-Instruct; "
                f"vLLM downloads it: `{VLLM_SERVE['llama-3.2-90b-vision']}`",
           fetchable=False),
    # The fifth VLM of the paper profile: DeepSeek-VL2, the open-weight VLM of the paper's references, served
    # like Llama by vLLM (OpenAI-compatible API; takes two images per request, so 2AFC stays interleaved)
    Weight("deepseek-vl2", "DeepSeek-VL2 (27.5B MoE, 4.5B active; served by vLLM at localhost:8001)", "hf",
           "deepseek-ai/deepseek-vl2", "(the vLLM server's cache)", 55.0,
           "DeepSeek Model License (code: MIT); commercial use allowed under its use restrictions",
           gate=f"vLLM downloads it: `{VLLM_SERVE['deepseek-vl2']}`", fetchable=False),
    # The hosted VLMs of the paper profile: an API key, no weights (listed so that all five VLMs show)
    Weight("gemini-2.5-pro", "Gemini 2.5 Pro (hosted, Google AI Studio API)", "hosted",
           "https://generativelanguage.googleapis.com", "(hosted)", 0.0, "Gemini API terms of service",
           gate="export GEMINI_API_KEY=<your key>", fetchable=False),
    Weight("gpt-5", "GPT-5 (hosted, OpenAI chat completions)", "hosted", "https://api.openai.com/v1", "(hosted)",
           0.0, "OpenAI API terms of use", gate="export OPENAI_API_KEY=<your key>", fetchable=False),
    Weight("gemini-3.8-flash", "Gemini 3.8 Flash (hosted, Google AI Studio API; current profile)", "hosted",
           "https://generativelanguage.googleapis.com", "(hosted)", 0.0, "Gemini API terms of service",
           gate="export GEMINI_API_KEY=<your key>", fetchable=False),
    Weight("gpt-6.1-sol", "GPT-6.1 Sol (hosted, OpenAI chat completions; current profile)", "hosted",
           "https://api.openai.com/v1", "(hosted)", 0.0, "OpenAI API terms of use",
           gate="export OPENAI_API_KEY=<your key>", fetchable=False),
    Weight("qwen3-vl-plus", "Qwen3-VL-Plus (hosted, DashScope OpenAI-compatible mode)", "hosted",
           "https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "(hosted)", 0.0,
           "Alibaba Cloud Model Studio terms of service", gate="export DASHSCOPE_API_KEY=<your key>",
           fetchable=False),
)
BY_NAME = {w.name: w for w in WEIGHTS}


def for_vlm(spec: Any) -> Weight | None:
    """The entry of a VLM spec's model (its Hub id, API model name or entry name), if there is one."""
    model = getattr(spec, "model_id", "")
    for w in WEIGHTS:
        if model in (w.source, w.name) and w.kind in ("hf", "hosted") and not w.fetchable:
            return w
    return None


# --- what the parameters need -----------------------------------------------------------------

@dataclass
class Need:
    """One thing a stage needs: a weight (file/folder), an API key, or a running server."""
    kind: str          # weight | input (a data folder or file, not a model) | key | server
    what: str          # path, variable name or URL
    used_by: str       # the params key / stage that needs it
    fix: str           # the exact step that provides it
    stage: str = ""    # dvc stage instances that need it, ", "-joined (generate@x, faces@x, classify@*, ...)
    weight: Weight | None = field(default=None, repr=False)
    # False: the stage still starts without it, because the stage itself writes what the user needs to
    # make it (the reliability stage writes the annotation sheet the raters fill) and stops afterwards
    # with its own message; `biasaudit check` lists it all the same.
    blocks_stage: bool = True

    def for_stage(self, stage: str) -> bool:
        """Whether the stage instance `stage` (faces@flux-schnell) needs this."""
        return any(s == stage or (s.endswith("@*") and stage.split("@")[0] == s[:-2]) for s in self.stage.split(", "))


def _weight_for_path(path: str) -> Weight | None:
    norm = Path(path).as_posix().rstrip("/")
    for w in WEIGHTS:
        if w.local_path == norm or w.source == path:
            return w
    return None


def _weight_need(path: str, used_by: str, stage: str, folder_marker: str = "") -> Need:
    w = _weight_for_path(path)
    if w is not None and w.fetchable:
        fix = f"biasaudit weights fetch --only {w.name}" + (f"  ({w.gate})" if w.gate else "")
    else:
        fix = f"put the weights at {path} (or point {used_by} at them)"
    return Need("weight", path + (f"/{folder_marker}" if folder_marker else ""), used_by, fix, stage, w)


def _is_local_url(url: str) -> bool:
    from urllib.parse import urlparse

    return (urlparse(url).hostname or "") in ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def _hosted_needs(spec: Any, used_by: str, stage: str, backend_kind: str) -> list[Need]:
    """Key (unless a local server needs none) and, for a local base_url, the server itself."""
    out: list[Need] = []
    base_url = getattr(spec, "base_url", "") or ""
    key = getattr(spec, "api_key_env", "") or ""
    if base_url and _is_local_url(base_url):
        served = for_vlm(spec)
        command = VLLM_SERVE.get(served.name if served else "", f"vllm serve {spec.model_id} --port "
                                 f"{base_url.rsplit(':', 1)[-1].split('/')[0]}")
        out.append(Need("server", base_url, f"{used_by}.base_url", f"start the server {base_url} (e.g. `{command}`)", stage))
    elif key:
        from urllib.parse import urlparse

        provider = urlparse(base_url).hostname if base_url else backend_kind
        out.append(Need("key", key, f"{used_by}.api_key_env", f"export {key}=<your API key for {provider}>", stage))
    return out


def declared_needs(kind: str, spec: Any, used_by: str, stage: str) -> list[Need]:
    """What one backend needs, from the `needs` it declares (registry.trait; nothing imported):
    ("weight", field, marker): a weight at spec.<field> (a folder holding `marker`);
    ("hosted",): an API key in spec.api_key_env (none with vertex_project), or the local server at base_url;
    ("clip", model_field, pretrained_field): an open_clip checkpoint, when pretrained is set;
    ("input", field, fix): data the user provides at spec.<field> (a label CSV, a FOCUS folder)."""
    out: list[Need] = []
    for declared in registry.trait(kind, spec.backend, "needs", ()):
        what, *args = declared
        if what == "weight":
            field_name, marker = args
            out.append(_weight_need(getattr(spec, field_name), f"{used_by}.{field_name}", stage, marker))
        elif what == "hosted":
            if not getattr(spec, "vertex_project", ""):  # Vertex AI: application default credentials
                out += _hosted_needs(spec, used_by, stage, spec.backend)
        elif what == "clip":
            model_field, pretrained_field = args
            pretrained = getattr(spec, pretrained_field)
            if pretrained and pretrained != "tiny":
                out.append(_clip_need(getattr(spec, model_field), pretrained, f"{used_by}.{pretrained_field}", stage))
        elif what == "input":
            field_name, fix = args
            out.append(Need("input", getattr(spec, field_name), f"{used_by}.{field_name}", fix, stage))
        else:
            raise ValueError(f"{kind} backend '{spec.backend}' declares an unknown need {declared!r}")
    return out


def hosted_models(cfg: Any) -> list[tuple[str, str, str]]:
    """(model id, params key, stage) of every hosted model the parameters name (registry.is_hosted)."""
    from biasaudit.lifecycle import hosted_specs

    return [(spec.model_id, key, stage) for key, stage, spec in hosted_specs(cfg)]


def lifecycle_needs(cfg: Any) -> list[Need]:
    """A retired hosted model (its provider's page says so, or its shutdown date has passed) is a need nothing
    on this machine can meet: `biasaudit check` names it with its date, source and the replacements its provider
    documents (data/reference/models/lifecycle.yaml) and exits 1. An unconfirmed claim is a warning instead
    (lifecycle.warnings)."""
    from biasaudit.lifecycle import status_of

    out = []
    for model_id, used_by, stage in hosted_models(cfg):
        found = status_of(model_id)
        if found is not None and found.effective() == "retired":
            passed = " (its shutdown date has passed)" if found.status == "deprecated" else ""
            named = (f"its replacement is {found.replacement} ({found.chain()})" if found.replacement
                     else "its provider names no replacement")
            out.append(Need("retired", model_id, f"{used_by}.model_id",
                            f"retired on {found.date}{passed} (source: {found.basis}); {named}", stage))
    return out


def lifecycle_notes(cfg: Any) -> list[str]:
    """One line per deprecated hosted model the parameters name (served today, with a shutdown date to come)."""
    from biasaudit.lifecycle import status_of

    seen, out = set(), []
    for model_id, used_by, _ in hosted_models(cfg):
        found = status_of(model_id)
        if found is not None and found.effective() == "deprecated" and model_id not in seen:
            seen.add(model_id)
            out.append(f"{used_by}.model_id: {found.line()}")
    return out


def needs(cfg: Any) -> list[Need]:
    """Everything the parameters `cfg` need that is not in this repository: weights, keys, servers; and
    every retired hosted model they name (which nothing can provide)."""
    out: list[Need] = lifecycle_needs(cfg)
    for name, spec in cfg.models.items():
        out += declared_needs("generator", spec, f"models.{name}", f"generate@{name}")
    f = cfg.faces
    for model in cfg.models:
        stage = f"faces@{model}"
        if f.detector == "insightface" and f.insightface_root != "tiny":
            root = f.insightface_root or str(Path("~/.insightface").expanduser())
            out.append(_weight_need(str(Path(root) / "models" / f.insightface_model), "faces.insightface_root",
                                    stage))
        if f.skin_method == "bisenet":
            out.append(_weight_need(f.bisenet_weights, "faces.bisenet_weights", stage))
        if f.clip_pretrained != "tiny":
            out.append(_clip_need(f.clip_model, f.clip_pretrained, "faces.clip_pretrained", stage))
    out += declared_needs("vlm", cfg.classify.vlm, "classify.vlm", "classify@*")
    for name, spec in cfg.vlms.items():
        out += declared_needs("vlm", spec, f"vlms.{name}", f"reflect@{name}")
    cf = cfg.counterfactuals
    out += declared_needs("editor", cf, "counterfactuals", "counterfactuals")
    if cfg.sources.source == "folder" and not registry.trait("editor", cf.backend, "imports_existing", False):
        out.append(Need("input", cfg.sources.input_dir, "sources.input_dir",
                        f"put licensed source photos under {cfg.sources.input_dir}/<occupation>/<id>.jpg", "sources"))
    out += sheet_needs(cfg)
    unique: dict[tuple[str, str], Need] = {}
    for n in out:  # one line per missing thing; a thing several stages share lists every one of them
        first = unique.get((n.kind, n.what))
        if first is None:
            unique[(n.kind, n.what)] = n
        elif n.stage not in first.stage.split(", "):
            unique[(n.kind, n.what)] = replace(first, stage=f"{first.stage}, {n.stage}")
    return list(unique.values())


def sheet_needs(cfg: Any) -> list[Need]:
    """The raters' filled sheets (docs/raters.md), one per rater at `<sheets dir>/<rater>.csv`
    (contracts.rater_sheets): a copy of the sheet its stage writes there, one column filled. With human raters
    (`reliability.simulate: false`) the annotation sheet's `label` column; with `validate_edits.realism_needed`
    realism_sheet.csv's `realism` column and identity/identity_sheet.csv's `identity` column, 1–5. Missing
    sheets do not stop any stage."""
    rel = cfg.reliability
    ve = cfg.validate_edits
    sheets = [("reliability", "raters", rel.sheets_dir, rel.raters, "annotation_sheet.csv",
               ", then stops until every rater's copy exists: fill its label column")] if not rel.simulate else []
    sheets += [("validate_edits", "realism_raters", C.rating_folder(ve.realism_sheets_dir, m), ve.realism_raters,
                f"{m}_sheet.csv", f" and the blinded images beside it: rate each {what} 1–5")
               for m, what in (("realism", "image's realism"), ("identity", "pair's identity consistency"))
               if ve.realism_needed]
    return [Need("input", path, f"{stage}.{field}", f"put {rater}'s filled copy of {(Path(folder) / sheet).as_posix()} "
                 f"there (the {stage} stage writes that sheet{how}, one copy per rater; docs/raters.md)", stage,
                 blocks_stage=False)
            for stage, field, folder, raters, sheet, how in sheets
            for rater, path in zip(raters, C.rater_sheets(folder, raters))]


def _clip_need(model: str, pretrained: str, used_by: str, stage: str) -> Need:
    if Path(pretrained).suffix or "/" in pretrained:
        return _weight_need(pretrained, used_by, stage)
    try:  # an open_clip tag: its Hub repo in the local cache
        import open_clip

        hub = (open_clip.get_pretrained_cfg(model, pretrained) or {}).get("hf_hub", "").strip("/")
    except Exception:
        hub = ""
    w = BY_NAME["clip-vit-h-14"]
    return Need("weight", f"hf-cache:{hub or pretrained}", used_by,
                f"biasaudit weights fetch --only {w.name}, and set {used_by}: {w.local_path}", stage, None)


# --- checking (offline) ---------------------------------------------------------------------------

def present(need: Need, env: dict[str, str] | None = None, connect_timeout_s: float = 0.5) -> bool:
    env = os.environ if env is None else env
    if need.kind == "retired":
        return False
    if need.kind == "key":
        return bool(env.get(need.what))
    if need.kind == "server":
        return server_up(need.what, connect_timeout_s)
    if need.what.startswith("hf-cache:"):
        return _in_hf_cache(need.what.split(":", 1)[1])
    path = Path(need.what).expanduser()
    if need.weight is not None and need.weight.kind == "zip":
        return path.is_dir() and any(path.glob("*.onnx"))
    if need.kind == "input":  # a folder the stage lists, a file it reads
        return path.exists() and os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0))
    return path.exists()


def _in_hf_cache(repo: str) -> bool:
    try:
        from huggingface_hub import scan_cache_dir

        return any(r.repo_id == repo for r in scan_cache_dir().repos)
    except Exception:
        return False


def server_up(url: str, timeout_s: float = 0.5) -> bool:
    """Whether something listens at the URL's host:port (a TCP connect; local servers only)."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname or "localhost", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def missing(cfg: Any, env: dict[str, str] | None = None, stage: str = "") -> list[Need]:
    """What `cfg` needs and this machine lacks (all of it in one pass; `stage`: only that stage's)."""
    wanted = [n for n in needs(cfg) if not stage or n.for_stage(stage)]
    return [n for n in wanted if not present(n, env)]


# --- list / fetch / verify --------------------------------------------------------------------------

def table_rows(weights: tuple[Weight, ...] = WEIGHTS) -> list[dict[str, str]]:
    lock = read_lock()
    rows = []
    for w in weights:
        pinned = lock.get(w.name, {}).get("commit") or w.revision
        rows.append({"name": w.name, "what": w.what,
                     "source": (f"hf:{w.source}@{pinned}" if w.kind.startswith("hf") else w.source)
                               + (f"; published: {w.published}" if w.published else ""),
                     "size": "hosted: no weights (0 GB)" if w.kind == "hosted" else f"{w.size_gb:g} GB", "licence": w.licence, "gate": w.gate or "-",
                     "local path": w.local_path})
    return rows


def format_table(rows: list[dict[str, str]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['name']}: {r['what']}\n  source:  {r['source']}\n  size:    {r['size']}\n"
                     f"  licence: {r['licence']}\n  gate:    {r['gate']}\n  path:    {r['local path']}")
    return "\n".join(lines)


def read_lock(path: Path = LOCK_FILE) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def sha256_path(path: Path) -> str:
    from biasaudit.pipeline.provenance import sha256_file

    return sha256_file(path, chunk=1 << 24)  # streamed: a 3.9 GB checkpoint is never held in memory


def download_resumable(url: str, dest: Path, sha256: str = "", chunk: int = 1 << 20,
                       timeout_s: float = 60.0, attempts: int = 5) -> str:
    """Download `url` to `dest` through `dest.part`, resuming a partial download with an HTTP Range
    request (a server that ignores it sends the whole file again, which is then written from the start);
    hashed while it streams. A response that ends before the size the server announced (Content-Length of
    a 200, the total of a 206's Content-Range) keeps the part and asks for the rest with another Range
    request, up to `attempts` requests per call; still short after them, it raises and keeps the part for
    the next call. Only a complete file is checked: with a pinned `sha256` a mismatch removes the partial
    file and raises, so nothing unchecked is ever opened. Returns the sha256."""
    import http.client
    import re
    import urllib.error
    import urllib.request

    def announced_total(resp: Any, start: int) -> int | None:
        """The file's full size as this response announces it (None: not said, e.g. chunked)."""
        if resp.status == 206:
            m = re.fullmatch(r"bytes\s+(\d+)-\d+/(\d+|\*)", (resp.headers.get("Content-Range") or "").strip())
            if m:
                if int(m.group(1)) != start:
                    raise ValueError(f"{url}: asked for bytes {start}- but the server sent {m.group(0)}")
                if m.group(2) != "*":
                    return int(m.group(2))
        length = resp.headers.get("Content-Length")
        return start + int(length) if length and length.isdigit() else None

    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    have = part.stat().st_size if part.exists() else 0
    if have:
        with open(part, "rb") as fh:
            for block in iter(lambda: fh.read(chunk), b""):
                h.update(block)
    total: int | None = None
    for _ in range(max(1, attempts)):
        req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            resp = urllib.request.urlopen(req, timeout=timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code != 416 or not have:  # 416: the part is already complete
                raise
            total = None
            break
        with resp:
            if have and resp.status != 206:  # the server sent the whole file: start over
                have, h = 0, hashlib.sha256()
            total = announced_total(resp, have)
            with open(part, "ab" if have else "wb") as out:
                try:
                    while block := resp.read(chunk):
                        out.write(block)
                        h.update(block)
                        have += len(block)
                except (http.client.IncompleteRead, ConnectionError, TimeoutError):
                    pass  # the connection ended early: what arrived is kept, the rest asked for below
        if total is None or have >= total:
            break
    if total is not None and have < total:
        raise OSError(f"{url}: {have:,} of {total:,} bytes after {max(1, attempts)} requests; the partial "
                      f"download is kept at {part} and the next fetch resumes it")
    digest = h.hexdigest()
    if sha256 and digest != sha256:
        part.unlink()
        raise ValueError(f"{url}: sha256 {digest} is not the pinned {sha256} (partial download removed)")
    part.replace(dest)
    return digest


def _files_under(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)


def fetch(weight: Weight, token: str | None = None, lock_path: Path = LOCK_FILE) -> dict[str, Any]:
    """Download one weight into its local path and record commit + sha256 of every file in the lock."""
    if not weight.fetchable:
        raise ValueError(f"{weight.name} is not fetched by biasaudit: {weight.gate}")
    dest = Path(weight.local_path)
    lock = read_lock(lock_path)
    revision = lock.get(weight.name, {}).get("commit") or weight.revision
    entry: dict[str, Any] = {"source": weight.source, "revision": weight.revision}
    if weight.kind in ("hf", "hf-file"):
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download

        api = HfApi(token=token)
        info = api.model_info(weight.source, revision=revision, files_metadata=True, token=token)
        entry["commit"] = info.sha
        if weight.kind == "hf":
            snapshot_download(weight.source, revision=info.sha, local_dir=dest, allow_patterns=list(weight.files),
                              token=token)
            root = dest
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            hf_hub_download(weight.source, weight.files[0], revision=info.sha, local_dir=dest.parent, token=token)
            root = dest.parent
        published = {s.rfilename: getattr(s.lfs, "sha256", None) if s.lfs else None for s in info.siblings or []}
        files = {}
        for p in _files_under(dest):
            rel = p.relative_to(root).as_posix()
            digest = sha256_path(p)
            expected = published.get(rel)
            if expected and expected != digest:
                raise ValueError(f"{weight.name}: {rel} has sha256 {digest}, the Hub publishes {expected}")
            files[rel] = digest
        entry["files"] = files
    elif weight.kind == "zip":
        import zipfile

        dest.mkdir(parents=True, exist_ok=True)
        archive = dest.parent / Path(weight.source).name
        entry["archive_sha256"] = download_resumable(weight.source, archive, weight.sha256)
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = dest / Path(member).name  # the zoo zips have flat or one-folder layouts
                if member.endswith("/"):
                    continue
                target.write_bytes(zf.read(member))
        archive.unlink()
        entry["files"] = {p.name: sha256_path(p) for p in _files_under(dest)}
    lock[weight.name] = entry
    from biasaudit.pipeline.io import atomic_write_json

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(lock_path, lock)
    return entry


def verify(weight: Weight, lock_path: Path = LOCK_FILE) -> tuple[bool, str]:
    """Offline: is every locked file present with its recorded sha256?"""
    path = Path(weight.local_path)
    if not weight.fetchable:
        return True, "not a local file (served elsewhere)"
    if not path.exists():
        return False, f"missing {path}: biasaudit weights fetch --only {weight.name}"
    entry = read_lock(lock_path).get(weight.name)
    if not entry or not entry.get("files"):
        return False, (f"present but not in {lock_path} (no checksums recorded): "
                       f"biasaudit weights fetch --only {weight.name}")
    root = path if weight.kind in ("hf", "zip") else path.parent
    for rel, digest in entry["files"].items():
        p = root / rel
        if not p.is_file():
            return False, f"missing {p}: biasaudit weights fetch --only {weight.name}"
        if sha256_path(p) != digest:
            return False, f"sha256 mismatch for {p}: re-fetch with biasaudit weights fetch --only {weight.name}"
    return True, f"{len(entry['files'])} files verified (commit {entry.get('commit', '-')})"


__all__ = ["BY_NAME", "LOCK_FILE", "MODELS_DIR", "Need", "VLLM_SERVE", "WEIGHTS", "Weight", "download_resumable",
           "fetch", "for_vlm", "format_table", "hosted_models", "lifecycle_needs", "lifecycle_notes", "missing", "needs", "present", "read_lock", "server_up", "table_rows",
           "verify"]
