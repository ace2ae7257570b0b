"""Recognising secrets in strings: API keys and tokens, keys embedded in ordinary text (a model id, a URL,
a prompt), and redacting them from text a backend records. A leaf module: it imports nothing from the
package, so the registry and the params schema can both use it without an import circle."""

from __future__ import annotations

import re
from typing import Any

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


def is_key_shaped(value: Any) -> bool:
    """A name (of a model, a VLM, a price entry) that is, or carries, a key: embeds_secret, which knows
    words; looks_like_secret would take a long model id such as imagen-4.0-fast-generate-001 for one."""
    return isinstance(value, str) and embeds_secret(value)


def redact_keys(text: str) -> str:
    """`text` with every word shaped like a key replaced by '<redacted>' (for messages that quote a
    name or a value someone typed: a key pasted where a name belongs is never echoed)."""
    text = redact(text)
    return re.sub(r"[A-Za-z0-9_\-\.]{12,}", lambda m: "<redacted>" if is_key_shaped(m.group(0)) else m.group(0), text)


def secret_fields(data: Any, prefix: str = "") -> list[str]:
    """The dotted names of every string (in nested dicts and lists) that embeds a secret, and of every
    dict key shaped like one (a VLM, a generator or a price named by a pasted key), that key not shown."""
    if isinstance(data, str):
        return [prefix] if embeds_secret(data) else []
    if isinstance(data, dict):
        def name(k: Any) -> str:
            shown = "<not shown>" if is_key_shaped(k) else str(k)
            return f"{prefix}.{shown}" if prefix else shown

        keys = [name(k) for k in data if is_key_shaped(k)]
        return keys + [f for k, v in data.items() if not is_key_shaped(k) for f in secret_fields(v, name(k))]
    if isinstance(data, (list, tuple)):
        return [f for i, v in enumerate(data) for f in secret_fields(v, f"{prefix}[{i}]")]
    return []
