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
from biasaudit import contracts as C
from biasaudit.notebook import banner, show, stage_params
from biasaudit.pipeline.outputs import Elsewhere, OutputWriter
from biasaudit.pipeline.provenance import run_info
from biasaudit.t2i.analysis import (
    calibration,
    clusters,
    corrected,
    face_loss,
    gender,
    homogeneity,
    inputs,
    instruments,
    provenance,
    reliability,
    representation,
    skin,
    validation,
)

cfg, params = stage_params("analyze")
banner(cfg)
data = inputs.load_inputs(".", cfg.generate.prompts_file, cfg.generate.images_dir, groups=cfg.groups,
                          colours=cfg.group_colours)
# each section's tables and figures are written by a child process while the next section runs (OutputWriter)
writer = OutputWriter(C.T2I_REPORTS, dpi=params.figure_dpi, processes=inputs.cores())
# the sections without figures (analysis.ELSEWHERE) are computed in a child process, on the second core, while
# the sections before them run here; each is shown below in its place
elsewhere = Elsewhere((gender.compute, corrected.compute, face_loss.compute), data, cfg)



# %% [markdown]
# ## What the upstream stages produced
# Counts per stage and model (status, abstentions, missing faces) and the models' ids and revisions.

# %%
show(provenance.compute(data, cfg), writer)

# %% [markdown]
# ## Representation
# Per prompt, the TVD between the classified distribution and the benchmark; per model × category the
# mean over prompts and the TVD of the pooled distributions (paper: 0.452 SD 3.5 Large Turbo, 0.310
# Flux Schnell, 0.312 Imagen 4 Fast overall). Figure 2 plots model share against benchmark share:
# points below the diagonal are under-representation.

# %%
show(representation.compute(data, cfg), writer)

# %% [markdown]
# ## Skin tone
# L* distributions by label, L* against C*, the share of very dark faces classified as the dark group,
# and L* against the occupation's median weekly earnings (OLS, errors clustered by prompt).

# %%
show(skin.compute(data, cfg), writer)

# %% [markdown]
# ## Apparent gender (beyond the paper)
# The classifier's apparent gender per image against BLS Table 11's share of women on the occupational prompts
# (parity elsewhere, said on every row): TVD and deviation per prompt, the TVD corrected for classifier error with
# its honest interval, and race × gender against parity (no joint benchmark exists).

# %%
show(elsewhere.result(gender.compute), writer)

# %% [markdown]
# ## Homogeneity, reliability, corrected TVD, calibration

# %%
show(homogeneity.compute(data, cfg), writer)

# %% [markdown]
# ## Label-free identity clusters (beyond the paper)
# The face embeddings of every model pooled and clustered (k-means, k by silhouette): each model's distribution over
# the clusters against the others', the cluster it over-produces, and how well the clusters agree with the
# classifier's labels (AMI); each cluster's nearest images.

# %%
show(clusters.compute(data, cfg), writer)

# %%
show(reliability.compute(data, cfg), writer)

# %%
show(elsewhere.result(corrected.compute), writer)

# %%
show(calibration.compute(data, cfg), writer)

# %% [markdown]
# ## Does the audit recover what was planted? And what do its instruments lose?
# With PLANTED-truth images (offline profile) every headline quantity is set beside its planted value;
# in every run, the faces lost by the detector (and by a second detector) by label and L* bin, flagged
# above `face_loss_threshold`, and the instrument sweep of the `instruments` stage.

# %%
show(validation.compute(data, cfg), writer)

# %%
show(elsewhere.result(face_loss.compute), writer)

# %%
show(instruments.compute(data, cfg), writer)

# %%
stand_in = bool(cfg.stand_ins()) or any(
    bool(f["stand_in"].astype(bool).any()) for f in (data.manifests, data.labels, data.faces)
    if "stand_in" in f)
info = run_info(params.model_dump())
writer.finish(inputs.PLOTS, profile=cfg.profile, stand_in=stand_in, n_boot=params.n_boot, ci_level=params.ci_level,
              git_commit=info["git_commit"], created_at=info["created_at"], params_hash=info["params_hash"])
print("wrote", sorted(str(p) for p in C.T2I_REPORTS.glob("*.json")))
