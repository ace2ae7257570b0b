"""A key pasted into any string parameter (model id, URL, prompt, instruction …) stops validation before
any work, with a message that names the field and never repeats the value."""

import copy

import pytest

from biasaudit.config import ParamsError, read_yaml, validate

from .conftest import ROOT

KEY = "sk-proj-Ab3De5Gh7Jk9Mn1Pq3St5Vx7Zb9Cd1Ef3"


def string_fields(data, path=()):
    if isinstance(data, str):
        yield path
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from string_fields(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from string_fields(v, (*path, i))


def planted(raw, path, value):
    out = copy.deepcopy(raw)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


RAW = read_yaml(ROOT / "params.yaml")
FIELDS = [p for p in string_fields(RAW) if p and p[0] != "profile"]


def test_there_are_many_string_fields():
    assert len(FIELDS) > 60


@pytest.mark.parametrize("mode", ["alone", "inside"])
def test_every_string_field_rejects_a_key(mode):
    leaked, accepted = [], []
    for path in FIELDS:
        node = RAW
        for k in path:
            node = node[k]
        value = KEY if mode == "alone" else f"{node} {KEY}"
        try:
            validate(planted(RAW, path, value))
        except ParamsError as exc:
            if KEY in str(exc):
                leaked.append(path)
            continue
        accepted.append(path)
    assert not leaked, f"messages repeat the key: {leaked[:5]}"
    assert not accepted, f"fields accept a key: {accepted[:10]}"


@pytest.mark.parametrize("url", ["https://user:secret@api.example.org/v1", "http://localhost:8000/v1?key=abc123",
                                 "https://host/v1?api_key=x"])
def test_a_url_with_credentials_is_rejected(url):
    raw = copy.deepcopy(RAW)
    raw["vlms"]["tiny"]["base_url"] = url
    with pytest.raises(ParamsError) as info:
        validate(raw)
    assert "vlms" in str(info.value) and "base_url" in str(info.value) and url not in str(info.value)


KEYS = ("sk-proj-AbCdEf1234567890XyZ", "AIzaSyA1234567890abcdefGHIJklmn", "Ab3dEf6hIj9kLm2nOp5qRs8tUv")


@pytest.mark.parametrize("where", ["vlms", "classify.prices", "models"])
@pytest.mark.parametrize("key", KEYS)
def test_a_name_shaped_like_a_key_is_refused_and_never_echoed(where, key):
    raw = copy.deepcopy(read_yaml(ROOT / "params.yaml"))
    table = raw
    for part in where.split("."):
        table = table[part]
    table[key] = copy.deepcopy(next(iter(table.values())))  # an entry like the first, named by a pasted key
    with pytest.raises(ParamsError) as exc:
        validate(raw)
    assert key not in str(exc.value) and key[4:16] not in str(exc.value)
    assert "<not shown>" in str(exc.value) or "<redacted>" in str(exc.value)
