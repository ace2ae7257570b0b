"""Pick proxy instances per category and group, and render them into prompts."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from biasaudit.contracts import OCCUPATION_PHRASES

PREFIX = {"occupation": "occ", "geography": "geo", "surname": "sur"}


def load_occupation_phrases(path: Path = OCCUPATION_PHRASES) -> pd.DataFrame:
    phrases = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {"bls_occupation", "phrase", "article", "use"} - set(phrases.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return phrases


def attach_occupation_phrases(bench: pd.DataFrame, phrases: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Join the reviewed phrase mapping; return (usable rows, excluded rows with a reason)."""
    merged = bench.merge(phrases.rename(columns={"bls_occupation": "instance"}), on="instance", how="left")
    unmapped = merged["phrase"].isna()
    if unmapped.any():
        names = ", ".join(merged.loc[unmapped, "instance"].head(5))
        raise ValueError(f"{int(unmapped.sum())} occupations have no entry in {OCCUPATION_PHRASES}: {names} …")
    excluded = merged[merged["use"] != "yes"].assign(reason=lambda d: "phrase mapping use=no: " + d["note"])
    return merged[merged["use"] == "yes"].reset_index(drop=True), excluded


def select_instances(bench: pd.DataFrame, top_k: int, min_size: float,
                     groups: tuple[str, ...]) -> pd.DataFrame:
    """For each group in canonical order (the group set's labels), the top-k instances by that group's share
    among those of at least `min_size` that no earlier group took. Ties break by size, then name."""
    eligible = bench[(bench["size"] >= min_size) & bench[list(groups)].notna().all(axis=1)]
    eligible = eligible.drop_duplicates("instance")
    taken: set[str] = set()
    picks = []
    for group in groups:
        ranked = eligible[~eligible["instance"].isin(taken)].sort_values(
            [group, "size", "instance"], ascending=[False, False, True], kind="mergesort")
        chosen = ranked.head(top_k).assign(selected_for=group)
        chosen["rank_in_group"] = range(1, len(chosen) + 1)
        if len(chosen) < top_k:
            raise ValueError(f"only {len(chosen)} instances left for group '{group}' (top_k={top_k}, "
                             f"min_size={min_size}): lower prompts.min_size or prompts.top_k")
        taken.update(chosen["instance"])
        picks.append(chosen)
    return pd.concat(picks, ignore_index=True)


def select_listed(bench: pd.DataFrame, instances: list[str], groups: tuple[str, ...]) -> pd.DataFrame:
    """An explicit instance list instead of the top-k selection (e.g. a published prompt set), in its order;
    `selected_for` is the group with the largest benchmark share. An instance missing from the table is an
    error naming it."""
    table = bench.drop_duplicates("instance").set_index("instance", drop=False)
    missing = [i for i in instances if i not in table.index]
    if missing:
        raise ValueError(f"{len(missing)} listed instances are not in the benchmark table: {missing[:5]}")
    chosen = table.loc[list(instances)].reset_index(drop=True)
    chosen["selected_for"] = chosen[list(groups)].idxmax(axis=1)
    chosen["rank_in_group"] = chosen.groupby("selected_for").cumcount() + 1
    return chosen


def slug(text: str, max_len: int = 48) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].rstrip("-")
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    return f"{base}-{digest}"


def prompt_id(category: str, instance: str) -> str:
    """Stable id from content, so adding prompts never renames existing images."""
    return f"{PREFIX.get(category, category[:3])}_{slug(instance)}"


def render_prompt(template: str, style_suffix: str, instance: str, article: str = "a") -> str:
    return template.format(instance=instance, article=article) + style_suffix


def build_prompts(selected: dict[str, pd.DataFrame], templates: dict[str, str], style_suffix: str,
                  template_version: str, groups: tuple[str, ...]) -> pd.DataFrame:
    frames = []
    for category, sel in selected.items():
        sel = sel.copy()
        if category == "occupation" and "phrase" in sel:
            text = sel["phrase"]
            article = sel["article"]
        elif category == "surname":
            text = sel["instance"].str.title()
            article = pd.Series("a", index=sel.index)
        else:
            text = sel["instance"]
            article = pd.Series("a", index=sel.index)
        sel["category"] = category
        sel["prompt_id"] = [prompt_id(category, i) for i in sel["instance"]]
        sel["prompt"] = [render_prompt(templates[category], style_suffix, t, a) for t, a in zip(text, article)]
        sel["template_version"] = template_version
        frames.append(sel)
    prompts = pd.concat(frames, ignore_index=True)
    if prompts["prompt_id"].duplicated().any():
        raise ValueError("duplicate prompt ids: " + ", ".join(prompts.loc[prompts["prompt_id"].duplicated(), "prompt_id"]))
    columns = ["prompt_id", "category", "instance", "selected_for", "rank_in_group", "prompt", *groups, "size",
               "median_weekly_earnings_usd", "template_version"]
    if "median_weekly_earnings_usd" not in prompts:
        prompts["median_weekly_earnings_usd"] = float("nan")
    return prompts[columns]
