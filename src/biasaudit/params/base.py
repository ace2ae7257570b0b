"""Base class for parameter sections: unknown keys are errors, values are checked strictly.

Every field whose name ends in `_env` holds the NAME of an environment variable (API keys come only
from the environment). A value shaped like a key itself is rejected by every section, with a message
that names the field but never repeats the value.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Provider key prefixes (OpenAI/Anthropic sk-, Google AIza, GitHub ghp_/gho_/github_pat_, HF hf_, Slack xox…)
_KEY_PREFIX = re.compile(r"^(sk-|sk_|AIza|ghp_|gho_|ghs_|github_pat_|hf_|xox[abpr]-|ya29\.|AKIA)", re.IGNORECASE)


def looks_like_secret(value: Any) -> bool:
    """True for strings shaped like an API key or token: a known provider prefix, or one long run
    (≥ 20 characters) mixing letters and digits without the underscores that separate words in a name."""
    if not isinstance(value, str) or not value:
        return False
    if _KEY_PREFIX.match(value.strip()):
        return True
    for run in re.split(r"[_\s]+", value):
        if len(run) >= 20 and re.search(r"\d", run) and re.search(r"[A-Za-z]", run):
            return True
    return False


_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$", re.IGNORECASE)
_PREFIXED_TOKEN = re.compile(r"(sk-|sk_|AIza|ghp_|gho_|ghs_|github_pat_|hf_|xox[abpr]-|ya29\.|AKIA)[A-Za-z0-9_\-\.]{6,}")


def redact(text: str) -> str:
    """`text` with every secret replaced by '<redacted>': the values of environment variables whose
    names end in KEY, TOKEN, SECRET, PASSWORD or CREDENTIALS, and provider-prefixed tokens. Used on
    every `reason` a backend records (an API error may quote the key it was sent)."""
    if not text:
        return text
    import os

    for name, value in os.environ.items():
        if len(value) >= 8 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "<redacted>")
    return _PREFIXED_TOKEN.sub("<redacted>", text)


def env_name_problem(field: str, value: Any) -> str | None:
    """Why `value` is not a valid environment-variable name for `field` (never quoting it), or None."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return f"{field}: must be the name of an environment variable (a string)"
    if looks_like_secret(value):
        return (f"{field}: this looks like an API key itself; put the key in an environment variable and "
                f"write that variable's NAME here (e.g. GEMINI_API_KEY). The value is not shown.")
    if not ENV_NAME.match(value):
        return (f"{field}: must be the NAME of an environment variable (capitals, digits and '_', "
                f"e.g. GEMINI_API_KEY), never the key itself")
    return None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _env_fields_hold_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            problems = [p for key, value in data.items() if str(key).endswith("_env")
                        for p in [env_name_problem(str(key), value)] if p]
            if problems:
                raise ValueError("; ".join(problems))
        return data
