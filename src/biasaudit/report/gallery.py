"""Images to look at: thumbnails (small JPEGs, made once), `reports/images.html` (generated images per
model × prompt with label, L*, face box and skin-mask outline) and `reports/focus.html` (each FOCUS
source photo next to its 10 face-only edits, 5 races × 2 genders, with each edit's checks).

Thumbnails live in `reports/thumbs/` (a persistent report-stage output) with an `index.json` of the
inputs each was made from; an unchanged image is not redrawn. Pages are static: relative links, no
network, a few lines of vanilla JS for the filters.
"""

from __future__ import annotations

import hashlib
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from jinja2 import Environment, select_autoescape
from PIL import Image

from biasaudit import contracts as C
from biasaudit.pipeline.io import atomic_write_text
from biasaudit.report.load import fmt, num

RACES = ("Asian", "Black", "Latino", "MiddleEastern", "White")
GENDERS = ("man", "woman")
L_BINS = ((-math.inf, 40, "<40"), (40, 55, "[40,55)"), (55, 70, "[55,70)"), (70, math.inf, ">=70"))


def l_bin(L: Any) -> str:
    x = num(L)
    if math.isnan(x):
        return "none"
    return next(name for lo, hi, name in L_BINS if lo <= x < hi)


# ------------------------------------------------------------------------------------ thumbnails

def _parse_bbox(v: Any) -> tuple[float, float, float, float] | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    try:
        box = json.loads(v) if isinstance(v, str) else list(v)
        return tuple(float(x) for x in box[:4]) if len(box) >= 4 else None  # type: ignore[return-value]
    except (TypeError, ValueError, json.JSONDecodeError):
        return None


class _Masker:
    """The landmark skin mask the faces stage measured (dlib's packaged 68-point model), loaded once."""

    def __init__(self) -> None:
        self._predictor: Any = None
        self.error = ""

    def mask(self, rgb: np.ndarray, bbox: tuple[float, float, float, float]) -> np.ndarray | None:
        if self.error:
            return None
        try:
            import dlib

            from biasaudit.faces.detect import shape_predictor
            from biasaudit.faces.segment import landmark_skin_from_landmarks

            if self._predictor is None:
                self._predictor = shape_predictor()
            x0, y0, x1, y1 = (int(round(v)) for v in bbox)
            shape = self._predictor(np.ascontiguousarray(rgb), dlib.rectangle(x0, y0, x1, y1))
            lm = np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float64)
            return landmark_skin_from_landmarks(rgb.shape[:2], lm)
        except Exception as exc:  # no dlib model: boxes only, and the page says so
            self.error = f"{type(exc).__name__}: {exc}"
            return None


def _key(path: Path, *extra: Any) -> str:
    st = path.stat()
    return hashlib.sha1(json.dumps([st.st_size, st.st_mtime_ns, *extra], default=str).encode()).hexdigest()[:16]


def make_thumb(src: Path, out: Path, px: int, bbox=None, masker: _Masker | None = None) -> str:
    """Write a JPEG thumbnail (longest side `px`) of `src`, with the skin-mask outline and face box
    drawn at full resolution when a bbox is given. Returns '' or the reason it could not."""
    try:
        with Image.open(src) as im:
            rgb = np.asarray(im.convert("RGB"))
    except (OSError, ValueError) as exc:
        return f"unreadable image: {type(exc).__name__}"
    if bbox is not None:
        from biasaudit.faces.segment import outline_overlay

        mask = masker.mask(rgb, bbox) if masker is not None else None
        rgb = outline_overlay(rgb, mask if mask is not None else np.zeros(rgb.shape[:2], bool), bbox)
    img = Image.fromarray(rgb)
    img.thumbnail((px, px), Image.LANCZOS if max(img.size) > px else Image.NEAREST)
    if max(img.size) < px // 2:  # 64-px stand-in images: scale up (pixelated) to be visible
        f = px // max(img.size)
        img = img.resize((img.width * f, img.height * f), Image.NEAREST)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.jpg")
    img.save(tmp, format="JPEG", quality=82, optimize=True)
    tmp.replace(out)
    return ""


class Thumbs:
    """Thumbnails under `thumbs_dir`, remade only when their source (size, mtime, overlay) changed."""

    def __init__(self, thumbs_dir: Path, px: int):
        self.dir, self.px = thumbs_dir, px
        self.index_path = thumbs_dir / "index.json"
        try:
            self.index: dict[str, str] = json.loads(self.index_path.read_text())
        except (OSError, json.JSONDecodeError):
            self.index = {}
        self.used: dict[str, str] = {}
        self.masker = _Masker()
        self.made = 0

    def get(self, src: Path, rel_out: str, bbox=None, mask: bool = True) -> tuple[str, str]:
        """(path relative to thumbs_dir's parent, reason) for the thumbnail of `src`; with a bbox the
        face box is drawn, and the landmark skin mask when `mask`."""
        if not src.is_file():
            return "", "image file missing"
        out = self.dir / rel_out
        key = _key(src, bbox, mask, self.px)
        if self.index.get(rel_out) != key or not out.exists():
            reason = make_thumb(src, out, self.px, bbox, self.masker if mask else None)
            if reason:
                return "", reason
            self.made += 1
        self.used[rel_out] = key
        return f"{self.dir.name}/{rel_out}", ""

    def finish(self) -> None:
        """Drop thumbnails no page uses any more; write the index."""
        for rel in set(self.index) - set(self.used):
            (self.dir / rel).unlink(missing_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.index_path, json.dumps(dict(sorted(self.used.items())), indent=0) + "\n")


# ----------------------------------------------------------------------------------- images.html

def _read_parquets(folder: Path, pattern: str) -> pd.DataFrame:
    frames = []
    for p in sorted(folder.glob(pattern)):
        try:
            frames.append(pd.read_parquet(p))
        except (OSError, ValueError):
            continue
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def t2i_items(root: Path, images_dir: str | Path, prompts_file: str | Path) -> tuple[pd.DataFrame, str]:
    """One row per generated image: model, prompt, category, label, L*, bbox, path, status; or a reason.
    `images_dir` and `prompts_file` are generate.images_dir / generate.prompts_file."""
    manifests = _read_parquets(root / images_dir, C.manifest_path("", "*").as_posix())
    if manifests.empty:
        return manifests, f"no image manifests under {images_dir} (the generate stages have not run)"
    df = manifests[[c for c in ("image_id", "model", "prompt_id", "path", "status", "reason") if c in manifests]].copy()
    labels = _read_parquets(root / C.LABELS_DIR, "*.parquet")
    if not labels.empty and {"image_id", "label"} <= set(labels):
        df = df.merge(labels[["image_id", "label"]].drop_duplicates("image_id"), on="image_id", how="left")
    faces = _read_parquets(root / C.FACES_DIR, "*.parquet")
    if not faces.empty and "image_id" in faces:
        keep = [c for c in ("image_id", "L", "bbox", "status", "skin_backend") if c in faces]
        df = df.merge(faces[keep].drop_duplicates("image_id").rename(columns={"status": "face_status"}),
                      on="image_id", how="left")
    prompts_path = root / prompts_file
    if prompts_path.exists():
        prompts = pd.read_csv(prompts_path)
        keep = [c for c in ("prompt_id", "category", "instance", "selected_for") if c in prompts]
        df = df.merge(prompts[keep], on="prompt_id", how="left")
    for c in ("label", "L", "bbox", "face_status", "skin_backend", "category", "instance", "selected_for"):
        if c not in df:
            df[c] = None
    return df, ""


# `[hidden]` wins over `.group{display:...}`: the filters hide a section (heading and all) by that attribute
PAGE_CSS = """[hidden]{display:none!important}body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 1em 2em;color:#222}
.standin{border:4px solid #b00;color:#b00;padding:.4em .8em;font-weight:700;font-size:1.3em}
.bar{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ccc;z-index:1}
.bar label{margin-right:1em}.grid{display:flex;flex-wrap:wrap;gap:6px}
figure{margin:0;width:164px;font-size:.75em}figure img{display:block;width:160px;height:auto;border:1px solid #ccc}
.group{display:inline-block;vertical-align:top;margin:0 1.2em .4em 0;max-width:100%}
.group h3{font-size:.85em;margin:.8em 0 .3em;max-width:680px}.muted{color:#666}.flag{color:#b00;font-weight:600}
.ok{color:#164}.focus td{vertical-align:top;font-size:.72em;padding:2px 10px 8px 4px;width:144px;max-width:144px;
overflow-wrap:anywhere;border-right:1px solid #e4e4e4}.focus img{width:140px;height:auto}
table.focus{border-collapse:collapse;table-layout:fixed;display:block;max-width:100%;overflow-x:auto}.focus th{font-size:.8em;background:#f3f3f3}
"""

IMAGES_TEMPLATE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>Generated images</title>
<style>{{ css }}</style></head><body>
<p><a href="index.html">← report</a> · <a href="focus.html">FOCUS edits</a></p>
<h1>Generated images, per model × prompt</h1>
{% if stand_in %}<div class="standin">STAND-IN RUN: PLANTED-truth images (recoloured public-domain photos with declared labels and skin tones) or random-weight stand-ins; they show no real model's output.</div>{% endif %}
<p>Caption: classified label · skin L* (face box in red, the measured skin-mask outline in green).
{{ shown }} of {{ total }} images shown (at most {{ per_prompt }} per model × prompt).{% if mask_note %} {{ mask_note }}{% endif %}</p>
{% if reason %}<p><b>No data:</b> {{ reason }}</p>{% else %}
<div class="bar">{% for f in filters %}<label>{{ f.label }} <select data-filter="{{ f.key }}"><option value="">all</option>
{% for v in f.options %}<option>{{ v }}</option>{% endfor %}</select></label>{% endfor %}<span id="count"></span></div>
{% for g in groups %}<section class="group" data-model="{{ g.model }}" data-category="{{ g.category }}">
<h3>{{ g.model }} · {{ g.category }} · {{ g.instance }} <span class="muted">(prompt for {{ g.selected_for }}; {{ g.n }} images)</span></h3>
<div class="grid">{% for it in g.figs %}<figure data-label="{{ it.label }}" data-lbin="{{ it.lbin }}" data-category="{{ g.category }}" data-model="{{ g.model }}">
{% if it.src %}<img src="{{ it.src }}" alt="{{ it.alt }}" width="160" height="160">{% else %}<div class="muted">{{ it.reason }}</div>{% endif %}
<figcaption>{{ it.label }} · L* {{ it.L }}{% if it.status != 'ok' %} · <span class="flag">{{ it.status }}</span>{% endif %}</figcaption></figure>{% endfor %}</div></section>
{% endfor %}{% endif %}
<script>
(function () {
  var selects = document.querySelectorAll('select[data-filter]');
  function apply() {
    var want = {}, shown = 0;
    selects.forEach(function (s) { if (s.value) want[s.dataset.filter] = s.value; });
    document.querySelectorAll('section.group').forEach(function (sec) {
      var any = false;
      sec.querySelectorAll('figure').forEach(function (f) {
        var ok = Object.keys(want).every(function (k) { return f.dataset[k] === want[k]; });
        f.hidden = !ok; if (ok) { any = true; shown++; }
      });
      sec.hidden = !any;
    });
    var c = document.getElementById('count'); if (c) c.textContent = shown + ' images';
  }
  selects.forEach(function (s) { s.addEventListener('change', apply); });
  apply();
})();
</script></body></html>
"""


def build_images_page(root: Path, reports: Path, thumbs: Thumbs, per_prompt: int, stand_in: bool,
                      images_dir: str | Path, prompts_file: str | Path) -> tuple[Path, dict[str, Any]]:
    df, reason = t2i_items(root, images_dir, prompts_file)
    groups = []
    shown = 0
    if not reason:
        df = df.sort_values(["model", "category", "prompt_id", "image_id"], na_position="last")
        for (model, prompt_id), sub in df.groupby(["model", "prompt_id"], sort=False, dropna=False):
            items = []
            for _, r in sub.head(per_prompt).iterrows():
                ok_face = str(r.get("face_status")) == "ok"
                bbox = _parse_bbox(r["bbox"]) if ok_face else None
                # the outline redraws the landmark mask; a BiSeNet mask is not redrawn (box only)
                landmarks = str(r.get("skin_backend") or "landmarks") == "landmarks"
                src, why = thumbs.get(root / str(r["path"]), f"t2i/{model}/{r['image_id']}.jpg", bbox, landmarks)
                label = str(r["label"]) if isinstance(r["label"], str) else "unlabelled"
                items.append({"src": src, "reason": why, "label": label, "lbin": l_bin(r["L"]),
                              "L": fmt(r["L"], 1) if ok_face else "no face",
                              "status": str(r.get("status", "")), "alt": f"{model} {r['image_id']}: {label}"})
            shown += len(items)
            first = sub.iloc[0]
            groups.append({"model": model, "category": first["category"] or "?", "instance": first["instance"] or prompt_id,
                           "selected_for": first["selected_for"] or "?", "n": len(sub), "figs": items})
    filters = [{"key": "model", "label": "model", "options": sorted({g["model"] for g in groups})},
               {"key": "category", "label": "category", "options": sorted({str(g["category"]) for g in groups})},
               {"key": "label", "label": "label", "options": sorted({i["label"] for g in groups for i in g["figs"]})},
               {"key": "lbin", "label": "L* bin", "options": [b[2] for b in L_BINS] + ["none"]}]
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(IMAGES_TEMPLATE).render(
        css=PAGE_CSS, stand_in=stand_in, reason=reason, groups=groups, filters=filters, shown=shown,
        total=0 if reason else len(df), per_prompt=per_prompt,
        mask_note=f"Skin masks not drawn ({thumbs.masker.error})." if thumbs.masker.error else "")
    out = atomic_write_text(reports / "images.html", page)
    return out, {"images_shown": shown, "images_total": 0 if reason else len(df), "reason": reason}


# ------------------------------------------------------------------------------------ focus.html

FOCUS_TEMPLATE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>FOCUS edits</title>
<style>{{ css }}</style></head><body>
<p><a href="index.html">← report</a> · <a href="images.html">generated images</a></p>
<h1>FOCUS: face-only edits of each source photo (5 races × 2 genders)</h1>
{% if stand_in %}<div class="standin">STAND-IN RUN: the "edits" are a tiny recolouring stand-in, not a real image editor.</div>{% endif %}
<p>Per edit: SSIM and ΔE2000 outside the face (the rest of the photo must not change), identity distance
to the source (dlib descriptor), and whether the classifier sees the target race/gender.
<span class="flag">Flags</span> name the checks an edit failed (thresholds: params.yaml validate_edits).</p>
{% if reason %}<p><b>No data:</b> {{ reason }}</p>{% endif %}
{% for p in photos %}<h2 id="{{ p.anchor }}">{{ p.occupation }} / {{ p.base_id }}</h2>
<table class="focus"><tr><th>source</th>{% for r in races %}<th>{{ r }}</th>{% endfor %}</tr>
{% for g in genders %}<tr>{% if loop.first %}<td rowspan="2">{% if p.src %}<img src="{{ p.src }}" alt="source {{ p.base_id }}">{% else %}{{ p.src_reason }}{% endif %}</td>{% endif %}
{% for r in races %}{% set e = p.cells[(r, g)] %}<td>{% if e.src %}<img src="{{ e.src }}" alt="{{ r }} {{ g }}">{% else %}<span class="muted">{{ e.reason }}</span>{% endif %}
<div>{{ g }}</div>{% for line in e.checks %}<div>{{ line }}</div>{% endfor %}
{% if e.flags %}<div class="flag">⚑ {{ e.flags }}</div>{% elif e.src %}<div class="ok">all checks passed</div>{% endif %}</td>{% endfor %}</tr>{% endfor %}
</table>{% endfor %}</body></html>
"""


def focus_items(root: Path) -> tuple[pd.DataFrame, str]:
    checks_path = root / C.EDIT_CHECKS
    manifest_path = root / C.FOCUS_MANIFEST
    for p in (checks_path, manifest_path):
        if p.exists():
            try:
                df = pd.read_parquet(p)
            except (OSError, ValueError):
                continue
            if {"occupation", "base_id", "race", "gender", "path"} <= set(df):
                return df, "" if p == checks_path else "edit checks not found (validate_edits has not run)"
    return pd.DataFrame(), f"no FOCUS edits ({C.EDIT_CHECKS.as_posix()} / {C.FOCUS_MANIFEST.as_posix()} not found)"


def _checks(r: pd.Series) -> list[str]:
    out = []
    if "ssim_outside" in r:
        out.append(f"SSIM out {fmt(r['ssim_outside'], 3)} · ΔE out {fmt(r.get('delta_e_outside'), 2)}")
    if "identity_distance" in r:
        out.append(f"identity d {fmt(r['identity_distance'], 2)}")
    if "race_pred" in r:
        tick = {True: "✓", False: "✗"}
        out.append(f"seen as {r.get('race_pred') or '?'} {tick.get(r.get('target_race_ok'), '?')} / "
                   f"{r.get('gender_pred') or '?'} {tick.get(r.get('target_gender_ok'), '?')}")
    return out


def build_focus_page(root: Path, reports: Path, thumbs: Thumbs, stand_in: bool) -> tuple[Path, dict[str, Any]]:
    df, reason = focus_items(root)
    photos = []
    n_flagged = 0
    if not df.empty:
        for (occ, base), sub in df.groupby(["occupation", "base_id"], sort=True):
            src_path = sub["source_path"].dropna().iloc[0] if "source_path" in sub and sub["source_path"].notna().any() else ""
            src, src_reason = thumbs.get(root / str(src_path), f"focus/{occ}/{base}/source.jpg") if src_path else ("", "source not recorded")
            cells = {}
            for race in RACES:
                for g in GENDERS:
                    e = sub[(sub["race"] == race) & (sub["gender"] == g)]
                    if e.empty:
                        cells[(race, g)] = {"src": "", "reason": "no edit", "checks": [], "flags": ""}
                        continue
                    r = e.iloc[0]
                    s, why = thumbs.get(root / str(r["path"]), f"focus/{occ}/{base}/{race}_{g}.jpg")
                    flags = str(r.get("failed_checks") or "") if "failed_checks" in r else ""
                    if str(r.get("status", "ok")) != "ok":
                        flags = f"{r.get('status')}: {r.get('reason', '')}"
                    n_flagged += bool(flags)
                    cells[(race, g)] = {"src": s, "reason": why, "checks": _checks(r), "flags": flags.replace(",", ", ")}
            photos.append({"occupation": occ, "base_id": base, "anchor": f"{occ}-{base}", "src": src,
                           "src_reason": src_reason, "cells": cells})
    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    page = env.from_string(FOCUS_TEMPLATE).render(css=PAGE_CSS, stand_in=stand_in, reason=reason, photos=photos,
                                                  races=RACES, genders=GENDERS)
    out = atomic_write_text(reports / "focus.html", page)
    return out, {"photos": len(photos), "edits": int(len(df)), "flagged": n_flagged, "reason": reason}


def strip(reports: Path, thumbs_dir: Path, n: int = 8) -> list[dict[str, str]]:
    """A few thumbnails for the front page (first ones of images.html)."""
    out = []
    for p in sorted((thumbs_dir / "t2i").glob("*/*.jpg"))[: n]:
        out.append({"src": p.relative_to(reports).as_posix(), "alt": p.stem})
    return out


def escape(s: str) -> str:
    return html.escape(s)


@dataclass
class GalleryResult:
    images: dict[str, Any]
    focus: dict[str, Any]
    thumbs_made: int


def build_gallery(root: Path, reports: Path, *, images_dir: str | Path, prompts_file: str | Path, px: int,
                  per_prompt: int, stand_in: bool) -> GalleryResult:
    """images.html and focus.html; `images_dir`, `prompts_file` are generate.images_dir / generate.prompts_file,
    `px`, `per_prompt` report.thumb_px / report.thumbs_per_prompt."""
    thumbs = Thumbs(reports / "thumbs", px)
    _, images = build_images_page(root, reports, thumbs, per_prompt, stand_in, images_dir, prompts_file)
    _, focus = build_focus_page(root, reports, thumbs, stand_in)
    thumbs.finish()
    return GalleryResult(images, focus, thumbs.made)
