"""reflect@<vlm> on the stage engine, against a local OpenAI-compatible server that fails, then recovers:
`retry_failed` re-asks exactly the questions whose call failed; a swapped image re-asks its questions."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from biasaudit.config import read_yaml, validate
from biasaudit.vlm import focus
from biasaudit.vlm.reflect import run_reflect

from .conftest import ROOT
from .servers_vlm import VLMServer


class LetterServer(VLMServer):
    """Answers every question with 'A' (a valid 2AFC and MCQ option); the failure script is VLMServer's."""

    @staticmethod
    def _image_of(b64: str) -> tuple[str, str]:
        key, _ = VLMServer._image_of(b64)
        return key, "A"


def images(root) -> pd.DataFrame:
    rows = []
    for k, (race, gender) in enumerate((("Black", "woman"), ("White", "man"), ("Asian", "man"))):
        path = focus.focus_path(root, "nurse", "n1", race, gender, ".png")
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((32, 32, 3), 60 + 40 * k, np.uint8)).save(path)
        rows.append({"occupation": "nurse", "base_id": "n1", "race": race, "gender": gender, "path": str(path)})
    return pd.DataFrame(rows)


def config(url: str, retry_failed: bool):
    raw = read_yaml(ROOT / "params.yaml")
    raw["vlms"] = {"srv": {"backend": "openai", "model_id": "srv", "base_url": url, "api_key_env": "NOPE",
                           "concurrency": 1, "constrain": False, "max_retries": 0, "retry_backoff_s": 0.0,
                           "max_tokens": 8}}
    raw["reflect"] = {**raw["reflect"], "tasks": ["2afc_income", "mcq_salary", "mcq_education"], "batch_size": 4,
                      "limit": 0, "retry_failed": retry_failed}
    return validate(raw)


@pytest.mark.slow
def test_a_rerun_reasks_exactly_the_transient_failures_with_or_without_retry_failed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    imgs = images(tmp_path / "focus")
    n_fail = 5
    with LetterServer(script=["500"] * n_fail) as server:
        first = run_reflect("srv", config(server.openai_url, retry_failed=True), imgs, progress=False)
        n_items = len(first["items"])  # 3 pairs × 2 orders + 3 images × 2 MCQs = 12
        assert n_items == 12 and server.calls == n_items
        by = first["responses"].set_index("item_id")
        failed = set(by.index[by["status"] == "failed"])
        assert len(failed) == n_fail and (by.loc[sorted(set(by.index) - failed), "status"] == "ok").all()
        assert first["accounting"]["failed"] == n_fail

        assert first["summary"].transient == n_fail  # HTTP 500 after the retries: transient, asked again

        calls = server.calls  # retry_failed off: transient failures are asked again all the same
        again = run_reflect("srv", config(server.openai_url, retry_failed=False), imgs, progress=False)
        assert server.calls - calls == n_fail  # the recovered server is asked exactly the failed questions
        assert {r["item_id"] for r in again["run"].appended} == failed
        assert again["summary"].retried_transient == n_fail and (again["responses"]["status"] == "ok").all()
        assert again["summary"].transient == 0

        # an image replaced under the same path: exactly the questions about it are asked again
        path = imgs["path"][0]
        Image.fromarray(np.full((32, 32, 3), 250, np.uint8)).save(path)
        os.utime(path, ns=(1, 1))
        swapped = run_reflect("srv", config(server.openai_url, retry_failed=True), imgs, progress=False)
    about = {i["item_id"] for i in swapped["items"] if path in (i.get("image"), i.get("image_a"), i.get("image_b"))}
    assert {r["item_id"] for r in swapped["run"].appended} == about and len(about) == 2 * 2 + 2
    assert swapped["summary"].stale["input"] == len(about)
