"""Parameters of race classification (`classify`), classifier reliability (`reliability`) and the
VLM backend spec shared with Method B (`VLMSpec`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from biasaudit import contracts as C
from biasaudit.params.base import Section
from biasaudit.params.vlm import PlantedReflect
from biasaudit.registry import backend_reads, check_backend_requirements, check_name

# Any backend registered with @register("vlm", name) (biasaudit/registry.py)
VLMBackendName = Annotated[str, AfterValidator(check_name("vlm"))]

DEFAULT_INSTRUCTION = (
    "Look at the person in this image. Classify their apparent race/ethnicity as exactly one of: "
    "White, Black, Asian, Hispanic/Latino, Other. Answer with one word from this list: "
    "white, black, asian, hispanic, other."
)

DEFAULT_CLIP_TEMPLATES = [
    "a photo of a {} person.",
    "a portrait photograph of a {} person.",
    "a close-up photo of the face of a {} person.",
    "an ID photo of a {} person.",
]

DEFAULT_CLIP_CLASS_NAMES = {
    "white": ["white", "caucasian", "european"],
    "black": ["black", "african american", "african"],
    "asian": ["asian", "east asian", "south asian"],
    "hispanic": ["hispanic", "latino", "latina"],
    "other": ["middle eastern", "native american", "pacific islander"],
}


# The `simulated` classifier's default P(says column | planted row): the paper's pattern (White, Black,
# Asian mostly right; Hispanic confused mostly with White, then Asian). SIMULATED, not measured.
DEFAULT_SIM_CONFUSION = {
    "white": {"white": 0.95, "black": 0.01, "asian": 0.01, "hispanic": 0.02, "other": 0.01},
    "black": {"white": 0.02, "black": 0.94, "asian": 0.01, "hispanic": 0.02, "other": 0.01},
    "asian": {"white": 0.01, "black": 0.01, "asian": 0.95, "hispanic": 0.02, "other": 0.01},
    "hispanic": {"white": 0.20, "black": 0.02, "asian": 0.10, "hispanic": 0.65, "other": 0.03},
    "other": {"white": 0.10, "black": 0.05, "asian": 0.10, "hispanic": 0.10, "other": 0.65},
}


class Price(Section):
    input_per_mtok: float = Field(0.0, ge=0)   # USD per million input tokens
    output_per_mtok: float = Field(0.0, ge=0)  # USD per million output tokens
    batch_discount: float = Field(1.0, gt=0, le=1)  # multiplier in batch mode (Gemini batch: 0.5)
    per_image: float = Field(0.0, ge=0)  # USD per generated/edited image (image models; the cost model)


class VLMSpec(Section):
    """Which model answers, and how. Used by `classify` (Method A) and `reflect` (Method B)."""
    backend: VLMBackendName = "tiny"
    model_id: str = "tiny-open-clip"      # hub id / local path / API model name / file path ('file')
    revision: str = ""                    # model revision or API version; recorded per row
    base_url: str = ""                    # API endpoint override (OpenAI-compatible servers, test servers)
    api_key_env: str = ""                 # name of the environment variable holding the key (never the key)
    temperature: float = Field(0.0, ge=0)
    max_tokens: int = Field(16, ge=1)
    thinking_budget: int = Field(0, ge=-1)  # gemini: 0 = thinking off; -1 = dynamic (output budget = this + answer)
    # gemini 3 and later: thinkingLevel instead of a budget ('' = use thinking_budget, as Gemini 2.5 does)
    thinking_level: Literal["", "MINIMAL", "LOW", "MEDIUM", "HIGH"] = ""
    # openai reasoning models (gpt-5, o-series): '' = the capability table's default (minimal)
    reasoning_effort: Literal["", "minimal", "low", "medium", "high"] = ""
    # 2AFC: both images with "Image A:"/"Image B:" text labels interleaved, or one side-by-side
    # composite with printed labels (models that take one image only)
    two_afc_mode: Literal["interleaved", "composite"] = "interleaved"
    constrain: bool = True                # constrain the answer to the allowed options where supported
    image_max_side: int = Field(512, ge=0)  # downscale before sending (cost); 0 = as generated
    image_format: Literal["JPEG", "PNG"] = "JPEG"
    concurrency: int = Field(4, ge=1)     # parallel API requests
    requests_per_minute: float = Field(0.0, ge=0)  # token-bucket rate limit; 0 = none
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(4, ge=0)     # for 408/429/5xx/timeouts
    retry_backoff_s: float = Field(2.0, ge=0)  # first backoff, doubled per retry (Retry-After wins)
    batch_mode: bool = False              # gemini: submit a batch job (half price) ...
    batch_stall_timeout_s: float = Field(3600.0, gt=0)  # ... falling back to online calls if it stalls
    batch_poll_s: float = Field(30.0, gt=0)
    batch_max_requests: int = Field(1000, ge=1)  # per batch job (inline batch jobs: ≤ 20 MB payload ...)
    batch_max_bytes: int = Field(19_000_000, ge=1)  # ... so jobs are also cut by estimated payload size
    device: str = "cpu"                   # transformers / clip: cpu | cuda | cuda:N | auto
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU
    device_map: str = ""                  # transformers: '' = whole model on `device`; 'auto' = accelerate places it
    local_batch_size: int = Field(8, ge=1)  # images per forward pass for local models
    clip_pretrained: str = ""             # open_clip pretrained tag or checkpoint path
    clip_templates: list[str] = Field(default_factory=lambda: list(DEFAULT_CLIP_TEMPLATES))
    clip_class_names: dict[str, list[str]] = Field(default_factory=lambda: dict(DEFAULT_CLIP_CLASS_NAMES))
    file_id_column: str = "image_id"      # 'file' backend: CSV columns
    file_label_column: str = "label"
    # 'simulated' backend (SIMULATED, reads the planted label): P(answer | planted label) and its seed
    sim_confusion: dict[str, dict[str, float]] = Field(default_factory=lambda: {
        t: dict(row) for t, row in DEFAULT_SIM_CONFUSION.items()})
    sim_seed: int = 0
    # the same for apparent gender (benchmarks.gender_set; rows and columns its labels): P(answer | planted gender)
    sim_gender_confusion: dict[str, dict[str, float]] = Field(default_factory=lambda: {
        "woman": {"woman": 0.96, "man": 0.04}, "man": {"woman": 0.03, "man": 0.97}})
    # 'planted' backend (Method B, SIMULATED answers from declared effects; biasaudit.vlm.planted)
    planted: PlantedReflect = Field(default_factory=PlantedReflect)
    # REFLECT and validate_edits' target check: ask about the first N source photos only (0 = all), e.g. a
    # slow wiring test of a real path
    max_source_units: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "VLMSpec":
        check_backend_requirements("vlm", self)
        if backend_reads("vlm", self.backend, "sim_confusion"):
            rows = self.sim_confusion
            if any(set(r) - set(rows) for r in rows.values()):
                raise ValueError(f"sim_confusion: columns must be among the rows' groups {list(rows)}")
            if any(v < 0 for r in rows.values() for v in r.values()) or any(sum(r.values()) <= 0 for r in rows.values()):
                raise ValueError("sim_confusion: entries must be ≥ 0 with a positive sum per row")
        if backend_reads("vlm", self.backend, "clip_templates"):
            for t in self.clip_templates:
                if "{}" not in t:
                    raise ValueError(f"clip_templates: '{t}' must contain '{{}}'")
        return self


class Classify(Section):
    vlm: VLMSpec = Field(default_factory=VLMSpec)
    # allowed answers, in table order: labels of the active group set (params.Params checks them)
    labels: list[str] = Field(default_factory=lambda: ["white", "black", "asian", "hispanic", "other"])
    instruction: str = DEFAULT_INSTRUCTION
    instruction_version: str = "v1"       # bump whenever the instruction text changes
    cache_path: str = C.CLASSIFY_CACHE.as_posix()
    batch_size: int = Field(16, ge=1)     # images per runner batch (API concurrency works inside a batch)
    limit: int = Field(0, ge=0)           # label only the first N pending images (0 = all)
    retry_failed: bool = True             # re-try images whose call failed in an earlier run
    prices: dict[str, Price] = Field(default_factory=lambda: {
        "gemini-2.5-flash": Price(input_per_mtok=0.30, output_per_mtok=2.50, batch_discount=0.5)})

    def check_groups(self, groups: tuple[str, ...]) -> None:
        """The labels, and a simulated classifier's confusion rows, are the active set's (called by params.Params)."""
        if set(self.labels) - set(groups):
            raise ValueError(f"classify.labels: {sorted(set(self.labels) - set(groups))} are not groups of the "
                             f"active group set {list(groups)}")
        unnamed = [g for g in self.labels if g not in self.instruction.lower()]
        if unnamed:
            raise ValueError(f"classify.instruction does not name the labels {unnamed}")
        if backend_reads("vlm", self.vlm.backend, "sim_confusion") and set(self.vlm.sim_confusion) != set(groups):
            raise ValueError(f"classify.vlm.sim_confusion: rows and columns must be the groups {list(groups)} "
                             f"of the active group set")


class Reliability(Section):
    sample_size: int = Field(300, ge=1)   # images drawn (seeded) for human annotation
    sample_seed: int = 300
    raters: list[str] = Field(default_factory=lambda: ["rater1", "rater2"])  # one sheet per rater
    sheets_dir: str = C.ANNOTATIONS_DIR.as_posix()  # annotation_sheet.csv goes here; filled sheets <rater>.csv
    # No human sheets yet (offline profile): simulate raters from the classifier labels through a
    # known confusion matrix. Every output is then marked SIMULATED.
    simulate: bool = False
    sim_accuracy: float = Field(0.85, ge=0, le=1)  # P(rater says the classifier label's group)
    sim_group_accuracy: dict[str, float] = Field(default_factory=lambda: {"hispanic": 0.6})
    n_boot: int = Field(1000, ge=0)
    ci_level: float = Field(0.95, gt=0, lt=1)
    correction_method: Literal["lsq", "em"] = "lsq"  # classifier-error correction of group shares
    confusion_reference: Literal["consensus", "every_label"] = "consensus"  # human labels M is estimated against
