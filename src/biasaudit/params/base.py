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


_TOKEN = re.compile(r"[A-Za-z0-9]+")
_URL_SECRET = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]+:[^/@\s]*@|[?&](key|api_key|apikey|access_token|token|"
                         r"secret|sig|signature|password|auth)=", re.IGNORECASE)


def embeds_secret(value: str) -> bool:
    """True for a string that carries a key inside ordinary text (a model id, a URL, a prompt): a known
    provider prefix at the start of a token, a long token mixing upper case, lower case and digits (a
    lowercase hex digest such as a git revision is not one), or a URL with credentials or a `key=` query."""
    if _URL_SECRET.search(value):
        return True
    for match in re.finditer(r"[A-Za-z0-9_\-\.]+", value):
        word = match.group(0)
        if _KEY_PREFIX.match(word) and len(word) >= 20:
            return True
        for token in _TOKEN.findall(word):
            if len(token) >= 24 and re.search(r"\d", token) and re.search(r"[a-z]", token) and re.search(r"[A-Z]", token):
                return True
    return False


def secret_fields(data: Any, prefix: str = "") -> list[str]:
    """The dotted names of every string (in nested dicts and lists) that embeds a secret."""
    if isinstance(data, str):
        return [prefix] if embeds_secret(data) else []
    if isinstance(data, dict):
        return [f for k, v in data.items() for f in secret_fields(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(data, (list, tuple)):
        return [f for i, v in enumerate(data) for f in secret_fields(v, f"{prefix}[{i}]")]
    return []


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

    @model_validator(mode="after")
    def _no_key_in_any_string(self) -> Any:
        """Every other string of this section (model ids, URLs, prompts, instructions; nested sections
        check their own): a key must not ride along. Runs after the type checks, so they are reported too."""
        def plain(value: Any) -> Any:
            if isinstance(value, Section):
                return None
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        found = [f for name, value in self if not name.endswith("_env") for f in secret_fields(plain(value), name)]
        if found:
            raise ValueError("; ".join(f"{f}: this looks like it contains an API key or credentials (the value is "
                                       "not shown); keys belong in an environment variable named by an *_env field"
                                       for f in found))
        return self

