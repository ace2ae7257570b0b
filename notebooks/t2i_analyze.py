# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Analysis: how far each generator is from the benchmarks, and how it draws skin and faces
#
# This notebook reads the outputs of the earlier stages (prompts, image manifests, race labels,
# face/skin measurements, embeddings, classifier reliability) and writes every figure and table of
# the proxy audit to `reports/t2i/`, plus `reports/t2i/metrics.json` for `dvc metrics show`.
#
# **Uncertainty.** Images of one prompt are not independent draws, so every interval is a
# *cluster bootstrap over prompts* (one engine, `biasaudit.stats.resample`: percentile, basic or BCa;
# pair statistics leave out copy pairs). Every mean TVD comes with its null floor and a bias-corrected
# value; models are compared on the same prompts; p-values of a table are also shown Holm/BH-adjusted.
# The calibration table at the end says how far each interval and test can be trusted. Abstentions (`unknown` labels) are excluded from the
# shares and counted. A section whose inputs are missing says so ("no data" + reason); a section
# whose code belongs to a stage that has not landed yet says "pending".

# %% tags=["parameters"]
# Nothing varies per run: every value comes from params.yaml through stage_params (validated),
# so a run outside DVC reads exactly what `dvc repro` reads.

# %%
from IPython.display import Markdown, display

from biasaudit import contracts as C
from biasaudit.notebook import banner, stage_params
from biasaudit.outputs import OutputWriter, Result
from biasaudit.provenance import run_info
from biasaudit.t2i import analysis as an

cfg, params = stage_params("analyze")
banner(cfg)
boot = an.Boot(params.n_boot, params.ci_level, params.bootstrap_method, cfg.seed, params.p_adjust,
               params.permutation_design)
inputs = an.load_inputs(".", cfg.generate.prompts_file, cfg.generate.images_dir)
writer = OutputWriter(C.T2I_REPORTS, dpi=params.figure_dpi)


def show(result: Result) -> None:
    """Display a section in the notebook and write its files."""
    display(Markdown(f"### {result.title} — *{result.status}*" + (f": {result.reason}" if result.reason else "")))
    for note in result.notes:
        print("note:", note)
    for name, table in result.tables.items():
        print(name)
        display(table.head(30).round(3))
    for fig in result.figures.values():
        display(fig.fig)
    writer.add(result)


# %% [markdown]
# ## What the upstream stages produced
# Counts per stage and model (status, abstentions, missing faces) and the models' ids and revisions.

# %%
print({k: v for k, v in inputs.notes.items()} or "all inputs present")
show(Result("provenance", "Provenance", tables={"provenance_stage_counts": an.stage_counts(inputs),
                                                "provenance_models": an.model_provenance(inputs.manifests)}))

# %% [markdown]
# ## Representation
# Per prompt, the TVD between the classified distribution and the benchmark; per model × category the
# mean over prompts and the TVD of the pooled distributions (paper: 0.452 SD 3.5 Large Turbo, 0.310
# Flux Schnell, 0.312 Imagen 4 Fast overall). Figure 2 plots model share against benchmark share:
# points below the diagonal are under-representation.

# %%
show(an.representation(inputs, boot, params.threshold_group, params.threshold_share))

# %% [markdown]
# ## Skin tone
# L* distributions by label, L* against C*, the share of very dark faces (L* < threshold) classified
# Black, and L* against the occupation's median weekly earnings (OLS, errors clustered by prompt).

# %%
show(an.skin_tone(inputs, boot, params.dark_L_threshold, params.earnings_group, params.earnings_unit_usd))

# %% [markdown]
# ## Homogeneity, reliability, corrected TVD

# %%
show(an.homogeneity(inputs, boot, params.n_permutations, params.min_group_size))
show(an.reliability(inputs))
show(an.corrected_tvd(inputs, boot))
show(an.calibration(inputs))

# %% [markdown]
# ## Does the audit recover what was planted? And what do its instruments lose?
# With PLANTED-truth images (offline profile) every headline quantity is set beside its planted value;
# in every run, the faces lost by the detector (and by a second detector) by label and L* bin, flagged
# above `face_loss_threshold`, and the instrument sweep of the `instruments` stage.

# %%
from biasaudit.stats.correction import confusion_array
from biasaudit.t2i import validation as va

spec = cfg.classify.vlm  # a SIMULATED classifier declares its confusion matrix: the raw TVD's exact estimand
confusion = confusion_array(spec.sim_confusion) if spec.backend == "simulated" else None
show(va.validation(inputs, boot, params.dark_L_threshold, cfg.reliability.correction_method, confusion=confusion))
show(va.face_loss(inputs, boot, params.face_loss_threshold))
show(va.instruments_result(C.INSTRUMENTS_DIR))

# %%
stand_in = cfg.profile == "offline" or any(
    bool(f["stand_in"].astype(bool).any()) for f in (inputs.manifests, inputs.labels, inputs.faces)
    if "stand_in" in f)
info = run_info(params.model_dump())
writer.finish(an.PLOTS, profile=cfg.profile, stand_in=stand_in, n_boot=params.n_boot, ci_level=params.ci_level,
              git_commit=info["git_commit"], created_at=info["created_at"], params_hash=info["params_hash"])
print("wrote", sorted(str(p) for p in C.T2I_REPORTS.glob("*.json")))
