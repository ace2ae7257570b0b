"""Pick proxy instances per category and group, and render them into prompts.

The selection rule (`select_instances`). For each group, in the group set's order, the `top_k` instances
with the highest score

    score = share × size ** size_weight

among those of at least `min_size` (surname bearers, employed thousands, residents) that no earlier group
took; ties break by size, then name. `share` is the group's benchmark share of the instance and `size`
its total, so `share × size` is the group's count (its bearers / employed / residents).

- `size_weight: 0` (params.yaml, the offline default): by share, the instances where the group is most
  concentrated. With the U.S. tables and `top_k: 10` this picks small, distinctive instances (the surnames
  Stoltzfus, Byler, Gurung, Vue) and, of the instances the paper names, only "nursing assistant" and
  "nail technician".
- `size_weight: 1`: by the group's count, the instances with the most members of the group, which
  favours the largest instances whatever their mix (White takes Smith, Johnson, Williams; Black is left
  Jackson, Thomas, Harris, mostly-White or mixed surnames).
- `size_weight: 0.1` with `min_size` 100 (occupations, thousands) and 50,000 (surnames) (the paper and
  current profiles): by share, tilted towards common instances (a tenfold larger instance counts as a 26%
  larger share). This is the reading of the paper's "the highest-represented occupations, surnames, and
  locations for each racial group" that selects every instance the paper names that the 2025 tables can
  reach (Schmidt, Chen, Kim, Charles; chief executive, computer and information systems manager,
  manicurist (the paper's "nail technician"), nursing assistant, elementary or middle school teacher),
  kept for weights 0.05-0.11 with surname floors 30,000-60,000 (tests/test_prompts.py computes the region).
  "Actor" cannot be reached: BLS suppresses its shares (43 thousand employed in 2025, under the
  50 thousand publication base). `data/reference/occupation_phrases.csv` (`paper_phrase`, with the seed's
  sentence in `paper_line`) maps the paper's wording to the BLS rows, and a named occupation's prompt uses the
  paper's words ("a CEO", "a nail technician"; `occupation_words`); tests/test_prompts.py holds the paper's list.
  The rule is fitted to those named instances, not the paper's documented procedure: docs/prompts.md gives the
  region of weights and floors that reproduces them and `selection_sensitivity` what the choice costs.

`selection_sensitivity` compares what two selections' prompts ask for (benchmark entropy, the share of each
group), so the analysis can say how much the rule matters.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
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
                     groups: tuple[str, ...], size_weight: float = 0.0) -> pd.DataFrame:
    """For each group in canonical order (the group set's labels), the top-k instances by
    `share × size ** size_weight` (0: by the group's share; 1: by its count) among those of at least
    `min_size` that no earlier group took. Ties break by size, then name. The module docstring states the
    rule and the weight that reproduces the paper's named instances."""
    if not 0.0 <= size_weight <= 1.0:
        raise ValueError(f"size_weight must be between 0 (by share) and 1 (by count), got {size_weight}")
    eligible = bench[(bench["size"] >= min_size) & bench[list(groups)].notna().all(axis=1)]
    eligible = eligible.drop_duplicates("instance")
    tilt = eligible["size"].astype(float).clip(lower=0) ** size_weight
    taken: set[str] = set()
    picks = []
    for group in groups:
        scored = eligible.assign(_score=eligible[group] * tilt)
        ranked = scored[~scored["instance"].isin(taken)].sort_values(
            ["_score", "size", "instance"], ascending=[False, False, True], kind="mergesort").drop(columns="_score")
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


def selection_sensitivity(selections: dict[str, dict[str, pd.DataFrame]], groups: tuple[str, ...]) -> pd.DataFrame:
    """How much the selection rule changes what the prompts ask for: one row per (rule, category) with the
    number of instances, the mean entropy (bits) of their benchmark distributions, the mean share of the
    group each was selected for, the mean benchmark share of every group (`mean_<group>`: the mix the
    category's prompts average to), the median size, how many instances it shares with the first rule's
    selection, and `tvd_mix_vs_first`: the TVD between the category's mean benchmark distribution under this
    rule and under the first (how far the yardstick of a category-level TVD moves with the rule).
    `selections`: {rule name: {category: select_instances(...) output}}."""
    rows = []
    first = next(iter(selections.values()), {})
    for rule, by_category in selections.items():
        for category, sel in by_category.items():
            shares = sel[list(groups)].to_numpy(dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                entropy = -np.where(shares > 0, shares * np.log2(shares), 0.0).sum(axis=1)
            own = [row[g] for g, (_, row) in zip(sel["selected_for"], sel.iterrows())]
            base = set(first.get(category, pd.DataFrame(columns=["instance"]))["instance"])
            rows.append({"rule": rule, "category": category, "instances": len(sel),
                         "mean_entropy_bits": float(entropy.mean()) if len(sel) else float("nan"),
                         "mean_own_share": float(np.mean(own)) if own else float("nan"),
                         **{f"mean_{g}": float(sel[g].mean()) for g in groups},
                         "median_size": float(sel["size"].median()),
                         "shared_with_first": int(sel["instance"].isin(base).sum())})
    out = pd.DataFrame(rows)
    if len(out):  # the TVD between the category's benchmark mix under this rule and under the first rule
        mix = [f"mean_{g}" for g in groups]
        first_mix = out.drop_duplicates("category").set_index("category")[mix]
        out["tvd_mix_vs_first"] = [0.5 * float(np.abs(r[mix].to_numpy(float) - first_mix.loc[r["category"]].to_numpy(float)).sum())
                                   for _, r in out.iterrows()]
    return out


# The share rule the fitted rule is compared with: the group's share alone (size_weight 0) and the offline
# defaults' floors (occupation 50 thousand employed, 100,000 residents, 10,000 bearers).
SHARE_RULE = {"size_weight": 0.0, "min_size": {"occupation": 50.0, "geography": 100000.0, "surname": 10000.0}}


def slug(text: str, max_len: int = 48) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:max_len].rstrip("-")
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    return f"{base}-{digest}"


def prompt_id(category: str, instance: str) -> str:
    """Stable id from content, so adding prompts never renames existing images."""
    return f"{PREFIX.get(category, category[:3])}_{slug(instance)}"


def render_prompt(template: str, style_suffix: str, instance: str, article: str = "a") -> str:
    return template.format(instance=instance, article=article) + style_suffix


def paper_article(phrase: str) -> str:
    """The article before one of the paper's occupation phrases: "an" before a vowel letter ("an information
    systems manager", "an actor"), else "a" ("a CEO", "a nail technician")."""
    return "an" if phrase[:1].lower() in "aeiou" else "a"


def occupation_words(sel: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The words and article of each occupation's prompt: the paper's own phrase where the paper names the
    occupation (`paper_phrase` of data/reference/occupation_phrases.csv, with the seed's line in `paper_line`:
    "a CEO", not BLS's "a chief executive"), else the reviewed singular phrase of the BLS title."""
    paper = sel["paper_phrase"].fillna("").astype(str) if "paper_phrase" in sel else pd.Series("", index=sel.index)
    named = paper != ""
    text = sel["phrase"].where(~named, paper)
    article = sel["article"].where(~named, paper.map(paper_article))
    return text, article


def build_prompts(selected: dict[str, pd.DataFrame], templates: dict[str, str], style_suffix: str,
                  template_version: str, groups: tuple[str, ...]) -> pd.DataFrame:
    frames = []
    for category, sel in selected.items():
        sel = sel.copy()
        if category == "occupation" and "phrase" in sel:
            text, article = occupation_words(sel)
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
               "median_weekly_earnings_usd", "pct_women", "template_version"]
    for column in ("median_weekly_earnings_usd", "pct_women"):  # occupations only (BLS tables 39 and 11)
        if column not in prompts:
            prompts[column] = float("nan")
    return prompts[columns]
