"""Method A analysis as sections. Each section module has one `compute(inputs, cfg) -> Result`: it reads the
stage outputs (`inputs.load_inputs`, formats in biasaudit.contracts) and its own parameters from the validated
config (`cfg.analyze`, and `cfg.reliability` / `cfg.classify` where it needs them), and returns tables,
figures (drawn by biasaudit.t2i.figures) and headline metrics. An empty input gives status 'no data' with
the reason. The `analyze` notebook runs them in this order:

    provenance      counts per stage and model, model ids and revisions
    representation  TVD per prompt, mean and pooled, null floor, bias-corrected, paired; deviations; thresholds
    skin            skin tone by label: very-dark share, L* bins, L* vs earnings, mean L* and ΔE2000 diversity;
                    ITA categories and Monk tones beside L*
    gender          apparent gender against BLS Table 11's share of women (parity elsewhere), corrected TVD,
                    race × gender against parity
    homogeneity     the homogeneity gap by race and L* bin, CLIP and face embeddings; the localising test
                    (pairwise within-prompt gaps g vs h, table homogeneity_pairs; a group is flagged only if
                    more self-similar than every other: intersection-union rule, columns flagged/p_localise),
                    and the same without near-duplicate pairs (wp_gap_dedup, dedup_flagged)
    clusters        label-free identity clusters of the pooled face embeddings (k-means, k by silhouette):
                    each model's cluster TVD from the others, over-produced clusters, AMI with the labels
    reliability     classifier vs raters (κ tables of the reliability stage)
    corrected       TVD and deviations corrected for classifier error (stats.correction)
    calibration     the committed calibration table (benchmarks/calibration.py)
    validation      PLANTED truth beside every headline estimate (offline profile)
    face_loss       faces lost by the detector, by label and L* bin
    instruments     the instruments stage's L* sweep
"""

# the order above; benchmarks/bench_analyze.py times these and a test holds the notebook to the same list
SECTIONS = ("provenance", "representation", "skin", "gender", "homogeneity", "clusters", "reliability", "corrected", "calibration",
            "validation", "face_loss", "instruments")
# sections without figures computed in a forked child before the first section (pipeline.outputs.Elsewhere), in this order
ELSEWHERE = ("gender", "corrected", "face_loss")
