"""Method B's REFLECT analysis as sections: from a VLM's answers to win rates, gaps and significance tests.

Each section module has one `compute(answers, cfg) -> Result` for ONE VLM: `answers` is that VLM's
`inputs.Answers` (its `data/vlm/responses/<vlm>.parquet`, see vlm/tasks.py) and `cfg` the validated
config, from which the section reads its own parameters (`cfg.reflect_analysis`; the resampling and
testing settings several sections share through `inputs.Boot.of(cfg)`). A section per VLM, not a list of
VLMs: the report lays out each VLM's sections together, so the notebook loops over `inputs.load_inputs(cfg)`
and calls the sections in the order of SECTIONS for each VLM. What a section computes that another one
reads (Δg for the significant effects, every estimate for the validation and the summary) is computed
once per VLM (`Answers.shared`). A section that does not apply returns None (validation: a VLM without
planted truth). Only rows with status 'ok' are *retained*; the others are counted per status. The group
sections read only the real tasks' answers about the group edits (`Answers.responses`, vlm.groups.group_rows);
the placebo tasks' answers (`Answers.placebo`) and the null-edit control's (`Answers.controls`, arm null_edit
| original) are read by the controls section alone.

    validation    PLANTED truth beside every estimate (vlm/recovery.py), for a VLM with the `planted` trait
    two_afc       win-rate matrices, race win rates within gender, position bias, Bradley–Terry
    gaps          Δg within source photo and pooled (MCQ and salary), salary gaps by occupation
    refusals      retention and refusal-rate gaps by group; worst-case bounds of the race win rates and Δg
                  (refused answers counted as each possible answer: what the VLM would have answered)
    significance  retention, OLS with source-photo fixed effects, sign-flip tests, significant effects, and
                  the declared primary endpoints (Holm over them: the report's family-wise error)
    interaction   task × group: does each race's standardised effect differ between 2AFC, MCQ and salary
    controls      the null-edit artefact floor and the placebo tasks' group tests (rows the others never read)

Helpers: `inputs` (loading, retained answers, the numeric value of each answer, the settings every section
shares), `inference` (sign-flip p-values, underpowered labels, p adjustment), `summary`
(reports/vlm/summary.json); figures in biasaudit.vlm.figures.

Output format of `reports/vlm/` (the same writer as reports/t2i: biasaudit.pipeline.outputs.OutputWriter):

    reports/vlm/summary.json     {"profile", "stand_in", "vlms": {<vlm>: {"model_id", "backend", "stand_in",
                                  "n_questions", "status_counts" {"kind/status": n}, "retained" {kind: n},
                                  "position_bias" {task: {...}}, "race_win_rates" {task: {gender: {race: rate}}},
                                  "bradley_terry" {task: rows | reason}, "delta_g", "notes"}},
                                  "edit_checks": reports/vlm/edit_checks/summary.json (when present: with
                                  "skin_seam", "lpips" (weights used; STAND-IN when random), "realism" and
                                  "identity" (status, missing sheets, mean weighted κ, calibration mean)
                                  beside the thresholds)}
    reports/vlm/edit_checks/     written by validate_edits (vlm/validate.py, edit_quality.py, realism.py), shown
                                  as the report's edit-checks page: by_group (per target group: failures incl.
                                  skin_seam, seam ΔE2000 face vs neck/other skin, LPIPS), controls,
                                  realism_agreement (rater pairs: n, exact agreement, quadratic-weighted κ),
                                  realism_by_group (mean 1–5 realism per group, originals, all edits, edits −
                                  originals; low/high: cluster bootstrap over source photos; reason when none),
                                  identity_agreement / identity_by_group (the same for the 1–5 identity
                                  consistency of each edit beside its original; calibration: the original
                                  beside itself), realism_problems / identity_problems (blank or invalid cells)
    reports/vlm/manifest.json    sections (one per VLM × {validation, 2afc, mcq, significance}) with status,
                                  reason, notes, figures [{name, title, caption, png, svg}], tables [{name, csv, md}]
    reports/vlm/metrics.json     headline numbers per section
    reports/vlm/tables/*.csv|md  tidy tables with a `vlm` column: <vlm>_winrate_<task> (row, col, wins, n,
                                  rate), <vlm>_race_winrate_<task>, <vlm>_bradley_terry_<task> (the headline
                                  estimator's; the other one's: <vlm>_bt_<estimator>_<task>), <vlm>_position_<task>
                                  (share of 'A' per pair type), <vlm>_mean_gaps, <vlm>_salary_gaps_by_occupation,
                                  <vlm>_ols, <vlm>_sign_flip, <vlm>_task_interaction (race, kind effect |
                                  difference | joint, task, task_b, estimate, low, high, p, p_adjusted, n_photos),
                                  <vlm>_retention_by_group, <vlm>_refusal_gaps, <vlm>_refusal_bounds_race_winrate,
                                  <vlm>_refusal_bounds_gaps, <vlm>_primary_endpoints, <vlm>_caveats (caveats.py:
                                  refusal gap, refusal bounds and robust_to_refusals, null-edit floor, placebo
                                  verdict per Δg and race win rate; also on the primary endpoints and
                                  <vlm>_significant_effects); every p-value table has a
                                  `family` column: primary (Holm over the primary endpoints) or exploratory;
                                  controls: <vlm>_artifact_floor (kind, measure, quantity, estimate, low,
                                  high, null, p_value, n, n_photos[, planted, covered]), <vlm>_delta_g_vs_floor
                                  (the Δg table + floor_pct, floor_low, floor_high, floor_bound,
                                  exceeds_floor_estimate, exceeds_floor), <vlm>_placebo_tests (task, test,
                                  effect, estimate, low, high, p_value, p_adjusted[, planted, covered]),
                                  <vlm>_placebo_verdicts (task, test, effects, significant, placebo_effect_null)
    reports/vlm/figures/*.png|svg  win-rate heatmaps, race win rates, Δg bars, salary gaps by occupation

Definitions (the paper's, made exact):
- 2AFC estimator (reflect_analysis.two_afc_estimator): `symmetric` (the headline) counts each (source photo,
  unordered pair, task) retained in *both* orders once, by its order-averaged outcome s = ½[share of r chosen
  with r first + share of r chosen with r second] (2 answers); pairs retained in one order only are left out
  (counted: pairs_one_order). Any position pull, the same or different for each pair, cancels from s when
  the groups do not matter. `pooled` (the paper's) counts every retained answer.
- win-rate cell (r, c) = #(retained comparisons of r vs c, either order, where r was chosen) / #(retained
  comparisons of r vs c) (symmetric: Σ 2s / 2·#pairs over the pairs in both orders); the diagonal is empty.
- race win rate within gender g: over retained comparisons between two different races of gender g,
  #(wins of race r) / #(comparisons involving race r) (symmetric: as the cells).
- position per pair type (`<vlm>_position_<task>`): share of 'A' answers over all pairs, pairs of the same
  gender and pairs across genders, with cluster-bootstrap CIs: a pull that differs by pair shows here.
- position bias: share_first = P(answer 'A'); position_bias_rate = among pairs retained in *both
  orders* (one answer with each group shown first; a pair asked twice in the same order is not one),
  the share where the same *position* was chosen both times (i.e. the chosen group flipped with order).
- Bradley–Terry, pooled: logit P(A chosen) = α + β_groupA − β_groupB (α = position effect), β_ref = 0;
  symmetric: logit E[s] = β_lo − β_hi on each pair's order-averaged outcome (a fractional response, no
  position term). Both fitted by statsmodels Logit with errors clustered by source photo; CIs and p from
  those errors with a t(G − 1) reference (G photos), as for the OLS.
- task × group interaction (`interaction`): per task T (2afc_<task>, mcq_<task>, salary_salary) each image
  (photo, group) has a value v: 2AFC its mean order-averaged outcome s over its pairs in both orders (its
  win share within the photo), MCQ the bracket value, salary the log salary. SD_T = √(Σ_photos Σ (v − photo
  mean)² / Σ_photos (images − 1)), the pooled within-photo SD. Per race r ≠ race_reference and photo u:
  x_uT = mean over genders of v(r, g) − v(reference, g); over the photos with x in every task,
  θ_rT = mean_u x_uT / SD_T, and θ_rT − θ_rT' per pair of tasks, with cluster-bootstrap CIs over photos (SD_T
  resampled too). Joint row per race: estimate = max_T θ − min_T θ, p = sign-flip test of the per-photo
  vectors of standardised differences (x_uT/SD_T − x_uT'/SD_T'), statistic max |t| over the pairs (exact
  when 2^n ≤ n_permutations), Holm/BH over races; H0: each photo's vector is symmetric about 0 (exact under
  groups that do not matter in any task). Below min_clusters photos: no interval and no p, with a reason.
- Δg, headline (`delta_g` table): computed *within source photo*. For race level g, cells are (photo,
  gender); in every cell holding both g and the reference, d = mean y of g − mean y of the reference.
  Δg = 100 · Σ d / Σ (reference mean) over those matched cells; CI by the cluster bootstrap over
  photos, p-value by the sign-flip test of the per-photo mean d, Holm/BH-adjusted over the table.
  Unbalanced retention (e.g. no Black woman retained) therefore compares like with like.
- Δg, pooled (`mean_gaps`, the paper's) = 100 · (mean value of g − mean value of the reference) / mean
  value of the reference over all retained answers; biased when retention is unbalanced.
  Values: each MCQ task's declared letter values (reflect.task_specs; reference: reflect_analysis.race_reference /
  gender_reference).
- salary gap (per occupation) = 100 · (mean salary of g − mean of the reference) / mean of the reference.
- OLS: value ~ race + gender + source-photo fixed effects (within transformation), CR1 errors clustered
  by source photo, t(G − 1) reference (`p_t`), and a wild cluster restricted bootstrap (`p_wild`,
  Webb or Rademacher weights) that stays valid with few photos; `p` is the wild p-value when computed.
- artefact floor (controls): the null edit re-renders the face as the same person (counterfactuals.null_edit).
  2AFC: share of retained null-edit vs original comparisons (both orders) choosing the null edit, CI by the
  cluster bootstrap over photos, p by the sign-flip test of the per-photo share − 0.5. Single-image
  measures: Δ = 100 · Σ_photos (null edit − original) / Σ_photos original (Δg within photo with one cell per
  photo). A Δg `exceeds_floor` when its interval lies beyond ± max(|low|, |high|) of its measure's floor.
- placebo tasks (controls): questions on content the edit leaves alone (reflect.task_specs, placebo: true), analysed
  by the unchanged two_afc and gaps estimators; "placebo effect null" = 'yes' when none of a task's
  Bradley–Terry strengths (or Δg rows) is significant after Holm/BH adjustment, 'no' otherwise.
- intervals and p-values resting on fewer than min_clusters source photos are blanked with the reason
  "underpowered: N source photos < min_clusters M" (inference.underpowered_intervals): they under-cover.
- worst-case bounds, refusal-rate gap test: the docstring of refusals.py.
- primary endpoints (reflect_analysis.primary_endpoints): `delta_g:<measure>:<race|gender>:<level>` (Δg within
  photo, sign-flip p) and `race_winrate:<task>:<gender>:<race>` (race win rate within gender; sign-flip p of
  the per-photo wins − n/2); Holm over them bounds the family-wise error of one VLM at 1 − confidence.
- sign-flip test: per source photo, d = mean(value | g) − mean(value | reference); H0: d symmetric about
  0; p two-sided from scipy.stats.permutation_test (exact when 2^n ≤ n_permutations); with a single
  photo p = 1 and a reason (a sign flip of one value cannot reject).
"""

# the order above; a test holds notebooks/vlm_reflect_analysis.py to the same list
SECTIONS = ("validation", "two_afc", "gaps", "refusals", "significance", "interaction", "controls")
