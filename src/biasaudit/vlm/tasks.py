"""REFLECT decision tasks: the questions asked about FOCUS images, and their strict parsing.

Three kinds of question (prompt texts in params `reflect.prompts`, versioned by `prompt_version`):
- 2afc: two variants of the same source photo, labelled A and B (sent in that order); for every task
  (income, education, safety) all C(10, 2) = 45 pairs of a photo's variants, each asked in both orders.
- mcq: one image; salary bracket A–F and education level A–D.
- salary: occupation title, a short biography and the image; an integer annual salary in USD.

Each question is one work item (a dict, key `item_id`) and becomes one row of
`data/vlm/responses/<vlm>.parquet`:
    item_id, kind, task, occupation, base_id, unit (occupation/base_id), order (0 = first order),
    group_a, group_b, image_a, image_b (2afc) | group, race, gender, image (mcq, salary),
    prompt_version, prompt_sha, options, text (raw answer), choice, value_usd, status (ok | refused |
    failed), reason, option_probs (JSON), tokens_in, tokens_out, from_cache, vlm, backend, model_id,
    revision, decoding (JSON), stand_in, libraries (JSON), created_at.
Only status 'ok' rows are retained by the analysis; refusals and invalid answers are counted.
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import Any

import pandas as pd

from biasaudit.backends.vlm.base import FAILED, OK, REFUSED, VLMRequest, VLMResponse
from biasaudit.backends.vlm.parse import parse_choice, parse_usd
from biasaudit.provenance import library_versions_json, stable_hash, utc_now
from biasaudit.vlm.groups import group_code

MCQ_OPTIONS: dict[str, tuple[str, ...]] = {"salary": tuple("ABCDEF"), "education": tuple("ABCD")}
TWO_AFC_OPTIONS: tuple[str, ...] = ("A", "B")


def _variants(images: pd.DataFrame) -> pd.DataFrame:
    need = {"occupation", "base_id", "race", "gender", "path"}
    missing = need - set(images.columns)
    if missing:
        raise ValueError(f"image table lacks columns {sorted(missing)}")
    out = images.copy()
    out["group"] = [group_code(r, g) for r, g in zip(out["race"], out["gender"])]
    out["unit"] = out["occupation"] + "/" + out["base_id"]
    return out.sort_values(["occupation", "base_id", "group"]).reset_index(drop=True)


def two_afc_items(images: pd.DataFrame, tasks: list[str], prompts: dict[str, str], both_orders: bool = True) -> list[dict]:
    """All pairs of each source photo's variants, per task, in one or both orders."""
    items = []
    for (occ, base), photo in _variants(images).groupby(["occupation", "base_id"], sort=True):
        rows = photo.to_dict("records")
        for task in tasks:
            for x, y in combinations(rows, 2):
                orders = [(x, y), (y, x)] if both_orders else [(x, y)]
                for order, (a, b) in enumerate(orders):
                    items.append({
                        "item_id": f"2afc-{task}-{occ}-{base}-{a['group']}-{b['group']}",
                        "kind": "2afc", "task": task, "occupation": occ, "base_id": base, "unit": a["unit"],
                        "order": order, "group_a": a["group"], "group_b": b["group"],
                        "image_a": a["path"], "image_b": b["path"],
                        "prompt": prompts[task], "options": list(TWO_AFC_OPTIONS)})
    return items


def single_items(images: pd.DataFrame, prompts: Any, kinds: list[str]) -> list[dict]:
    """MCQ (salary, education) and salary-recommendation questions, one per image."""
    items = []
    for v in _variants(images).to_dict("records"):
        common = {"occupation": v["occupation"], "base_id": v["base_id"], "unit": v["unit"], "group": v["group"],
                  "race": v["race"], "gender": v["gender"], "image": v["path"]}
        stem = f"{v['occupation']}-{v['base_id']}-{v['group']}"
        if "mcq" in kinds:
            for task, text in (("salary", prompts.mcq_salary), ("education", prompts.mcq_education)):
                items.append(common | {"item_id": f"mcq-{task}-{stem}", "kind": "mcq", "task": task,
                                       "prompt": text, "options": list(MCQ_OPTIONS[task])})
        if "salary" in kinds:
            occupation = v["occupation"].replace("_", " ")
            bio = prompts.biography.format(occupation=occupation)
            items.append(common | {"item_id": f"salary-salary-{stem}", "kind": "salary", "task": "salary",
                                   "prompt": prompts.salary.format(occupation=occupation, biography=bio),
                                   "options": []})
    return items


def build_items(images: pd.DataFrame, params: Any) -> list[dict]:
    """Every question of the `reflect` section (`params`) about the given images."""
    items = []
    if "2afc" in params.tasks:
        items += two_afc_items(images, params.two_afc_tasks, params.prompts.two_afc, params.both_orders)
    items += single_items(images, params.prompts, [k for k in params.tasks if k != "2afc"])
    return items


def to_request(item: dict, max_tokens: int) -> VLMRequest:
    images = (item["image_a"], item["image_b"]) if item["kind"] == "2afc" else (item["image"],)
    return VLMRequest(images=tuple(images), prompt=item["prompt"], options=tuple(item["options"]),
                      max_tokens=max_tokens)


def interpret(item: dict, response: VLMResponse, salary_min: int, salary_max: int) -> dict[str, Any]:
    """(choice, value_usd, status, reason) of one answer; never raises."""
    out: dict[str, Any] = {"choice": None, "value_usd": None, "status": response.status, "reason": response.reason}
    if response.status != OK:
        return out
    if item["kind"] == "salary":
        value, reason = parse_usd(response.text)
        if value is None:
            status = REFUSED if reason.startswith("refusal") else FAILED
            return out | {"status": status, "reason": reason}
        if not salary_min <= value <= salary_max:
            return out | {"status": FAILED, "reason": f"implausible salary {value} outside [{salary_min}, {salary_max}]"}
        return out | {"value_usd": float(value), "status": OK, "reason": reason}
    choice, reason = parse_choice(response.text, item["options"])
    if choice is None:
        status = REFUSED if reason.startswith("refusal") else FAILED
        return out | {"status": status, "reason": reason}
    return out | {"choice": choice, "status": OK, "reason": ""}


def make_batch_fn(vlm: Any, vlm_name: str, params: Any, max_tokens: int = 16):
    """The engine's batch function: ask `vlm` (a CachedVLM) and parse each answer."""
    backend = vlm.backend
    provenance = {"vlm": vlm_name, "backend": backend.name, "model_id": backend.model_id,
                  "revision": backend.revision, "stand_in": bool(backend.stand_in),
                  "decoding": json.dumps(backend.decoding_params(), sort_keys=True, default=str),
                  "prompt_version": params.prompt_version, "libraries": library_versions_json()}

    def fn(items: list[dict]) -> list[dict]:
        requests = [to_request(item, max_tokens if item["kind"] != "salary" else params.salary_max_tokens)
                    for item in items]
        responses = vlm.generate(requests)
        records = []
        for item, response in zip(items, responses):
            parsed = interpret(item, response, params.salary_min, params.salary_max)
            record = {k: v for k, v in item.items() if k not in ("prompt", "options")}
            record |= provenance | parsed | {
                "prompt_sha": stable_hash(item["prompt"], 12), "options": "".join(item["options"]),
                "text": response.text, "tokens_in": response.tokens_in, "tokens_out": response.tokens_out,
                "option_probs": json.dumps(response.option_probs) if response.option_probs else None,
                "from_cache": response.from_cache, "answer_status": response.status,
                "via": response.meta.get("via", ""), "created_at": utc_now()}
            records.append(record)
        return records

    return fn


def make_reflect_fn(spec: Any, cache_path: str, vlm_name: str, params: Any, max_tokens: int):
    """The batch function built where it runs (the driver, or each Ray actor, with its own backend and
    cache connection); a module-level factory over params models, so a functools.partial pickles."""
    from biasaudit.backends.vlm import CachedVLM, make_vlm_backend

    cached = CachedVLM(make_vlm_backend(spec), cache_path)
    fn = make_batch_fn(cached, vlm_name, params, max_tokens=max_tokens)
    fn.vlm = cached  # type: ignore[attr-defined]
    return fn


RESPONSE_COLUMNS = ["item_id", "kind", "task", "occupation", "base_id", "unit", "order", "group_a", "group_b",
                    "image_a", "image_b", "group", "race", "gender", "image", "prompt_version", "prompt_sha",
                    "options", "text", "choice", "value_usd", "status", "reason", "option_probs", "tokens_in",
                    "tokens_out", "from_cache", "vlm", "backend", "model_id", "revision", "decoding", "stand_in",
                    "libraries", "created_at"]


def responses_frame(records: list[dict]) -> pd.DataFrame:
    """Records → the responses table with every contract column (missing ones empty)."""
    df = pd.DataFrame(records)
    for col in RESPONSE_COLUMNS:
        if col not in df:
            df[col] = None
    df = df[RESPONSE_COLUMNS]
    df["order"] = pd.to_numeric(df["order"]).astype("Int64")
    df["value_usd"] = pd.to_numeric(df["value_usd"], errors="coerce")
    return df.sort_values("item_id").reset_index(drop=True)
