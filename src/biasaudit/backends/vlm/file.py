"""Labels read from a CSV (human annotations, another tool's output): `file` backend.

The CSV is `model_id` (a path); rows are matched on `file_id_column` against the image file's stem
(image_id) or its path, and the answer is the `file_label_column` value. A missing row is a failed
response with a reason; the label still goes through the same strict parser as a model's answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from biasaudit.backends.vlm.base import OK, OnResult, VLMBackend, VLMRequest, VLMResponse, failed
from biasaudit.pipeline.provenance import sha256_file
from biasaudit.registry import register

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec


@register("vlm", "file")
class FileLabels(VLMBackend):
    name = "file"
    needs = (("input", "model_id", "write the label CSV there"),)
    inputs = ("model_id",)  # fingerprinted by the check stage

    def __init__(self, spec: VLMSpec):
        super().__init__()
        self.spec = spec
        path = Path(spec.model_id)
        if not path.is_file():
            raise FileNotFoundError(f"classify.vlm.model_id: label file {path} does not exist")
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        for col in (spec.file_id_column, spec.file_label_column):
            if col not in table:
                raise ValueError(f"{path}: column '{col}' missing (columns: {list(table.columns)})")
        self.model_id = str(path)
        self.revision = spec.revision or sha256_file(path)[:16]
        self.labels = dict(zip(table[spec.file_id_column], table[spec.file_label_column]))

    def decoding_params(self) -> dict[str, Any]:
        return {"id_column": self.spec.file_id_column, "label_column": self.spec.file_label_column}

    def _one(self, req: VLMRequest) -> VLMResponse:
        if len(req.images) != 1:
            return failed("file backend takes exactly one image per request")
        path = req.images[0]
        for key in (Path(path).stem, path, Path(path).name):
            if key in self.labels:
                return VLMResponse(text=self.labels[key], status=OK)
        return failed(f"no row for {Path(path).stem} in {self.model_id}")

    def generate(self, requests: list[VLMRequest], on_result: OnResult | None = None) -> list[VLMResponse]:
        return self._each(requests, self._one, on_result)
