"""REFLECT decision tasks: the questions asked about FOCUS images, and their strict parsing.

Three kinds of question (prompt texts in params `reflect.prompts`, versioned by `prompt_version`):
- 2afc: two variants of the same source photo, labelled A and B (sent in that order, each image after
  its text label "Image A:" / "Image B:", or as one side-by-side composite with the labels printed on
  it: `two_afc_mode` of the VLM, recorded per row); for every task
  (income, education, safety) all C(10, 2) = 45 pairs of a photo's variants, each asked in both orders.
- mcq: one image; salary bracket A–F and education level A–D.
- salary: occupation title, a short biography and the image; an integer annual salary in USD.
Controls (reflect.placebo_*_tasks; counterfactuals.null_edit): placebo 2AFC and MCQ tasks about content
the face edit leaves alone, asked over the group edits exactly like the real tasks (rows placebo True);
and per photo the real tasks about the null edit and the unedited original (2AFC null edit vs original
in both orders; MCQ and salary about each), rows arm null_edit | original, group = arm.

Each question is one work item (a dict, key `item_id`) and becomes one row of
`data/vlm/responses/<vlm>.parquet`:
    item_id, kind, task, occupation, base_id, unit (occupation/base_id), order (0 = first order),
    group_a, group_b, image_a, image_b (2afc) | group, race, gender, image (mcq, salary),
    prompt_version, prompt_sha, options, text (raw answer), choice, value_usd, status (ok | refused |
    failed), reason, option_probs (JSON), tokens_in, tokens_out, from_cache, vlm, backend, model_id,
    revision, decoding (JSON), stand_in, libraries (JSON), created_at (the code's reproducible timestamp),
    answered_at (when the answer came, kept in the answer cache: provenance.answer_time), two_afc_mode (2afc rows),
    prompt_source (the paper's wording, or ours where the paper gives none), arm (counterfactual |
    null_edit | original), placebo (bool). The group analyses read vlm.groups.group_rows only.
Only status 'ok' rows are retained by the analysis; refusals and invalid answers are counted.
"""

from __future__ import annotations

import json
from itertools import combinations
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from biasaudit.backends.vlm.base import FAILED, OK, REFUSED, VLMRequest, VLMResponse
from biasaudit.backends.vlm.parse import parse_choice, parse_usd
from biasaudit.params.vlm import task_name
from biasaudit.pipeline.provenance import library_versions_json, stable_hash, utc_now
from biasaudit.vlm.declared import asked, of_kind
from biasaudit.vlm.groups import CONTROL_ARMS, COUNTERFACTUAL, NULL_EDIT, arm_of, group_code

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.classify import VLMSpec
    from biasaudit.params.vlm import Reflect

TWO_AFC_OPTIONS: tuple[str, ...] = ("A", "B")


def _variants(images: pd.DataFrame) -> pd.DataFrame:
    need = {"occupation", "base_id", "race", "gender", "path"}
    missing = need - set(images.columns)
    if missing:
        raise ValueError(f"image table lacks columns {sorted(missing)}")
    out = images.copy()
    out["arm"] = arm_of(out)
    # a control image (null edit, original) has no race or gender: its group is its arm
    out["group"] = [arm if arm != COUNTERFACTUAL else group_code(r, g)
                    for arm, r, g in zip(out["arm"], out["race"], out["gender"])]
    out["unit"] = out["occupation"] + "/" + out["base_id"]
    return out.sort_values(["occupation", "base_id", "group"]).reset_index(drop=True)


def question_counts(images: pd.DataFrame, params: Reflect) -> pd.Series:
    """How many questions of each kind (2afc, mcq, salary) the REFLECT items of `images` make."""
    return pd.Series([item["kind"] for item in build_items(images, params)], dtype=object).value_counts()


def first_units(images: pd.DataFrame, n: int) -> pd.DataFrame:
    """The images of the first `n` source photos (occupation/base_id in sorted order)."""
    unit = images["occupation"] + "/" + images["base_id"]
    return images[unit.isin(sorted(unit.unique())[:n])]


def two_afc_items(images: pd.DataFrame, tasks: list[str], prompts: dict[str, str], both_orders: bool = True) -> list[dict]:
    """All pairs of each source photo's variants, per task (`prompts`: its question), in one or both orders."""
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
                        "prompt": prompts[task], "options": list(TWO_AFC_OPTIONS), "arm": a["arm"]})
    return items


def control_pair_items(images: pd.DataFrame, tasks: list[str], prompts: dict[str, str],
                       both_orders: bool = True) -> list[dict]:
    """The null-edit control: per photo holding both, the null edit vs the unedited original, per task
    (null edit shown first in order 0). Rows carry arm null_edit."""
    controls = images[arm_of(images).isin(CONTROL_ARMS)]
    if controls.empty:
        return []
    paired = controls.groupby(["occupation", "base_id"]).filter(lambda p: set(arm_of(p)) == set(CONTROL_ARMS))
    # _variants orders a photo's images by group, and 'null_edit' < 'original': the null edit comes first
    return [item | {"arm": NULL_EDIT} for item in two_afc_items(paired, tasks, prompts, both_orders)]


def single_items(images: pd.DataFrame, params: Reflect, placebo: bool = False) -> list[dict]:
    """The asked MCQ and salary-recommendation tasks (the real ones, or the placebo ones), one question per
    image and task, in declared order."""
    singles = [(label, spec) for label, spec in asked(params).items() if spec.kind != "2afc" and spec.placebo == placebo]
    items = []
    for v in _variants(images).to_dict("records") if singles else []:
        common = {"occupation": v["occupation"], "base_id": v["base_id"], "unit": v["unit"], "group": v["group"],
                  "race": v["race"], "gender": v["gender"], "image": v["path"], "arm": v["arm"]}
        stem = f"{v['occupation']}-{v['base_id']}-{v['group']}"
        for label, spec in singles:
            task, prompt = task_name(label), spec.prompt
            if spec.kind == "salary":
                occupation = v["occupation"].replace("_", " ")
                prompt = prompt.format(occupation=occupation, biography=params.prompts.biography.format(occupation=occupation))
            items.append(common | {"item_id": f"{spec.kind}-{task}-{stem}", "kind": spec.kind, "task": task,
                                   "prompt": prompt, "options": sorted(spec.values)})
    return items


def two_afc_prompts(params: Reflect) -> dict[str, str]:
    """The question of each declared 2AFC task, by task name."""
    return {task_name(label): spec.prompt for label, spec in params.task_specs.items() if spec.kind == "2afc"}


def build_items(images: pd.DataFrame, params: Reflect) -> list[dict]:
    """Every question of the `reflect` section (`params`) about the given images: the real tasks and the
    placebo tasks (rows placebo True) about the group edits, and the real tasks about the null-edit
    control's images."""
    arm = arm_of(images)
    edits, controls = images[arm == COUNTERFACTUAL], images[arm.isin(CONTROL_ARMS)]
    prompts, real = two_afc_prompts(params), of_kind(params, "2afc")
    items = two_afc_items(edits, real, prompts, params.both_orders)
    items += single_items(edits, params)
    placebo = two_afc_items(edits, of_kind(params, "2afc", placebo=True), prompts, params.both_orders)
    items += [item | {"placebo": True} for item in placebo + single_items(edits, params, placebo=True)]
    items += control_pair_items(controls, real, prompts, params.both_orders)
    items += single_items(controls, params)
    return items


IMAGE_LABELS: tuple[str, str] = ("Image A:", "Image B:")
TWO_AFC_MODES = ("interleaved", "composite")


COMPOSITE_GAP, COMPOSITE_STRIP = 16, 48  # px between the two tiles; px of the label strip above them


def compose_pair(a: "np.ndarray", b: "np.ndarray", height: int = 512, strip: int = COMPOSITE_STRIP) -> "np.ndarray":
    """Two RGB images side by side at the same height, 'Image A' printed above the left one and
    'Image B' above the right one (black on white), for models that take a single image."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    tiles = []
    for rgb in (a, b):
        img = Image.fromarray(np.asarray(rgb, dtype=np.uint8))
        width = max(1, round(img.width * height / img.height))
        tiles.append(img.resize((width, height), Image.Resampling.LANCZOS))
    gap = COMPOSITE_GAP
    canvas = Image.new("RGB", (tiles[0].width + gap + tiles[1].width, height + strip), "white")
    draw = ImageDraw.Draw(canvas)
    x = 0
    for tile, label in zip(tiles, ("Image A", "Image B")):
        canvas.paste(tile, (x, strip))
        size = int(strip * 0.7)
        while True:  # the label fits above its own tile
            font = ImageFont.load_default(size=size)
            box = draw.textbbox((0, 0), label, font=font)
            if box[2] - box[0] <= 0.9 * tile.width or size <= 6:
                break
            size -= 2
        draw.text((x + (tile.width - (box[2] - box[0])) // 2, (strip - (box[3] - box[1])) // 2 - box[1]), label,
                  fill="black", font=font)
        x += tile.width + gap
    return np.asarray(canvas)


def image_size(path: str) -> tuple[int, int]:
    """(width, height) of an image file, from its header."""
    from PIL import Image

    with Image.open(path) as img:
        return img.size


def sent_side(size: tuple[int, int], face_side: int) -> float:
    """The scale an image of `size` is sent at so that its longer side is at most `face_side` (0 = as is;
    never enlarged): the same rule as the backends' downscaling (base.load_pil)."""
    longest = max(size)
    return 1.0 if not face_side or longest <= face_side else face_side / longest


def composite_height(size_a: tuple[int, int], size_b: tuple[int, int], face_side: int) -> int:
    """The tile height of a composite whose faces keep the resolution a two-image request sends them at:
    each tile's longer side is at most `face_side` (0 = the legacy fixed 512-px tile height)."""
    if not face_side:
        return 512
    return min(max(1, round(s[1] * sent_side(s, face_side))) for s in (size_a, size_b))


def face_px(item: dict, face_side: int, two_afc_mode: str, backend_max_side: int = 0) -> int | None:
    """The effective resolution of one question: the longer side, in pixels, of the smallest face image
    the VLM receives (after our downscaling; composite tiles included). `face_side` 0: the backend's own
    `image_max_side` applies (to the whole composite). None if an image is unreadable."""
    try:
        sizes = [image_size(p) for p in ((item["image_a"], item["image_b"]) if item["kind"] == "2afc"
                                          else (item["image"],))]
    except (OSError, ValueError):
        return None
    if item["kind"] == "2afc" and two_afc_mode == "composite":
        height = composite_height(sizes[0], sizes[1], face_side)
        tiles = [(round(w * height / h), height) for w, h in sizes]
        scale = 1.0 if face_side else sent_side((sum(t[0] for t in tiles) + COMPOSITE_GAP, height + COMPOSITE_STRIP),
                                                 backend_max_side)
        return min(round(max(t) * scale) for t in tiles)
    return min(round(max(s) * sent_side(s, face_side or backend_max_side)) for s in sizes)


def composite_path(image_a: str, image_b: str, out_dir: str, face_side: int = 0) -> str:
    """The composite of (A, B) under `out_dir`, named by both images' sha256 and the tile size (made
    once, reused). Each tile keeps the resolution a two-image request sends its face at (`face_side`)."""
    from pathlib import Path

    from biasaudit.pipeline.images import load_rgb
    from biasaudit.pipeline.provenance import sha256_file

    height = composite_height(image_size(image_a), image_size(image_b), face_side)
    parts: list = [sha256_file(image_a), sha256_file(image_b)] + ([height] if face_side else [])
    out = Path(out_dir) / f"{stable_hash(parts, 24)}.png"
    if not out.exists():
        from PIL import Image

        from biasaudit.pipeline.io import atomic_write_bytes

        a, b = load_rgb(image_a), load_rgb(image_b)
        if not (a.ok and b.ok):
            raise ValueError(f"composite: {a.reason or b.reason}")
        import io

        buf = io.BytesIO()
        Image.fromarray(compose_pair(a.rgb, b.rgb, height=height)).save(buf, format="PNG")
        atomic_write_bytes(out, buf.getvalue())
    return str(out)


def to_request(item: dict, max_tokens: int, two_afc_mode: str = "interleaved", composite_dir: str = "",
               composite_note: str = "", face_side: int = 0) -> VLMRequest:
    """The request of one item. 2AFC: both images, each after its text label ("Image A:", "Image B:"),
    or (composite mode) one side-by-side picture with the labels printed on it. `face_side` > 0: every
    image is sent with its longer side at most `face_side`, and a composite is laid out so that each face
    keeps exactly that resolution (the composite itself is not shrunk): every VLM sees the same pixels per
    face. 0: each backend's own image_max_side."""
    task = f"{item['kind']}:{item['task']}"
    side = face_side if face_side else -1
    if item["kind"] != "2afc":
        return VLMRequest(images=(item["image"],), prompt=item["prompt"], options=tuple(item["options"]),
                          max_tokens=max_tokens, task=task, image_max_side=side)
    if two_afc_mode == "composite":
        if not composite_dir:
            raise ValueError("two_afc_mode 'composite' needs a composite_dir")
        path = composite_path(item["image_a"], item["image_b"], composite_dir, face_side)
        prompt = f"{composite_note} {item['prompt']}".strip()
        return VLMRequest(images=(path,), prompt=prompt, options=tuple(item["options"]), max_tokens=max_tokens,
                          task=task, image_max_side=0 if face_side else -1)
    if two_afc_mode != "interleaved":
        raise ValueError(f"two_afc_mode: '{two_afc_mode}' is not one of {TWO_AFC_MODES}")
    return VLMRequest(images=(item["image_a"], item["image_b"]), prompt=item["prompt"],
                      options=tuple(item["options"]), max_tokens=max_tokens, image_labels=IMAGE_LABELS, task=task,
                      image_max_side=side)


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


def prompt_source(item: dict, params: Reflect) -> str:
    """Where the item's wording comes from (the paper, or our own where the paper gives none: the task's
    declared `source`)."""
    text = params.task_specs[f"{item['kind']}_{item['task']}"].source
    bio = (getattr(params.prompts, "sources", {}) or {}).get("biography")
    if item["kind"] == "salary" and bio:
        text += f"; biography: {bio}"
    return text


def requests_for(items: list[dict], params: Reflect, max_tokens: int, two_afc_mode: str = "interleaved") -> list:
    """(request or None, reason) per item; an item whose composite cannot be made gets a reason."""
    out = []
    for item in items:
        try:
            out.append((to_request(item, max_tokens if item["kind"] != "salary" else params.salary_max_tokens,
                                   two_afc_mode, getattr(params, "composite_dir", ""),
                                   getattr(params.prompts, "two_afc_composite_note", ""),
                                   getattr(params, "face_side", 0)), ""))
        except (ValueError, OSError) as exc:
            out.append((None, f"{type(exc).__name__}: {exc}"[:300]))
    return out


def prefetch(vlm: Any, items: list[dict], params: Reflect, max_tokens: int) -> int:
    """Batch mode: submit every pending item of the stage run at once (CachedVLM.prefetch)."""
    spec: VLMSpec | None = getattr(vlm.backend, "spec", None)  # the answering backend's settings, when it has any
    mode = getattr(spec, "two_afc_mode", "interleaved")
    return vlm.prefetch([r for r, _ in requests_for(items, params, max_tokens, mode) if r is not None])


def make_batch_fn(vlm: Any, vlm_name: str, params: Reflect, max_tokens: int = 16, two_afc_mode: str | None = None):
    """The engine's batch function: ask `vlm` (a CachedVLM) and parse each answer.
    `two_afc_mode` defaults to the backend spec's (interleaved | composite); recorded per 2AFC row."""
    backend = vlm.backend
    spec: VLMSpec | None = getattr(backend, "spec", None)  # the answering backend's settings, when it has any
    mode = two_afc_mode or getattr(spec, "two_afc_mode", "interleaved")
    provenance = {"vlm": vlm_name, "backend": backend.name, "model_id": backend.model_id,
                  "revision": backend.revision, "stand_in": bool(backend.stand_in),
                  "decoding": json.dumps(backend.decoding_params(), sort_keys=True, default=str),
                  "prompt_version": params.prompt_version, "libraries": library_versions_json()}

    def fn(items: list[dict]) -> list[dict]:
        built = requests_for(items, params, max_tokens, mode)
        asked = [i for i, (r, _) in enumerate(built) if r is not None]
        answers = vlm.generate([built[i][0] for i in asked])
        responses: list[VLMResponse] = [VLMResponse("", FAILED, reason) for _, reason in built]
        for i, response in zip(asked, answers):
            responses[i] = response
        records = []
        for item, response in zip(items, responses):
            parsed = interpret(item, response, params.salary_min, params.salary_max)
            record = {k: v for k, v in item.items() if k not in ("prompt", "options")}
            record |= provenance | parsed | {
                "two_afc_mode": mode if item["kind"] == "2afc" else None,
                "prompt_source": prompt_source(item, params),
                "prompt_sha": stable_hash(item["prompt"], 12), "options": "".join(item["options"]),
                "text": response.text, "tokens_in": response.tokens_in, "tokens_out": response.tokens_out,
                "option_probs": json.dumps(response.option_probs) if response.option_probs else None,
                "from_cache": response.from_cache, "answer_status": response.status,
                "via": response.meta.get("via", ""), "created_at": utc_now(),
                "face_px": face_px(item, getattr(params, "face_side", 0), mode,
                                   getattr(getattr(backend, "spec", None), "image_max_side", 0)),
                "answer_mode": response.meta.get("answer_mode", ""),
                "answered_at": response.meta.get("answered_at", ""),
                "model_version": response.meta.get("model_version", "")}
            if response.meta.get("model_mismatch"):
                record["stop_reason"] = response.reason
            records.append(record)
        return records

    return fn


def make_reflect_fn(spec: VLMSpec, cache_path: str, vlm_name: str, params: Reflect, max_tokens: int):
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
                    "libraries", "created_at", "two_afc_mode", "prompt_source", "face_px", "answer_mode", "model_version",
                    "arm", "placebo", "answered_at"]


def responses_frame(records: list[dict]) -> pd.DataFrame:
    """Records → the responses table with every contract column (missing ones empty)."""
    df = pd.DataFrame(records)
    for col in RESPONSE_COLUMNS:
        if col not in df:
            df[col] = None
    df = df[RESPONSE_COLUMNS]
    df["order"] = pd.to_numeric(df["order"]).astype("Int64")
    df["value_usd"] = pd.to_numeric(df["value_usd"], errors="coerce")
    df["arm"] = arm_of(df)
    df["placebo"] = df["placebo"].fillna(False).astype(bool)
    return df.sort_values("item_id").reset_index(drop=True)

