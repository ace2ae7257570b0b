"""Typed, validated parameters (`params.yaml`) and profile switching.

Every notebook starts with `cfg = load_params()`: an unknown key, a typo or a wrong type stops the
run before any work, with a message naming the key and what is allowed.

    python -m biasaudit.config check            # validate params.yaml
    python -m biasaudit.config profile paper    # switch params.yaml to the published setup
    python -m biasaudit.config profile offline  # back to the offline default
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from biasaudit.params import Params
from biasaudit.params.base import looks_like_secret
from biasaudit.pipeline.secrets import redact_keys

PARAMS_FILE = Path("params.yaml")
PROFILES_DIR = Path("profiles")


class ParamsError(ValueError):
    """Invalid parameters; the message names every offending key."""


def _contains_secret(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_contains_secret(k) or _contains_secret(v) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return any(_contains_secret(v) for v in value)
    return looks_like_secret(value)


def _shown(value: Any) -> str:
    """The offending value for a message, unless it (or anything inside it) is shaped like a key."""
    return "<not shown: looks like a secret>" if _contains_secret(value) else repr(value)


def _describe(error: dict[str, Any], model: type) -> str:
    loc = ".".join("<not shown>" if looks_like_secret(p) else str(p) for p in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, error["loc"][:-1])
        hint = difflib.get_close_matches(str(error["loc"][-1]), allowed, n=1)
        did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
        return f"{loc}: unknown key{did_you_mean}; allowed: {', '.join(sorted(allowed))}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if str(error["loc"][-1] if error["loc"] else "").endswith("_env") or kind == "value_error":
        return f"{loc}: {error['msg'].removeprefix('Value error, ')}"  # our validators' messages name the key; the value may be a secret
    return f"{loc}: {error['msg']} (got {_shown(error.get('input'))})"


def _allowed_keys(model: type, loc: tuple) -> list[str]:
    """Field names of the (sub)model at `loc`, following nested models and dict values."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None:
            return []
        if part in fields:
            current = _submodel(fields[part].annotation)
        else:  # a key of a dict[str, Model]
            current = current
    fields = getattr(current, "model_fields", None)
    return list(fields) if fields else []


def _submodel(annotation: Any) -> Any:
    for arg in getattr(annotation, "__args__", ()) or ():
        if hasattr(arg, "model_fields"):
            return arg
    return annotation


def validate(raw: dict[str, Any]) -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        problems = [redact_keys(_describe(e, Params)) for e in exc.errors()]  # a validator may quote a name: never a key
        raise ParamsError("invalid parameters:\n  - " + "\n  - ".join(problems)) from None


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """libyaml's safe loader when built (the same values, 10x faster), refusing a key repeated in one mapping:
    PyYAML keeps the last silently, DVC's ruamel.yaml refuses the file, so `check` refuses it as DVC does."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}' (first at line {seen[key]}; DVC refuses such a file too)",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def strict_yaml(text: str, where: str | Path) -> Any:
    """The YAML document `text`; a ParamsError naming the file `where`, the line and the problem (a syntax
    error, a duplicate key) instead of a traceback."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = f", line {mark.line + 1}" if mark is not None else ""
        what = " ".join(str(getattr(exc, "problem", "") or exc).split())
        raise ParamsError(f"{where}{at}: {what}") from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = strict_yaml(fh.read(), path) or {}
    if not isinstance(data, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return data


def profiles_dir_for(params_path: str | Path) -> Path | None:
    """The profiles/ folder beside `params_path`, else the working directory's, else the project's own
    (None outside a project: nothing to check a profile name against)."""
    for folder in (Path(params_path).parent / PROFILES_DIR, PROFILES_DIR, Path(__file__).resolve().parents[2] / PROFILES_DIR):
        if folder.is_dir():
            return folder
    return None


def check_profile(params: Params, params_path: str | Path) -> Params:
    """`profile:` names the default or a file profiles/<name>.yaml; an unknown name is refused, naming the
    file, the key and the profiles there are (a run under a profile that does not exist would re-run every
    stage under a name that describes nothing)."""
    folder = profiles_dir_for(params_path)
    if params.profile == DEFAULT_PROFILE or folder is None or (folder / f"{params.profile}.yaml").is_file():
        return params
    known = sorted({DEFAULT_PROFILE, *(p.stem for p in folder.glob("*.yaml"))})
    raise ParamsError(redact_keys(f"invalid parameters:\n  - {params_path}: profile: unknown profile "
                                  f"'{params.profile}' (no {folder.as_posix()}/{params.profile}.yaml); "
                                  f"available: {', '.join(known)}"))


def load_params(path: str | Path = PARAMS_FILE) -> Params:
    return check_profile(validate(read_yaml(path)), path)


# --- profiles: params.yaml is the default (offline) profile; profiles/<name>.yaml lists only the
# dotted keys whose values differ from it. Applying a profile overwrites those keys in place (so
# comments in params.yaml survive) and keeps the values it replaced in .params-restore.yaml next to
# params.yaml, so switching back gives params.yaml back byte for byte.

DEFAULT_PROFILE = "offline"


def _restore_path(params_path: str | Path) -> Path:
    return Path(params_path).with_name(".params-restore.yaml")


def _node(doc: Any, dotted: str) -> tuple[Any, str]:
    *parents, leaf = dotted.split(".")
    node = doc
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            raise ParamsError(f"profile key '{dotted}': '{part}' does not exist in params.yaml")
        node = node[part]
    if not isinstance(node, dict) or leaf not in node:
        raise ParamsError(f"profile key '{dotted}': '{leaf}' does not exist in params.yaml")
    return node, leaf


def _set_dotted(doc: Any, dotted: str, value: Any) -> None:
    node, leaf = _node(doc, dotted)
    node[leaf] = value


def _get_dotted(doc: Any, dotted: str) -> Any:
    node, leaf = _node(doc, dotted)
    return node[leaf]


def _round_trip_yaml():
    from ruamel.yaml import YAML

    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 120
    return rt


def _dump(rt: Any, doc: Any) -> str:
    from io import StringIO

    buf = StringIO()
    rt.dump(doc, buf)
    return buf.getvalue()


def apply_profile(name: str, params_path: str | Path = PARAMS_FILE,
                  profiles_dir: str | Path = PROFILES_DIR) -> Params:
    """Switch params.yaml to profiles/<name>.yaml: undo the current profile, then overwrite the keys
    the new profile lists; validate before writing anything.

    Undo is exact: .params-restore.yaml keeps the text params.yaml had before the profile was applied
    and is used as is when params.yaml has not been edited since. After an edit, only the profile's
    keys are put back (with their default values; formatting of those keys may change)."""
    import hashlib

    from biasaudit.pipeline.io import atomic_write_text

    profile_path = Path(profiles_dir) / f"{name}.yaml"
    if not profile_path.exists():
        known = sorted(p.stem for p in Path(profiles_dir).glob("*.yaml"))
        raise ParamsError(redact_keys(f"unknown profile '{name}'; available: {', '.join(known)}"))
    overrides = read_yaml(profile_path)
    sha = lambda text: hashlib.sha256(text.encode("utf-8")).hexdigest()  # noqa: E731
    text = Path(params_path).read_text(encoding="utf-8")
    current = (yaml.safe_load(text) or {}).get("profile", DEFAULT_PROFILE)
    restore_path = _restore_path(params_path)
    rt = _round_trip_yaml()
    if current != DEFAULT_PROFILE:  # undo the current profile
        saved = read_yaml(restore_path) if restore_path.exists() else {}
        if saved.get("profile") != current:
            raise ParamsError(f"params.yaml is in profile '{current}' but {restore_path} (what it replaced) is missing "
                              f"or belongs to another profile; restore params.yaml (git checkout params.yaml)")
        if saved.get("applied_sha256") == sha(text):
            text = saved["default_text"]
        else:
            doc = rt.load(text)
            for dotted, value in (saved.get("restore") or {}).items():
                _set_dotted(doc, dotted, value)
            doc["profile"] = DEFAULT_PROFILE
            text = _dump(rt, doc)
    default_text = text
    if overrides or name != DEFAULT_PROFILE:
        doc = rt.load(default_text)
        restore = {dotted: yaml.safe_load(_dump(rt, {"v": _get_dotted(doc, dotted)}))["v"] for dotted in overrides}
        for dotted, value in overrides.items():
            _set_dotted(doc, dotted, value)
        doc["profile"] = name
        text = _dump(rt, doc)
    params = validate(yaml.safe_load(text))
    if text != default_text:
        atomic_write_text(restore_path, yaml.safe_dump({"profile": name, "applied_sha256": sha(text),
                                                        "restore": restore, "default_text": default_text},
                                                       sort_keys=False, allow_unicode=True, width=1000))
        atomic_write_text(params_path, text)
    else:  # back to the defaults: params.yaml first, so a kill between the two never leaves a profile without its undo
        atomic_write_text(params_path, text)
        restore_path.unlink(missing_ok=True)
    return params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m biasaudit.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a params file")
    check.add_argument("path", nargs="?", default=str(PARAMS_FILE))
    prof = sub.add_parser("profile", help="switch params.yaml to a profile")
    prof.add_argument("name")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            params = load_params(args.path)
            print(f"{args.path}: valid (profile {params.profile})")

        else:
            apply_profile(args.name)
            print(f"params.yaml now uses profile '{args.name}'")
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
