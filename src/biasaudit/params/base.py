"""Base class for parameter sections: unknown keys are errors, values are checked strictly.

Every field whose name ends in `_env` holds the NAME of an environment variable (API keys come only
from the environment). A value shaped like a key itself is rejected by every section, with a message
that names the field but never repeats the value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from biasaudit.pipeline.secrets import (  # noqa: F401  (re-exported: the schema's and the backends' import path)
    ENV_NAME,
    embeds_secret,
    looks_like_secret,
    redact,
    secret_fields,
)


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

