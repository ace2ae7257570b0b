"""One name per statistic. Every number the report shows under a name (front page, block pages, audit
cards, `all_models.csv`) is one of these: its name, the name of its interval, the table and columns it is
read from, and the function and stage notebook that compute it (the credit printed beside it). Pages read
names and credits here, never write their own; tests/test_report_statistics.py checks every credit: the
table declares the columns, the function writes them, and the notebook has a cell that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

from biasaudit import contracts as C


@dataclass(frozen=True)
class Statistic:
    key: str  # the measure name in the audit cards' CSVs
    name: str  # what every page calls it
    interval: str  # what its interval is (pages prefix the level, e.g. "95% ")
    table: C.Table  # the one table it is read from
    column: str  # the estimate
    function: str  # the dotted function that writes the column
    notebook: str  # the stage notebook whose cell calls the function
    low: str = ""  # interval columns ("" = column + "_low" / "_high")
    high: str = ""

    @property
    def columns(self) -> tuple[str, str, str]:
        return self.column, self.low or f"{self.column}_low", self.high or f"{self.column}_high"


    def label(self, level: str) -> str:
        """'<name> [<level> <interval>]', the column head of a table showing it."""
        return f"{self.name} [{level} {self.interval}]"


_REPRESENTATION = "biasaudit.t2i.analysis.representation.compute"
_CORRECTED = "biasaudit.t2i.analysis.corrected.compute"
RAW_CI = "cluster-bootstrap CI over prompts"
HONEST = "honest interval (allows for the remaining bias)"

RAW_TVD = Statistic("tvd", "raw TVD", RAW_CI, C.TVD_SUMMARY, "mean_tvd", _REPRESENTATION, "t2i_analyze")
FINITE_N_TVD = Statistic("tvd_finite_n_corrected", "finite-n-corrected TVD", RAW_CI, C.TVD_SUMMARY, "tvd_corrected",
                         _REPRESENTATION, "t2i_analyze")
PLUG_IN_TVD = Statistic("tvd_classifier_corrected", "classifier-corrected TVD (plug-in)",
                        "bootstrap CI over prompts and annotated images", C.TVD_CORRECTED_SUMMARY,
                        "tvd_classifier_corrected", _CORRECTED, "t2i_analyze")
# the headline: tvd_point is tvd_debiased (classifier error and finite n) or, with too few prompts, the raw
# TVD (tvd_point_source says which), always with the debiased honest interval
CORRECTED_TVD = Statistic("tvd_corrected", "corrected TVD", HONEST, C.TVD_CORRECTED_SUMMARY, "tvd_point", _CORRECTED,
                          "t2i_analyze", low="tvd_debiased_low", high="tvd_debiased_high")
DELTA_G = Statistic("delta_g", "Δg within source photo", "cluster-bootstrap CI over source photos", C.DELTA_G,
                    "delta_pct", "biasaudit.vlm.analysis.gaps.compute", "vlm_reflect_analysis", low="low", high="high")
RACE_WIN_RATE = Statistic("race_win_rate", "race win rate within gender", "cluster-bootstrap CI over source photos",
                          C.RACE_WINRATE, "rate", "biasaudit.vlm.analysis.two_afc.compute", "vlm_reflect_analysis",
                          low="low", high="high")

TVDS = (RAW_TVD, FINITE_N_TVD, PLUG_IN_TVD, CORRECTED_TVD)  # the audit cards' order
ALL = TVDS + (DELTA_G, RACE_WIN_RATE)
BY_KEY = {s.key: s for s in ALL}
