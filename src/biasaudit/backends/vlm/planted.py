"""`planted`: a SIMULATED VLM for REFLECT (Method B). Not a model; it never looks at the pixels.

For each question it reads the counterfactual's target group, source photo and occupation from the edit
manifest (`data/vlm/focus/manifest.parquet`, found above the image in the FOCUS layout), and answers from
the effects declared in params (`vlms.<name>.planted`: biasaudit.vlm.planted documents the model and the
exact estimands it implies). Every draw is seeded by (seed, task, photo, groups), so a re-run gives the
same answers, and the per-photo random effects are shared by every question about that photo.

It needs the REFLECT task of each request (`VLMRequest.task`, set by vlm/tasks.py; real backends ignore
it) and interleaved 2AFC requests (two images). Lost edits (declared `edit_loss`) fail every question
about them with the reason, as a failed edit would; refusals are answered in words, so the ordinary
parser records them as refusals. A declared selective refusal depends on the answer the VLM would have
given, so the answer is drawn first and the refusal decided after (vlm.planted.draw_refused).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed
from biasaudit.pipeline.provenance import derive_seed, stable_hash
from biasaudit.registry import register
from biasaudit.vlm import planted as P

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec

SIMULATED = "SIMULATED"


@lru_cache(maxsize=8)
def _edits(manifest: str, mtime_ns: int) -> dict[str, dict[str, str]]:
    import pandas as pd

    table = pd.read_parquet(manifest, columns=["path", "occupation", "base_id", "group"])
    return {str(Path(p).resolve()): {"occupation": str(o), "unit": f"{o}/{b}", "group": str(g)}
            for p, o, b, g in zip(table["path"], table["occupation"], table["base_id"], table["group"])}


def edit_of(path: str) -> tuple[dict[str, str] | None, str]:
    """(occupation, unit, group) of a FOCUS image from its manifest, or (None, reason)."""
    image = Path(path).resolve()
    manifest = image.parent.parent.parent / "manifest.parquet"  # <root>/<occupation>/<base_id>/<Race_gender>.jpg
    if not manifest.is_file():
        return None, f"no edit manifest at {manifest} (the planted VLM answers about FOCUS edits only)"
    row = _edits(str(manifest), manifest.stat().st_mtime_ns).get(str(image))
    if row is None:
        return None, f"{path} is not in {manifest}"
    return row, ""


@register("vlm", "planted")
class PlantedVLM(VLMBackend):
    name = "planted"
    stand_in = True
    planted = True  # answers from declared effects whose consequences are computed exactly
    answers_by_identity = True  # the cache keys its answers by image path and task (CachedVLM.key)

    def __init__(self, spec: VLMSpec):
        super().__init__()
        self.spec = spec
        self.planted = spec.planted
        self.model_id = f"{SIMULATED} REFLECT answers from declared effects (not a model)"
        self.revision = "planted v1; effects " + stable_hash(self.planted.model_dump(), 12)

    def decoding_params(self) -> dict[str, Any]:
        return {"planted": self.planted.model_dump()}

    def _rng(self, *parts: Any) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self.planted.seed, *parts))

    def _one(self, req: VLMRequest) -> VLMResponse:
        kind, _, task = req.task.partition(":")
        if not task:
            return failed("the planted VLM needs the REFLECT task of the request (VLMRequest.task)")
        edits = []
        for path in req.images:
            edit, reason = edit_of(path)
            if edit is None:
                return failed(reason)
            edits.append(edit)
        lost = [e for e in edits if P.image_lost(self.planted, e["unit"], e["group"])]
        if lost:
            return failed(f"PLANTED retention loss: the {lost[0]['group']} edit of {lost[0]['unit']} is declared "
                          "lost (edit_loss)")
        groups = [e["group"] for e in edits]
        unit = edits[0]["unit"]
        rng = self._rng("answer", req.task, unit, *groups)
        meta = {"simulated": True, "planted_groups": groups}
        # the refusal's uniform first, then the answer's: the refusal may depend on the would-be answer
        u_refuse, u = rng.random(), rng.random()
        seed, occupation = self.planted.seed, edits[0]["occupation"]
        if kind == "2afc":
            if len(edits) != 2:
                return failed("the planted VLM answers 2AFC with two images (two_afc_mode: interleaved)")
            z = [P.photo_effect(seed, req.task, unit, g) for g in groups]
            text = str(P.draw_2afc(self.planted, task, groups[0], groups[1], z[0], z[1], u))
            extra = P.selective_2afc(self.planted, groups[0], groups[1], text)
        elif kind == "mcq":
            # a task without a declared distribution: each of its options equally likely (vlm.planted.with_letters)
            planted = P.with_letters(self.planted, {req.task.replace(":", "_", 1): dict.fromkeys(req.options, 0.0)})
            letter = int(P.draw_mcq(planted, task, groups[0], P.photo_effect(seed, req.task, unit), u))
            text = P.letters(len(planted.mcq.base[task]))[letter]
            extra = P.selective_single(planted, kind, task, groups[0], occupation, letter)
        elif kind == "salary":
            eps = float(rng.standard_normal())
            usd = int(P.draw_salary(self.planted, occupation, groups[0], P.photo_effect(seed, req.task, unit), eps))
            text, extra = str(usd), P.selective_single(self.planted, kind, task, groups[0], occupation, usd)
        else:
            return failed(f"the planted VLM does not know the task '{req.task}'")
        if P.draw_refused(float(np.mean(P.refusal(self.planted, groups))), extra, u_refuse):
            return VLMResponse(text=P.REFUSAL_TEXT, status=OK, meta=meta)
        return VLMResponse(text=text, status=OK, meta=meta)

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        return self._each(requests, self._one, on_result)
