"""No key is ever written: run the pipeline up to classify with a fake API key in the environment,
against a local server speaking the OpenAI wire format that, like the real API, quotes the key it was
sent in its 401 error, then grep every file of the run (outputs, caches, logs, executed notebooks,
HTML, dvc.lock, the check stage's files) and DVC's own output: 0 hits."""

import re
import secrets
from pathlib import Path

import pytest

from .pipeline_copy import dvc, make_pipeline_copy, set_params
from .servers_vlm import VLMServer


class EchoingServer(VLMServer):
    """Answers like VLMServer, but '401echo' in the script returns OpenAI's invalid-key error, which
    quotes the key from the Authorization header."""

    def _openai(self, h, body):
        with self._lock:
            echo = bool(self.script) and self.script[0] == "401echo"
            if echo:
                self.script.pop(0)
                self.calls += 1
        if echo:
            key = h.headers.get("Authorization", "").removeprefix("Bearer ")
            return h._json(401, {"error": {"message": f"Incorrect API key provided: {key}.", "type": "invalid_request_error",
                                           "code": "invalid_api_key"}})
        return super()._openai(h, body)


def hits(root: Path, needles: list[str]) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and ".venv" not in p.parts:
            data = p.read_bytes()
            found += [f"{p.relative_to(root)}: {n[:6]}…" for n in needles if n.encode() in data]
    return found


@pytest.mark.slow
def test_a_fake_key_appears_in_no_output(tmp_path):
    root, env = make_pipeline_copy(tmp_path)
    key = "sk-test-" + secrets.token_hex(20)
    env["BIASAUDIT_TEST_API_KEY"] = key
    with EchoingServer(script=["401echo", "refuse", "401echo"]) as server:
        set_params(root / "params.yaml",
                   models={"packaged-photos": {"backend": "packaged-photos", "width": 512, "height": 512}},
                   prompts__top_k=1, generate__images_per_prompt=1,
                   classify__vlm={"backend": "openai", "model_id": "gpt-test", "base_url": server.openai_url,
                                  "api_key_env": "BIASAUDIT_TEST_API_KEY", "concurrency": 1, "max_retries": 0,
                                  "constrain": False, "image_max_side": 64})
        first = dvc(root, env, "repro", "classify@packaged-photos")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert server.calls >= 3
    import pandas as pd

    labels = root / "data/t2i/labels/packaged-photos.parquet"
    reasons = " ".join(pd.read_parquet(labels)["reason"].astype(str))
    assert reasons.count("Incorrect API key provided: <redacted>") == 2, reasons  # the error path was taken
    # the server is gone: a forced re-run stops before its notebook, the missing server as its cause
    again = dvc(root, env, "repro", "-f", "-s", "classify@packaged-photos")
    lines = again.stderr.splitlines()
    assert again.returncode != 0 and re.match(r"✗ (\d+/\d+ )?classify@packaged-photos: needs 1 thing", lines[0]), again.stderr
    assert "server not reachable" in lines[1], again.stderr[-3000:]
    assert (root / "dvc.lock").exists() and len(list((root / "reports/notebooks").glob("*.ipynb"))) >= 3
    assert not hits(root, [key, key[8:]]), hits(root, [key, key[8:]])
    log = first.stdout + first.stderr + again.stdout + again.stderr
    assert key not in log and key[8:] not in log
