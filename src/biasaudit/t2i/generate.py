"""Stage generate@<model>: every prompt → N seeded images of one generator, resumably, with provenance.

    plan → preflight → engine.run_stage(batch_fn) → manifest.parquet + summary.json

* Seeds: `derive_seed(model, prompt_id, index)`; image_id = f"{model}-{prompt_id}-{index:03d}".
* Files: `<images_dir>/<model>/<image_id>.png`, written to a temporary name and renamed; the PNG
  carries its own provenance text chunk (and says "stand-in" where it is one).
* Resumable (biasaudit.pipeline.engine): one JSON line per finished image in `<images_dir>/<model>/log.jsonl`.
  An image is redone when its record was made with other settings (the hash of the spec's output
  settings + model revision), for another prompt text / seed under the same image id, or when its
  file is missing or changed; the manifest is rebuilt from the current records and written
  atomically. A SIGKILL at any moment loses at most the batch in flight.
* Reasons, not crashes: refusals, safety-filtered (black) images and API failures become rows.

    python -m biasaudit.t2i.generate --model planted-a [--limit 10]   # the stage without the notebook
    python -m biasaudit.t2i.generate --model planted-a --shard-index 0 --shard-count 4   # one shard
    python -m biasaudit.t2i.generate --model planted-a --runner ray --ray-address auto   # on a Ray cluster
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from biasaudit import registry
from biasaudit.backends.generators import stage_probe
from biasaudit.backends.generators.base import Generator, GenRequest, GenResult
from biasaudit.config import ParamsError
from biasaudit.lifecycle import status_record
from biasaudit.params import Params
from biasaudit.params.generate import Generate, GeneratorSpec
from biasaudit.pipeline.engine import SETTINGS_FIELD, RunSummary, Stage, StageRun, file_digest, run_stage
from biasaudit.pipeline.io import atomic_path, atomic_write_json, atomic_write_table, remove_stale_temporaries
from biasaudit.pipeline.provenance import (
    answer_time,
    derive_seed,
    library_versions_json,
    run_info,
    sha256_file,
    stable_hash,
    utc_now,
)
from biasaudit.pipeline.scale.cli import add_execution_args, apply_execution_args

MANIFEST_COLUMNS = [
    "image_id", "model", "backend", "model_id", "model_revision", "prompt_id", "prompt", "template_version", "seed",
    "seed_used", "index", "width", "height", "sha256", "path", "status", "reason", "retries", "created_at",
    "libraries", "settings", "extra", "config_hash", "stand_in", "model_version",
    "answered_at",  # when the generator made the image (provenance.answer_time); '' for imported images
    "planted_label", "planted_L", "planted_hue",  # PLANTED truth (planted backend only; empty otherwise)
    "planted_gender",  # PLANTED apparent gender (benchmarks.gender_set; empty when gender is not asked)
]
PLANTED_COLUMNS = ("planted_label", "planted_L", "planted_hue", "planted_gender")


def image_id(model: str, prompt_id: str, index: int) -> str:
    return f"{model}-{prompt_id}-{index:03d}"


def plan_items(prompts: pd.DataFrame, model: str, images_per_prompt: int, spec: GeneratorSpec) -> list[dict[str, Any]]:
    """All images of one model, index-major (image 0 of every prompt first, so a `limit` run covers
    every prompt before it repeats one)."""
    tv = prompts["template_version"] if "template_version" in prompts else pd.Series([""] * len(prompts))
    rows = list(zip(prompts["prompt_id"].astype(str), prompts["prompt"].astype(str), tv.fillna("").astype(str)))
    return [{"image_id": image_id(model, pid, i), "prompt_id": pid, "prompt": text, "template_version": ver,
             "index": i, "seed": derive_seed(model, pid, i), "width": spec.width, "height": spec.height}
            for i in range(images_per_prompt) for pid, text, ver in rows]


# --- checks before any work ---

def preflight(model: str, cfg: Params, prompts: pd.DataFrame | None = None) -> str:
    """Check what the schema cannot (files, environment, local caches); returns the model revision.
    Raises ParamsError naming every offending key."""
    if model not in cfg.models:
        known = ", ".join(sorted(cfg.models)) or "(none)"
        raise ParamsError(f"models: unknown model '{model}'; defined: {known}")
    spec = cfg.models[model]
    key = f"models.{model}"
    problems: list[str] = []
    revision = ""
    if prompts is not None:
        missing = {"prompt_id", "prompt"} - set(prompts.columns)
        if missing:
            problems.append(f"generate.prompts_file: missing column(s) {sorted(missing)}")
        elif prompts["prompt_id"].duplicated().any():
            problems.append("generate.prompts_file: duplicate prompt_id values")
    backend_preflight = getattr(registry.get("generator", spec.backend), "preflight", None)  # the backend's own checks
    if backend_preflight is not None:
        revision, backend_problems = backend_preflight(spec, key, prompts)
        problems += backend_problems
    if problems:
        raise ParamsError(f"generate@{model}: invalid parameters:\n  - " + "\n  - ".join(problems))
    return revision


def first_images_figure(manifest: pd.DataFrame, title: str = "", n: int = 15):
    """The first image of up to `n` prompts in a row (the notebook's look at the outputs); None when
    there is no image. A pyplot-free Figure: displayed once, where the notebook displays it."""
    from matplotlib.figure import Figure
    from PIL import Image

    ok = manifest[(manifest["status"] == "ok") & (manifest["index"] == 0)].head(n) if len(manifest) else manifest
    if not len(ok):
        return None
    fig = Figure(figsize=(1.6 * len(ok), 2.0))
    axes = fig.subplots(1, len(ok), squeeze=False)
    for ax, row in zip(axes[0], ok.itertuples()):
        with Image.open(row.path) as im:
            ax.imshow(im)
        ax.set_title(row.prompt_id.split("_")[0], fontsize=7)
        ax.axis("off")
    if title:
        fig.suptitle(title, color="#b00")
    return fig


def config_hash(spec: GeneratorSpec, revision: str) -> str:
    return stable_hash({"settings": spec.output_settings(), "revision": revision})


# --- the per-batch work ---

def encode_png(rgb: np.ndarray, text: dict[str, str]) -> bytes:
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for k, v in text.items():
        info.add_text(k, v)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG", pnginfo=info, optimize=False)
    return buf.getvalue()


def is_black(rgb: np.ndarray, threshold: int) -> bool:
    """A safety-filtered output: every pixel at or below `threshold` (of 255)."""
    return int(rgb.max()) <= threshold


@dataclass
class BatchContext:
    model: str
    spec: GeneratorSpec
    out_dir: Path
    revision: str
    black_threshold: int
    make: Any  # () -> Generator, called on the first batch only
    generator: Generator | None = None
    retries: int = 0

    def get(self) -> Generator:
        if self.generator is None:
            self.generator = self.make()
        return self.generator


def make_batch_fn(ctx: BatchContext):
    libraries = library_versions_json()

    def batch_fn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        gen = ctx.get()
        requests = [GenRequest(it["image_id"], it["prompt_id"], it["prompt"], it["index"], it["seed"], it["width"],
                               it["height"]) for it in items]
        try:
            results = gen.generate(requests)
        except Exception as exc:
            results = [GenResult.failed(f"{type(exc).__name__}: {exc}"[:500]) for _ in requests]
        settings = json.dumps(gen.settings(), sort_keys=True, default=str)
        records = []
        for it, res in zip(items, results):
            status, reason, digest, rel, (w, h) = res.status, res.reason, "", "", (it["width"], it["height"])
            if status == "ok" and res.rgb is not None:
                if is_black(res.rgb, ctx.black_threshold):
                    status, reason = "refused", f"safety-filtered: black image (max pixel value {int(res.rgb.max())})"
                else:
                    h, w = res.rgb.shape[:2]
                    path = ctx.out_dir / f"{it['image_id']}.png"
                    text = {"biasaudit:image_id": it["image_id"], "biasaudit:model": ctx.model,
                            "biasaudit:model_id": gen.model_id, "biasaudit:revision": gen.revision,
                            "biasaudit:seed": str(it["seed"]), "biasaudit:prompt": it["prompt"]}
                    if gen.stand_in:
                        text["biasaudit:note"] = "STAND-IN: not an image of any real generator"
                    if "planted_label" in res.extra:
                        text["biasaudit:note"] = "PLANTED: recoloured packaged photo with a declared label and L*"
                        text.update({f"biasaudit:{k}": str(res.extra[k]) for k in PLANTED_COLUMNS if k in res.extra})
                    data = encode_png(res.rgb, text)
                    with atomic_path(path) as tmp:
                        tmp.write_bytes(data)
                    digest = sha256_file(path)
                    rel = path.as_posix()
            elif status == "ok":
                status, reason = "failed", "backend returned no image"
            ctx.retries += res.retries
            records.append({
                **{k: it[k] for k in ("image_id", "prompt_id", "prompt", "template_version", "seed", "index")},
                "model": ctx.model, "backend": gen.backend, "model_id": gen.model_id, "model_revision": gen.revision,
                "seed_used": res.seed_used, "width": w, "height": h, "sha256": digest, "path": rel,
                "status": status, "reason": reason, "retries": res.retries, "created_at": utc_now(),
                "libraries": libraries, "settings": settings,
                "extra": json.dumps(res.extra, sort_keys=True, default=str), "stand_in": bool(gen.stand_in),
                "model_version": str(res.extra.get("model_version") or ""),
                "answered_at": "" if gen.imports_existing else answer_time(bool(gen.stand_in)),
                **{k: res.extra.get(k) for k in PLANTED_COLUMNS},
            })
            if res.extra.get("model_mismatch"):
                records[-1]["stop_reason"] = reason
        return records

    return batch_fn


def make_generate_fn(model: str, spec: GeneratorSpec, out_dir: str, revision: str, black_threshold: int,
                     prompt_ids: tuple[str, ...], groups: tuple[str, ...], genders: tuple[str, ...] = ()):
    """The batch function of one model, built where it runs (the driver, or each Ray actor): a
    module-level factory over plain values, so `functools.partial(make_generate_fn, ...)` pickles.
    The generator loads on the first batch; images are written by whoever runs the batch, atomically."""
    def make() -> Generator:
        from biasaudit.backends.generators import make_generator

        return make_generator(model, spec, set(prompt_ids), groups=groups, genders=genders)

    ctx = BatchContext(model, spec, Path(out_dir), revision, black_threshold, make)
    fn = make_batch_fn(ctx)
    fn.ctx = ctx  # type: ignore[attr-defined]
    return fn


# --- resumption and the manifest ---

def item_content(item: dict[str, Any]) -> dict[str, Any]:
    """What an image depends on besides the model's settings: the prompt text, its seed and index."""
    return {k: item[k] for k in ("prompt", "template_version", "seed", "index", "width", "height")}


def file_unchanged(item: dict[str, Any], record: dict[str, Any]) -> bool:
    """An ok record is valid only while its image file is there with the bytes it recorded."""
    return record.get("status") != "ok" or file_digest(record.get("path")) == record.get("sha256")


def build_manifest(run: StageRun) -> pd.DataFrame:
    """The manifest: the current records of the planned images, in plan order (prompt, index)."""
    rows = [r | {"config_hash": r[SETTINGS_FIELD]} for r in run.rows()]
    df = pd.DataFrame(rows, columns=MANIFEST_COLUMNS)
    if len(df):
        df = df.sort_values(["prompt_id", "index"], kind="stable").reset_index(drop=True)
    return df.astype({"seed": "int64", "index": "int64", "width": "int64", "height": "int64", "retries": "int64",
                      "stand_in": "bool", "seed_used": "bool", "planted_L": "float64", "planted_hue": "float64"})


@dataclass
class GenerateResult:
    model: str
    out_dir: Path
    manifest: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    run: StageRun | None = None  # the engine's run (finish() is the stage's last step)


def run_generate(model: str, cfg: Params, progress: bool = True, generator: Generator | None = None
                 ) -> GenerateResult:
    """The whole stage for one model (what the notebook calls)."""
    gp: Generate = cfg.generate
    prompts_path = Path(gp.prompts_file)
    if not prompts_path.is_file():
        raise ParamsError(f"generate.prompts_file: '{prompts_path}' does not exist (run the prompts stage)")
    prompts = pd.read_csv(prompts_path, dtype={"prompt_id": str})
    revision = preflight(model, cfg, prompts)
    spec = cfg.models[model]
    out_dir = Path(gp.images_dir) / model
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    items = plan_items(prompts, model, gp.images_per_prompt, spec)
    ex = cfg.execution
    chash = config_hash(spec, revision)
    batch_size = spec.batch_size if registry.trait("generator", spec.backend, "batches", False) else 1
    if generator is not None:  # an injected generator (tests): the local runner only
        if ex.runner != "local":
            raise ParamsError("execution.runner: an injected generator runs with the local runner only")
        ctx = BatchContext(model, spec, out_dir, revision, gp.black_threshold, lambda: generator)
        fn = make_batch_fn(ctx)
        fn.ctx = ctx  # type: ignore[attr-defined]
        make_fn = lambda: fn  # noqa: E731
    else:
        make_fn = partial(make_generate_fn, model, spec, out_dir.as_posix(), revision, gp.black_threshold,
                          tuple(prompts["prompt_id"].astype(str)), cfg.groups, cfg.genders)
    stage = Stage(f"generate {model}", items, "image_id", chash, make_fn, out_dir / "log.jsonl", item_content,
                  batch_size=batch_size, limit=gp.limit, retry_failed=gp.retry_failed, still_valid=file_unchanged,
                  cpu_bound=bool(registry.trait("generator", spec.backend, "cpu_bound", False)),
                  # a stand-in renderer's images follow its code; a model's are kept (GPU hours, API cost)
                  code=(registry.module_of("generator", spec.backend),)
                  if registry.recomputes_cheaply("generator", spec.backend) else None,
                  probe=None if generator is not None else stage_probe(model, spec))
    run = run_stage(stage, ex, progress)
    for fn_made in run.made:
        if fn_made.ctx.generator is not None and generator is None:
            fn_made.ctx.generator.close()
    manifest = build_manifest(run)
    retries = sum(int(r.get("retries") or 0) for r in run.appended)
    summary = summarize(model, spec, manifest, gp.images_per_prompt, len(prompts), run.summary, retries)
    summary["execution"] = run.execution
    summary["model_lifecycle"] = status_record(spec.model_id, versions=manifest.get("model_version"))
    if run.sharded:
        # one shard: its log (and images) only; the unsharded run that merges the shards writes the manifest
        atomic_write_json(run.log.path.with_suffix(".summary.json"), summary | {"run": run_info(spec.model_dump())})
        return GenerateResult(model, out_dir, manifest, summary, run)
    atomic_write_table(manifest, out_dir / "manifest.parquet")
    atomic_write_json(out_dir / "summary.json", summary | {"run": run_info(spec.model_dump())})
    return GenerateResult(model, out_dir, manifest, summary, run)


def summarize(model: str, spec: GeneratorSpec, manifest: pd.DataFrame, n: int, n_prompts: int, run: RunSummary,
              retries: int) -> dict[str, Any]:
    status = manifest["status"].value_counts().to_dict() if len(manifest) else {}
    ok_per_prompt = manifest[manifest["status"] == "ok"].groupby("prompt_id").size() if len(manifest) else pd.Series()
    first = manifest.iloc[0] if len(manifest) else {}
    return {
        "model": model, "backend": spec.backend, "model_id": first.get("model_id", spec.model_id),
        "model_revision": first.get("model_revision", ""), "stand_in": spec.stand_in,
        "planned": n * n_prompts, "images_per_prompt": n, "prompts": n_prompts,
        "in_manifest": int(len(manifest)), "ok": int(status.get("ok", 0)), "refused": int(status.get("refused", 0)),
        "failed": int(status.get("failed", 0)),
        "prompts_complete": int((ok_per_prompt >= n).sum()),
        "this_run": {"processed": run.processed, "already_done": run.already_done, "other_shards": run.other_shards,
                     "status": run.status_counts, "retries": retries,
                     "dropped_stale_records": {"other_settings": run.stale["settings"],
                                               "other_prompt_or_seed": run.stale["input"],
                                               "file_missing_or_changed": run.stale["output"]}},
    }


def main(argv: list[str] | None = None) -> int:
    from biasaudit.config import load_params, validate

    parser = argparse.ArgumentParser(prog="python -m biasaudit.t2i.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--images-per-prompt", type=int, default=None)
    parser.add_argument("--no-progress", action="store_true")
    add_execution_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params)
        raw = apply_execution_args(cfg.model_dump(), args)
        if args.limit is not None:
            raw["generate"]["limit"] = args.limit
        if args.images_per_prompt is not None:
            raw["generate"]["images_per_prompt"] = args.images_per_prompt
        result = run_generate(args.model, validate(raw), progress=not args.no_progress)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(result.summary, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
