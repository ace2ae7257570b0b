"""`simulated`: a SIMULATED race classifier for PLANTED-truth images (not a model; it never looks).

For an image made by the `planted` generator it reads the planted label from the generate manifest
(`<image folder>/manifest.parquet`, column `planted_label`) and answers with a label drawn from the
declared confusion matrix row of that label, seeded per image (derive_seed(seed, image_id)), so a re-run
gives the same answers. The default matrix follows the paper's pattern of classifier errors: White,
Black and Asian mostly right, Hispanic confused mostly with White and then Asian. Images without a
planted label get a failed response with the reason. It exists so that the downstream statistics
(classifier-error correction above all) can be checked against a known truth.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed
from biasaudit.known_truth import confusion_array
from biasaudit.params.classify import VLMSpec  # at run time: typing.get_type_hints resolves the factories' hints
from biasaudit.pipeline.provenance import derive_seed, stable_hash
from biasaudit.registry import register

SIMULATED = "SIMULATED"


@lru_cache(maxsize=64)
def _planted_labels(manifest: str, mtime: float, column: str = "planted_label") -> dict[str, str]:
    import pandas as pd

    table = pd.read_parquet(manifest)
    if column not in table:
        return {}
    table = table[table[column].notna()]
    return dict(zip(table["image_id"].astype(str), table[column].astype(str)))


def planted_label(path: str, column: str = "planted_label") -> tuple[str | None, str]:
    """(planted label, reason) of an image file from the manifest beside it (`column`: planted_label, or
    planted_gender for the apparent-gender question)."""
    manifest = Path(path).parent / "manifest.parquet"
    if not manifest.is_file():
        return None, f"no manifest beside {path} (the simulated classifier needs PLANTED images)"
    label = _planted_labels(str(manifest), manifest.stat().st_mtime, column).get(Path(path).stem)
    if label is None:
        return None, f"{Path(path).stem} has no planted label ({column}) in {manifest} (not a PLANTED image)"
    return label, ""


@register("vlm", "simulated")
class SimulatedClassifier(VLMBackend):
    name = "simulated"
    stand_in = True
    reads = ("sim_confusion",)
    answers_from_confusion = True  # its answers follow sim_confusion: the raw TVD has an exact estimand

    def __init__(self, spec: VLMSpec, groups: tuple[str, ...] = (), dimension: str = "race"):
        super().__init__()
        if not groups:
            raise ValueError("the simulated classifier needs the active group set's labels (groups=cfg.groups)")
        self.spec, self.groups = spec, tuple(groups)
        # race: the planted label through sim_confusion; gender: the planted gender through sim_gender_confusion
        self.column = "planted_gender" if dimension == "gender" else "planted_label"
        self.M = confusion_array(spec.sim_gender_confusion if dimension == "gender" else spec.sim_confusion, self.groups)
        self.seed = int(spec.sim_seed)
        self.model_id = f"{SIMULATED} classifier: planted label through a declared confusion matrix (not a model)"
        self.revision = "simulated v1; confusion " + stable_hash(self.M.round(6).tolist(), 12)

    def decoding_params(self) -> dict[str, Any]:
        out = {"confusion": self.M.round(6).tolist(), "seed": self.seed, "groups": list(self.groups)}
        return out if self.column == "planted_label" else {**out, "truth": self.column}

    def answer(self, image_id: str, truth: str) -> str:
        key = ("simulated-classifier", image_id) if self.column == "planted_label" else \
            ("simulated-classifier", self.column, image_id)  # race answers stay what they were
        rng = np.random.default_rng(derive_seed(self.seed, *key))
        return self.groups[int(rng.choice(len(self.groups), p=self.M[self.groups.index(truth)]))]

    def _one(self, req: VLMRequest) -> VLMResponse:
        if len(req.images) != 1:
            return failed("the simulated classifier takes exactly one image per request")
        truth, reason = planted_label(req.images[0], self.column)
        if truth is None:
            return failed(reason)
        if truth not in self.groups:
            return failed(f"planted label '{truth}' is not one of {self.groups}")
        return VLMResponse(text=self.answer(Path(req.images[0]).stem, truth), status=OK,
                           meta={"simulated": True, self.column: truth})

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        return self._each(requests, self._one, on_result)
