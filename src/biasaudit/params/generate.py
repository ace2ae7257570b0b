"""Parameters of the generation stage: the `models` table (one generator spec per model) and the
`generate` section (how many images, subsets, retries).

Schema checks here are pure (no files, no network): unknown backends, impossible sizes, missing
backend-specific keys and API-key *values* pasted where an environment-variable *name* belongs all
fail on load with the key named. Checks that need the machine (a local path exists, a hub id is in
the local Hugging Face cache while offline) run in `biasaudit.t2i.generate.preflight` before any work.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from biasaudit import contracts as C
from biasaudit import registry
from biasaudit.params.base import ENV_NAME, Section  # noqa: F401  (ENV_NAME: re-exported)
from biasaudit.registry import backend_reads, check_backend_requirements, check_name

# Any backend registered with @register("generator", name) (biasaudit/registry.py)
Backend = Annotated[str, AfterValidator(check_name("generator"))]
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")

MAX_SIDE = 4096


class PlantedSpec(Section):
    """The `planted` backend (PLANTED truth, not a model): a declared distortion of each prompt's
    benchmark shares and per-label skin-tone distributions (see backends/generators/planted.py).
    The defaults are keyed by the U.S. set's labels; with another group set every per-label key is stated
    (params.Params checks the keys against the active set's labels)."""

    prompts_file: str = "data/t2i/prompts.csv"  # benchmark shares per prompt (the prompts stage output)
    scale: dict[str, float] = Field(default_factory=lambda: {"black": 0.5})  # planted share = benchmark × factor
    receiver: str = "white"  # gets the mass the scaling removed
    L_mean: dict[str, float] = Field(default_factory=lambda: {
        "white": 66.0, "black": 34.0, "asian": 62.0, "hispanic": 52.0, "other": 48.0})
    L_sd: dict[str, float] = Field(default_factory=lambda: {
        "white": 5.0, "black": 5.0, "asian": 5.0, "hispanic": 5.0, "other": 5.0})
    L_range: list[float] = Field(default_factory=lambda: [15.0, 80.0])  # planted L* clipped to this range
    hue_mean: dict[str, float] = Field(default_factory=lambda: {
        "white": 52.0, "black": 58.0, "asian": 64.0, "hispanic": 60.0, "other": 56.0})
    hue_sd: dict[str, float] = Field(default_factory=lambda: {
        "white": 3.0, "black": 3.0, "asian": 3.0, "hispanic": 3.0, "other": 3.0})
    max_crop_factor: float = Field(2.0, ge=1.3, le=6.0)  # crop side at most this × the face box side
    # apparent gender (benchmarks.gender_set): planted share = benchmark (BLS share of women; parity where none)
    # × factor, the removed mass to gender_receiver; {} = no distortion
    gender_scale: dict[str, float] = Field(default_factory=dict)
    gender_receiver: str = "man"

    @model_validator(mode="after")
    def _check(self) -> "PlantedSpec":
        for key in ("L_sd", "hue_mean", "hue_sd"):
            if set(getattr(self, key)) != set(self.L_mean):
                raise ValueError(f"planted.{key}: needs exactly the groups of L_mean {sorted(self.L_mean)}")
        unknown = (set(self.scale) | {self.receiver}) - set(self.L_mean)
        if unknown:
            raise ValueError(f"planted.scale/receiver: unknown group(s) {sorted(unknown)}")
        if self.receiver in self.scale:
            raise ValueError(f"planted.receiver: '{self.receiver}' cannot also be scaled")
        if any(not 0.0 <= v <= 1.0 for v in self.scale.values()):
            raise ValueError("planted.scale: factors must lie in [0, 1] (the removed mass goes to the receiver)")
        if any(v < 0 for v in [*self.L_sd.values(), *self.hue_sd.values()]):
            raise ValueError("planted.L_sd/hue_sd: standard deviations must be ≥ 0")
        if any(not 0.0 <= v <= 1.0 for v in self.gender_scale.values()):
            raise ValueError("planted.gender_scale: factors must lie in [0, 1]")
        if self.gender_receiver in self.gender_scale:
            raise ValueError(f"planted.gender_receiver: '{self.gender_receiver}' cannot also be scaled")
        if len(self.L_range) != 2 or not 0.0 <= self.L_range[0] < self.L_range[1] <= 100.0:
            raise ValueError("planted.L_range: need 0 ≤ low < high ≤ 100")
        return self

    def check_groups(self, groups: tuple[str, ...], genders: tuple[str, ...] = ()) -> None:
        """The per-label keys name exactly the active set's labels, the gender keys the gender set's (called by
        params.Params)."""
        if set(self.L_mean) != set(groups):
            raise ValueError(f"planted.L_mean/L_sd/hue_mean/hue_sd: need exactly the groups {list(groups)} of the "
                             f"active group set (got {sorted(self.L_mean)})")
        unknown = (set(self.gender_scale) | {self.gender_receiver}) - set(genders)
        if genders and unknown:
            raise ValueError(f"planted.gender_scale/gender_receiver: {sorted(unknown)} are not labels of the gender "
                             f"set {list(genders)}")


class GeneratorSpec(Section):
    """One text-to-image generator. Keys that do not apply to its backend keep their defaults."""

    backend: Backend
    # diffusers: hub id or local directory; imagen/openai: the API's model name; folder: a free label.
    model_id: str = ""
    revision: str | None = None  # hub branch/tag/commit (diffusers); recorded as given for APIs
    width: int = Field(1024, ge=16, le=MAX_SIDE)
    height: int = Field(1024, ge=16, le=MAX_SIDE)
    # --- diffusers / tiny ---
    pipeline: Literal["auto", "sd3", "flux"] = "auto"  # diffusers class; auto reads model_index.json
    architecture: Literal["sd3", "flux"] | None = None  # tiny: which random-weight pipeline to build
    num_inference_steps: int = Field(4, ge=1, le=1000)
    guidance_scale: float = Field(0.0, ge=0.0)
    max_sequence_length: int | None = Field(None, ge=1, le=512)  # T5 tokens (SD3 ≤ 512, Flux-schnell ≤ 256)
    negative_prompt: str | None = None
    device: Literal["auto", "cuda", "mps", "cpu"] = "auto"
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    batch_size: int = Field(1, ge=1, le=256)
    # auto: none / model / sequential from free VRAM and the loaded pipeline's size (recorded per image)
    cpu_offload: Literal["auto", "none", "model", "sequential"] = "none"
    drop_t5: bool = False  # SD3 only: load without text_encoder_3/tokenizer_3 (diffusers' documented T5 drop)
    # NaN / all-black output of a local pipeline is 'failed: numerical'; regenerate with a new seed this often
    numerical_retries: int = Field(0, ge=0, le=5)
    compile: bool = False  # torch.compile the denoiser (worth it for thousands of images on a GPU)
    # --- hosted APIs (imagen, openai) ---
    api_key_env: str | None = None  # NAME of the environment variable holding the key (never the key)
    base_url: str | None = None  # endpoint override (an OpenAI-compatible server, a proxy, a test server)
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(5, ge=0, le=20)  # retries on 429 / 5xx / timeouts, with exponential backoff
    backoff_s: float = Field(2.0, ge=0)  # first backoff; doubles per retry (Retry-After wins when sent)
    max_backoff_s: float = Field(60.0, ge=0)
    requests_per_minute: float = Field(0.0, ge=0)  # client-side pacing; 0 = unpaced
    # imagen (google-genai, Vertex mode: an API key for express mode, or project+location with ADC)
    vertex_project: str | None = None
    vertex_location: str = "us-central1"
    person_generation: Literal["dont_allow", "allow_adult", "allow_all"] = "allow_adult"
    add_watermark: bool = False  # Imagen ignores the seed while the SynthID watermark is on
    enhance_prompt: bool = False  # keep the audit prompt verbatim (no LLM rewriting)
    image_size: Literal["1K", "2K"] = "1K"
    # gemini-image: the model's thinking level ('' = the model's default; Imagen 4 Fast's successor: MINIMAL)
    thinking_level: Literal["", "MINIMAL", "LOW", "MEDIUM", "HIGH"] = ""
    # openai
    quality: str | None = None
    # auto: nothing for gpt-image-* (they reject it and always return base64), b64_json otherwise
    response_format: Literal["auto", "b64_json", "url", "omit"] = "auto"
    # --- folder import ---
    folder: str | None = None  # directory of images
    mapping_csv: str | None = None  # CSV with columns file, prompt_id (optional index)
    # --- planted (PLANTED truth for the offline profile; defaults when the backend is planted) ---
    planted: PlantedSpec | None = None

    @model_validator(mode="after")
    def _check_backend(self) -> "GeneratorSpec":
        b, size = self.backend, (self.width, self.height)
        check_backend_requirements("generator", self)
        multiple = registry.trait("generator", b, "side_multiple", 0)
        for key, side in (("width", self.width), ("height", self.height)) if multiple else ():
            if side % multiple:
                raise ValueError(f"{key}: {side} is not a multiple of {multiple} (VAE factor 8 × patch size 2)")
        by = registry.trait("generator", b, "sizes_by", "")  # an API's own size table, keyed by one spec field
        allowed_sizes = registry.trait("generator", b, "sizes", {}).get(getattr(self, by)) if by else None
        if allowed_sizes is not None and size not in allowed_sizes:
            allowed = ", ".join(f"{w}x{h}" for w, h in sorted(allowed_sizes))
            raise ValueError(f"width/height: {b} ({by} {getattr(self, by)}) makes only {allowed}; got {size[0]}x{size[1]}")
        if self.planted is None and backend_reads("generator", b, "planted"):
            object.__setattr__(self, "planted", PlantedSpec())
        if self.response_format in ("b64_json", "url") and any(
                self.model_id.startswith(p) for p in registry.trait("generator", b, "no_response_format", ())):
            raise ValueError(f"response_format: {self.model_id} does not accept response_format (it always "
                             "returns base64); use 'auto' or 'omit'")
        if self.drop_t5 and (self.pipeline == "flux" or self.architecture == "flux"):
            raise ValueError("drop_t5: only SD3 pipelines run without their T5 encoder (FLUX needs it)")
        if self.cpu_offload not in ("none", "auto") and self.device not in ("auto", "cuda"):
            raise ValueError(f"cpu_offload: needs a CUDA device, but device is '{self.device}'")
        return self

    @property
    def stand_in(self) -> bool:
        return bool(registry.trait("generator", self.backend, "stand_in", False))

    def output_settings(self) -> dict:
        """The keys that change what an image looks like (not how fast or how robustly it is made):
        a change here invalidates earlier images of this model on resume."""
        operational = {"batch_size", "cpu_offload", "numerical_retries", "compile", "api_key_env", "base_url", "timeout_s",
                       "max_retries", "backoff_s", "max_backoff_s", "requests_per_minute", "vertex_project",
                       "vertex_location", "device"}
        out = {k: v for k, v in self.model_dump().items() if k not in operational}
        # keys added later enter the hash only when set, so earlier images stay valid
        if not out.get("drop_t5"):
            out.pop("drop_t5", None)
        if out.get("planted") is None:
            out.pop("planted", None)
        if out.get("response_format") == "auto":  # what 'auto' sends, as the explicit value it replaced
            out["response_format"] = "omit" if self.model_id.startswith("gpt-image") else "b64_json"
        return out


class Generate(Section):
    images_per_prompt: int = Field(2, ge=1, le=10_000)
    limit: int = Field(0, ge=0)  # generate at most this many new images this run (0 = all): a quick look
    retry_failed: bool = True  # re-attempt images that failed (API errors) in an earlier run; refusals stay
    black_threshold: int = Field(8, ge=0, le=255)  # an image whose brightest pixel ≤ this is "safety-filtered"
    prompts_file: str = C.PROMPTS_CSV.as_posix()   # the prompts stage writes it, generate reads it
    images_dir: str = C.IMAGES_DIR.as_posix()      # <images_dir>/<model>/: generate writes, classify/faces/analysis read
    # sharding and the runner (local | ray) are the top-level `execution:` section, shared by the per-image stages


def check_model_names(models: dict[str, GeneratorSpec]) -> dict[str, GeneratorSpec]:
    for name in models:
        if not MODEL_NAME.match(name):
            raise ValueError(f"models.{name}: model names must match {MODEL_NAME.pattern} "
                             "(they become folder and file names)")
    return models


# The top-level `models:` table of params.yaml (name → spec); names become folder and file names.
Models = Annotated[dict[str, GeneratorSpec], AfterValidator(check_model_names)]
