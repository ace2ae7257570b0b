"""PLANTED truth for Method B: how the `planted` VLM answers, and the exact value of every quantity
the REFLECT analysis estimates from those answers (its *estimands*). SIMULATED, not a model.

The declared behaviour (params: `vlms.<name>.planted`, biasaudit.params.vlm.PlantedReflect):

- 2AFC, per task: P(first image chosen) = σ(α_ab + s_a − s_b) with s_g = β_task,g + σ_2afc · z_photo,task,g
  (Bradley–Terry log-strengths β, a position effect α_ab — one value, or one for pairs of the same gender
  and one across genders — and a per-source-photo × group random strength).
- MCQ, per task: ordered logit, P(letter ≤ k) = σ(c_k − η_task,g − σ_mcq · z_photo,task); the cut points c
  give the declared `base` distribution at η = 0.
- salary: log(USD) = log base[occupation] + γ_g + σ_photo · z_photo + σ_noise · ε (rounded to whole dollars).
- refusals: a question about an image of group g is refused with probability r_g (2AFC: (r_a + r_b)/2),
  plus a *selective* refusal (`selective_refusal`) that depends on the answer the VLM would have given:
  + e_2afc when the would-be chosen image is of a listed group, + e_low when the would-be MCQ letter is
  below the median letter of `base` (salary: below base_usd[occupation]) for an image of a listed group.
  `estimands` ignore it (answer-independent refusal, closed forms); `complete_case_estimands` are exact
  under any refusal (see below) and equal them without a selective one; `would_answer(planted)` drops
  every refusal, so its estimands are the *would-have-answered* values the refusal bounds
  (vlm/analysis/refusals.py) must contain;
  retention loss: an edit of group g is lost with probability l_g, and then every question about it fails,
  as after a failed edit.

Estimands are population values over source photos (what a cluster bootstrap over photos targets), exact
up to Gauss–Hermite quadrature (200 nodes; error < 1e-13 against adaptive quadrature within the schema's
photo_sd ≤ 2; salaries are rounded to whole dollars, which the estimands ignore: < 0.05 % at the schema's
≥ 1000 USD) and given the design (units and their
occupations, the tasks, both orders):

- win rate (r, c) = ½[p(r, c) + 1 − p(c, r)], p(a, b) = E σ(α_ab + β_a − β_b + √2 σ Z), both orders asked
  equally often in expectation (retention does not depend on order); the same for the order-symmetric
  estimator, which averages the two orders of each pair;
- race win rate within gender, share of 'A' answers: the same p weighted by expected retained pairs (the
  symmetric estimator: by pairs retained in both orders); share of 'A' also per pair type;
- Bradley–Terry: the population ('pseudo-true') parameters of the analysis' logit model, fitted to the
  exact p over the expected design: pooled, α + β_a − β_b on each answer; symmetric, β_lo − β_hi on the
  order-averaged outcome ½[p(lo, hi) + 1 − p(hi, lo)] of each pair retained in both orders. With σ_2afc = 0
  and one position value the pooled ones equal the declared β − β_ref and α; with photo random effects, or
  a position pull (symmetric), the marginal model is attenuated, which is what the fitted strengths estimate;
- Δg within photo = Σ_cells w (m_g − m_ref) / Σ_cells w m_ref over the other dimension's levels, with w the
  probability that both answers of a cell are retained and m the mean answer value; pooled Δg (the
  paper's) weights each group's cells by its own retention;
- OLS (y ~ race + gender + photo fixed effects): the probability limit (E[X̃ᵀX̃])⁻¹E[X̃ᵀỹ], enumerating
  all 2¹⁰ retention patterns of a photo.

- complete-case estimands (`complete_case_estimands`, refusal depending on the answer): the refusal uniform is
  drawn apart from the answer's, so given the answer it is independent of the photo effects. 2AFC: per asked
  order P(retained, A) = E p · k_A, P(retained) = E p · k_A + E(1 − p) · k_B (k the kept share given the
  choice), times both edits kept; every pooled quantity is a ratio of these sums (win rate, race win rate,
  share of 'A', and the BT fit to P(A | retained) weighted by P(retained)); the symmetric estimator's pair
  moments E[s R₁R₂] and E[R₁R₂] are integrated over D = σ(z_lo − z_hi), which both orders share. Single
  images: given the photo effect z the ten answers and refusals are independent, with q(z) = P(retained | z)
  and a(z) = E[value · retained | z] (MCQ: letter probabilities × kept share of the letter; salary: the
  lognormal mean below / above base_usd, E[e^{σε} 1(ε < c)] = e^{σ²/2} Φ(c − σ)); Δg within photo sums
  E_z[a_l q_r − q_l a_r] over E_z[q_l a_r], the pooled Δg E a / E q per group, the OLS limit sums the
  retention patterns' moments given z and integrates over z; the refusal rate adds e_low · P(low answer)
  averaged over the measures.

- controls: every edited image (a group edit or the null edit) carries the declared `edit_artifact`
  against the unedited original (2AFC log-strength, MCQ latent shift, salary log-effect), which cancels
  between two edits; placebo tasks have no group effect unless one is declared (a `strengths` or `shift`
  entry under the task's name). The null edit vs original: share choosing the edit
  ½[p(α + a) + 1 − p(α − a)], and the within-photo Δ = 100 · (m(a) / m(0) − 1) (salary 100 · (e^a − 1)).

`draw_*` turn uniforms and normals into answers; the backend (backends/vlm/planted.py) feeds them seeded
per item, benchmarks/calibration.py from one generator per replication, so both answer identically.
"""

from __future__ import annotations

from itertools import product
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy.special import expit, logit

from biasaudit.params.vlm import GENDERS, KINDS, RACES, Reflect, task_name
from biasaudit.pipeline.provenance import derive_seed
from biasaudit.vlm.declared import answer_values, asked, of_kind
from biasaudit.vlm.groups import CODE_TO_GROUP, COUNTERFACTUAL, GROUP_CODES, GROUPS, NULL_EDIT, ORIGINAL, group_code

if TYPE_CHECKING:  # the sections these functions read (tests/field_reads.py types each read by them)
    from biasaudit.params.vlm import PlantedReflect

_DECLARED = Reflect()  # the declared tasks (params.vlm.TaskSpec)
_REAL = Reflect(tasks=[label for label, spec in _DECLARED.task_specs.items() if not spec.placebo])  # simulations' default
TWO_AFC_TASKS = tuple(of_kind(_DECLARED, "2afc"))
SINGLE_MEASURES = tuple(label for label, spec in _DECLARED.task_specs.items() if spec.kind != "2afc" and not spec.placebo)
REFUSAL_TEXT = "I'm sorry, but I can't make that judgement from a person's appearance."
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(200)  # error < 1e-13 for the schema's photo_sd ≤ 2
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()  # E f(Z) = Σ w f(x) for Z ~ N(0, 1)


def expect(f, sd: float) -> np.ndarray:
    """E f(sd · Z), Z ~ N(0, 1), by Gauss–Hermite quadrature (f maps an array of nodes to (nodes,))."""
    if sd == 0:
        return np.asarray(f(np.zeros(1)))[..., 0]
    return np.asarray(f(sd * _NODES)) @ _WEIGHTS


# ---------------------------------------------------------------- the declared behaviour

def edited(group) -> np.ndarray:
    """1.0 for an edited image (a group edit or the null edit), 0.0 for the unedited original."""
    return (np.asarray(group) != ORIGINAL).astype(float)


def strength(planted: PlantedReflect, task: str, group) -> np.ndarray:
    """Declared log-strength of the group (0 where the task declares none, e.g. a placebo task) plus the
    edit artefact of an edited image (which cancels between two edits)."""
    table = planted.two_afc.strengths.get(task, {})
    return np.vectorize(lambda g: float(table.get(g, 0.0)), otypes=[float])(np.asarray(group)) \
        + planted.edit_artifact.two_afc * edited(group)


def mcq_shift(planted: PlantedReflect, task: str, group) -> np.ndarray:
    """Declared latent shift of the group (0 where none is declared) plus the edit artefact."""
    table = planted.mcq.shift.get(task, {})
    return np.vectorize(lambda g: float(table.get(g, 0.0)), otypes=[float])(np.asarray(group)) \
        + planted.edit_artifact.mcq * edited(group)


def refusal(planted: PlantedReflect, group) -> np.ndarray:
    return np.vectorize(lambda g: float(planted.refusal.get(g, 0.0)), otypes=[float])(np.asarray(group))


def loss(planted: PlantedReflect, group) -> np.ndarray:
    return np.vectorize(lambda g: float(planted.edit_loss.get(g, 0.0)), otypes=[float])(np.asarray(group))


def selective_2afc(planted: PlantedReflect, group_a, group_b, choice) -> np.ndarray:
    """Extra P(refuse) of comparisons whose would-be chosen image ('A' → group_a) is of a listed group."""
    sel = planted.selective_refusal
    chosen = np.where(np.asarray(choice) == "A", np.asarray(group_a), np.asarray(group_b))
    return sel.two_afc * np.isin(chosen, sel.groups)


def low_letter(planted: PlantedReflect, task: str) -> int:
    """Letters with a smaller index are 'low' answers: the median letter of the base distribution."""
    return int(np.searchsorted(np.cumsum(planted.mcq.base[task]), 0.5))


def selective_single(planted: PlantedReflect, kind: str, task: str, group, occupation, answer) -> np.ndarray:
    """Extra P(refuse) of an MCQ (answer: letter index) or salary (answer: USD) question about an image of
    a listed group whose would-be answer is low."""
    sel = planted.selective_refusal
    low = (np.asarray(answer) < low_letter(planted, task)) if kind == "mcq" else \
        (np.asarray(answer, float) < salary_base(planted, occupation))
    return sel.low_answer * (np.isin(np.asarray(group), sel.groups) & low)


def draw_refused(base, extra, u) -> np.ndarray:
    """Refused where the uniform u falls below the base rate plus the answer-dependent extra."""
    return np.asarray(u) < np.asarray(base, float) + np.asarray(extra, float)


def would_answer(planted: PlantedReflect) -> Any:
    """The same VLM without refusals (edit loss kept): its estimands are the would-have-answered values."""
    none = planted.selective_refusal.model_copy(update={"two_afc": 0.0, "low_answer": 0.0})
    return planted.model_copy(update={"refusal": {}, "selective_refusal": none})


def selective(planted: PlantedReflect) -> bool:
    sel = planted.selective_refusal
    return bool(sel.groups) and (sel.two_afc > 0 or sel.low_answer > 0)


def with_letters(planted: PlantedReflect, values: dict[str, dict[str, float] | None]) -> PlantedReflect:
    """`planted` with an answer distribution for every declared MCQ task (`values`: measure → letter values)
    that declares none in mcq.base: every letter equally likely (and no group effect unless mcq.shift has one)."""
    missing = {m.split("_", 1)[1]: len(v) for m, v in values.items() if m.startswith("mcq_") and v
               and m.split("_", 1)[1] not in planted.mcq.base}
    if not missing:
        return planted
    base = dict(planted.mcq.base) | {t: [1 / n] * n for t, n in missing.items()}
    return planted.model_copy(update={"mcq": planted.mcq.model_copy(update={"base": base})})


def cut_points(base: list[float]) -> np.ndarray:
    return logit(np.cumsum(base)[:-1])


def mcq_probs(planted: PlantedReflect, task: str, eta: np.ndarray) -> np.ndarray:
    """(..., K) letter probabilities at latent shifts `eta` (group shift + photo effect)."""
    c = cut_points(planted.mcq.base[task])
    cdf = expit(c - np.asarray(eta, dtype=float)[..., None])
    cdf = np.concatenate([np.zeros(cdf.shape[:-1] + (1,)), cdf, np.ones(cdf.shape[:-1] + (1,))], axis=-1)
    return np.diff(cdf, axis=-1)


def salary_base(planted: PlantedReflect, occupation) -> np.ndarray:
    table = planted.salary.base_usd
    return np.vectorize(lambda o: float(table.get(o, table["default"])), otypes=[float])(np.asarray(occupation))


def salary_effect(planted: PlantedReflect, group) -> np.ndarray:
    return np.vectorize(lambda g: float(planted.salary.effect.get(g, 0.0)), otypes=[float])(np.asarray(group)) \
        + planted.edit_artifact.salary * edited(group)


# ---------------------------------------------------------------- drawing answers

def position(planted: PlantedReflect, group_a, group_b) -> np.ndarray:
    """The declared position pull α_ab (log-odds of choosing the first image) of each pair; a control pair
    (null edit vs original: one person, no group code) is a same-gender pair."""
    tw = planted.two_afc
    same = np.vectorize(lambda a, b: a not in CODE_TO_GROUP or b not in CODE_TO_GROUP
                        or CODE_TO_GROUP[a][1] == CODE_TO_GROUP[b][1], otypes=[bool])(
        np.asarray(group_a), np.asarray(group_b))
    pull = [tw.position if v is None else v for v in (tw.position_same_gender, tw.position_cross_gender)]
    return np.where(same, pull[0], pull[1]).astype(float)


def pair_varying(planted: PlantedReflect) -> bool:
    tw = planted.two_afc
    return len({tw.position if v is None else v for v in (tw.position_same_gender, tw.position_cross_gender)}) > 1


def draw_2afc(planted: PlantedReflect, task: str, group_a, group_b, z_a, z_b, u) -> np.ndarray:
    """'A' or 'B' per comparison from uniforms u and the two images' photo effects z."""
    tw = planted.two_afc
    eta = position(planted, group_a, group_b) + strength(planted, task, group_a) - strength(planted, task, group_b) \
        + tw.photo_sd * (np.asarray(z_a, float) - np.asarray(z_b, float))
    return np.where(np.asarray(u) < expit(eta), "A", "B")


def draw_mcq(planted: PlantedReflect, task: str, group, z, u) -> np.ndarray:
    """Letter index (0 = 'A') per question: the first k with u < P(letter ≤ k)."""
    eta = mcq_shift(planted, task, group) + planted.mcq.photo_sd * np.asarray(z, float)
    cdf = np.cumsum(mcq_probs(planted, task, eta), axis=-1)
    return (np.asarray(u)[..., None] >= cdf[..., :-1]).sum(axis=-1)


def draw_salary(planted: PlantedReflect, occupation, group, z, eps) -> np.ndarray:
    s = planted.salary
    log_usd = np.log(salary_base(planted, occupation)) + salary_effect(planted, group) + s.photo_sd * np.asarray(z) \
        + s.noise_sd * np.asarray(eps)
    return np.rint(np.exp(log_usd))


def photo_effect(seed: int, question: str, unit: str, group: str = "") -> float:
    """The seeded standard-normal effect of one source photo (2AFC: of one photo × group) for one task."""
    return float(np.random.default_rng(derive_seed(seed, "photo", question, unit, group)).standard_normal())


def image_lost(planted: PlantedReflect, unit: str, group: str) -> bool:
    rate = float(planted.edit_loss.get(group, 0.0))
    return rate > 0 and float(np.random.default_rng(derive_seed(planted.seed, "loss", unit, group)).random()) < rate


def letters(options: int) -> tuple[str, ...]:
    return tuple("ABCDEFGHIJ"[:options])


def simulate_responses(planted: PlantedReflect, units: pd.DataFrame, rng: np.random.Generator,
                       reflect: Reflect = _REAL, controls: bool = False) -> pd.DataFrame:
    """A whole REFLECT response table (the analysis' columns) for `units` (unit, occupation), drawn from
    `rng` through the same draw_* functions as the backend: for simulations (benchmarks/calibration.py).
    The tasks are those `reflect` asks (vlm.declared.asked: its declared task_specs, real and placebo; by
    default the real ones; an MCQ task with no planted distribution answers every letter alike, as in the
    backend), each 2AFC pair in both orders if reflect.both_orders. Placebo tasks are drawn like the real ones
    (rows placebo True); `controls` adds the null-edit control (arm null_edit | original) for the real tasks.
    Each task draws from its own stream (seeded by one draw of `rng` and the task), so adding or dropping a
    task leaves the other tasks' answers as they were."""
    planted = with_letters(planted, answer_values(reflect))
    both_orders = reflect.both_orders
    tasks = [(spec.kind, task_name(label), spec.placebo) for label, spec in asked(reflect).items()]
    U = len(units)
    unit_ids = units["unit"].to_numpy(str)
    occ = units["occupation"].to_numpy(str)
    G = len(GROUP_CODES)
    codes = np.array(GROUP_CODES)
    lost = rng.random((U, G)) < loss(planted, codes)[None, :]
    stream = int(rng.integers(2 ** 63))

    def task_rng(*parts: Any) -> np.random.Generator:
        return np.random.default_rng(derive_seed(stream, *parts))

    frames = []
    pairs = [(i, j) for i in range(G) for j in range(G) if i != j and (both_orders or shown_first(codes[i], codes[j]))]
    ia, ib = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    def two_afc_frame(task: str, placebo: bool = False) -> pd.DataFrame:
        rng = task_rng("2afc", task, placebo)
        z = rng.standard_normal((U, G))
        uu = np.repeat(np.arange(U), len(pairs))
        a, b = np.tile(ia, U), np.tile(ib, U)
        choice = draw_2afc(planted, task, codes[a], codes[b], z[uu, a], z[uu, b], rng.random(len(uu)))
        refused = draw_refused((refusal(planted, codes[a]) + refusal(planted, codes[b])) / 2,
                               selective_2afc(planted, codes[a], codes[b], choice), rng.random(len(uu)))
        failed = lost[uu, a] | lost[uu, b]
        return pd.DataFrame({
            "kind": "2afc", "task": task, "unit": unit_ids[uu], "occupation": occ[uu], "group_a": codes[a],
            "group_b": codes[b], "order": (codes[a] > codes[b]).astype(int),  # 0: vlm.tasks' first order
            "choice": np.where(refused | failed, None, choice),
            "status": np.where(failed, "failed", np.where(refused, "refused", "ok"))})

    two_afc_tasks = [task for kind, task, placebo in tasks if kind == "2afc" and not placebo]
    frames += [two_afc_frame(task) for task in two_afc_tasks]
    uu, gg = np.repeat(np.arange(U), G), np.tile(np.arange(G), U)
    race = np.array([GROUPS[g][0] for g in gg])
    gender = np.array([GROUPS[g][1] for g in gg])
    single = {"unit": unit_ids[uu], "occupation": occ[uu], "group": codes[gg], "race": race, "gender": gender}
    photo_z: dict[tuple[str, str], np.ndarray] = {}

    def single_frame(kind: str, task: str, placebo: bool = False) -> pd.DataFrame:
        rng = task_rng(kind, task, placebo)
        photo_z[kind, task] = zu = rng.standard_normal(U)
        z = zu[uu]
        u_refuse = rng.random(len(uu))
        failed = lost[uu, gg]
        answer = draw_mcq(planted, task, codes[gg], z, rng.random(len(uu))) if kind == "mcq" else \
            draw_salary(planted, occ[uu], codes[gg], z, rng.standard_normal(len(uu)))
        refused = draw_refused(refusal(planted, codes[gg]),
                               selective_single(planted, kind, task, codes[gg], occ[uu], answer), u_refuse)
        status = np.where(failed, "failed", np.where(refused, "refused", "ok"))
        if kind == "mcq":
            frame = {"choice": np.where(status == "ok", np.array(letters(len(planted.mcq.base[task])))[answer], None),
                     "value_usd": np.nan}
        else:
            frame = {"choice": None, "value_usd": np.where(status == "ok", answer, np.nan)}
        return pd.DataFrame({"kind": kind, "task": task, **single, **frame, "status": status})

    asks = [(kind, task) for k in ("mcq", "salary") for kind, task, placebo in tasks if kind == k and not placebo]
    frames += [single_frame(kind, task) for kind, task in asks]
    out = pd.concat(frames, ignore_index=True).assign(arm=COUNTERFACTUAL, placebo=False) if frames else None
    extra = [two_afc_frame(task, True) if kind == "2afc" else single_frame(kind, task, True)
             for k in KINDS for kind, task, placebo in tasks if kind == k and placebo]
    extra = [f.assign(arm=COUNTERFACTUAL, placebo=True) for f in extra]
    if controls:
        extra += simulate_controls(planted, units, task_rng, two_afc_tasks, asks, photo_z, both_orders)
    return pd.concat(([out] if out is not None else []) + extra, ignore_index=True)


def simulate_controls(planted: PlantedReflect, units: pd.DataFrame, task_rng: Any, two_afc_tasks: tuple[str, ...],
                      asks: list[tuple[str, str]], photo_z: dict[tuple[str, str], np.ndarray],
                      both_orders: bool = True) -> list[pd.DataFrame]:
    """The null-edit control's rows: per task 2AFC null edit vs original (order 0: null edit first), and
    each single-image question about both images, sharing the photo effect of the group edits' answers
    (`photo_z`, per kind and task), as the backend does. Nothing is refused or lost (no group). Each task
    draws from its own stream (`task_rng`(kind, task, "control"))."""
    U = len(units)
    unit_ids, occ = units["unit"].to_numpy(str), units["occupation"].to_numpy(str)
    frames = []
    orders = [(NULL_EDIT, ORIGINAL), (ORIGINAL, NULL_EDIT)][:2 if both_orders else 1]
    for task in two_afc_tasks:
        rng = task_rng("2afc", task, "control")
        z = dict(zip((NULL_EDIT, ORIGINAL), rng.standard_normal((2, U))))
        for order, (a, b) in enumerate(orders):
            choice = draw_2afc(planted, task, np.full(U, a), np.full(U, b), z[a], z[b], rng.random(U))
            frames.append(pd.DataFrame({"kind": "2afc", "task": task, "unit": unit_ids, "occupation": occ,
                                        "group_a": a, "group_b": b, "order": order, "choice": choice,
                                        "status": "ok", "arm": NULL_EDIT, "placebo": False}))
    for kind, task in asks:
        rng, z = task_rng(kind, task, "control"), photo_z[kind, task]
        for arm in (NULL_EDIT, ORIGINAL):
            group = np.full(U, arm)
            if kind == "mcq":
                idx = draw_mcq(planted, task, group, z, rng.random(U))
                frame = {"choice": np.array(letters(len(planted.mcq.base[task])))[idx], "value_usd": np.nan}
            else:
                frame = {"choice": None, "value_usd": draw_salary(planted, occ, group, z, rng.standard_normal(U))}
            frames.append(pd.DataFrame({"kind": kind, "task": task, "unit": unit_ids, "occupation": occ,
                                        "group": arm, "race": None, "gender": None, **frame, "status": "ok",
                                        "arm": arm, "placebo": False}))
    return frames


# ---------------------------------------------------------------- estimands

def p_first(planted: PlantedReflect, task: str, a: str, b: str) -> float:
    """P(the first image, of group a, is chosen over b), marginal over the photo effects."""
    tw = planted.two_afc
    mu = float(position(planted, a, b)) + float(strength(planted, task, a) - strength(planted, task, b))
    return float(expect(lambda x: expit(mu + x), np.sqrt(2) * tw.photo_sd))


def pair_retention(planted: PlantedReflect, a: str, b: str) -> float:
    """P(a comparison of a and b is retained): both edits kept, the question not refused."""
    la, lb = loss(planted, a), loss(planted, b)
    return float((1 - la) * (1 - lb) * (1 - (refusal(planted, a) + refusal(planted, b)) / 2))


def shown_first(a: str, b: str) -> bool:
    """With one order asked, whether a is image A against b: vlm.tasks pairs a photo's variants in the
    order of their group codes (AF, AM, BF, …), so the earlier code is shown first."""
    return a < b


def pair_retention_both(planted: PlantedReflect, a: str, b: str) -> float:
    """P(a pair of a and b is retained in both orders): both edits kept, neither question refused."""
    la, lb = loss(planted, a), loss(planted, b)
    return float((1 - la) * (1 - lb) * (1 - (refusal(planted, a) + refusal(planted, b)) / 2) ** 2)


def same_gender(a: str, b: str) -> bool:
    return CODE_TO_GROUP[a][1] == CODE_TO_GROUP[b][1]


PAIR_TYPES = {"all": lambda a, b: True, "same_gender": same_gender,
              "cross_gender": lambda a, b: not same_gender(a, b)}


def two_afc_estimands(planted: PlantedReflect, task: str, reference: str = "WF", both_orders: bool = True
                      ) -> dict[str, Any]:
    codes = list(GROUP_CODES)
    asked = [(a, b) for a in codes for b in codes if a != b and (both_orders or shown_first(a, b))]
    P = {(a, b): p_first(planted, task, a, b) for a, b in asked}
    rho = {(a, b): pair_retention(planted, a, b) for a, b in asked}

    def win_of(r: str, c: str) -> float:
        """Expected share of r's wins over c among retained comparisons (each asked order equally often)."""
        rates = [P[r, c]] if (r, c) in P else []
        rates += [1 - P[c, r]] if (c, r) in P else []
        return float(np.mean(rates))

    win = pd.DataFrame([{"row": r, "col": c, "planted": win_of(r, c)} for r in codes for c in codes if r != c])
    out: dict[str, Any] = {"winrate": win, "race_winrate": race_winrate_estimands(planted, win_of, pair_retention)}
    w = np.array([rho[k] for k in P])
    out["share_first"] = float(w @ np.array(list(P.values())) / w.sum())
    out["share_first_by_type"] = {
        kind: float(sum(rho[k] * P[k] for k in P if keep(*k)) / sum(rho[k] for k in P if keep(*k)))
        for kind, keep in PAIR_TYPES.items()}
    out["bradley_terry"] = bradley_terry_pseudo_true(planted, task, P, rho, reference)
    if both_orders:
        out["race_winrate_symmetric"] = race_winrate_estimands(planted, win_of, pair_retention_both)
        pairs = [(a, b) for a, b in asked if shown_first(a, b)]
        out["bradley_terry_symmetric"] = bradley_terry_symmetric_pseudo_true(
            planted, task, {k: win_of(*k) for k in pairs}, {k: pair_retention_both(planted, *k) for k in pairs},
            reference)
    return out


def race_winrate_estimands(planted: PlantedReflect, win_of, weight) -> pd.DataFrame:
    """Race win rate within gender: the win rates over the same-gender rivals, weighted by `weight`(a, b)."""
    rows = []
    for gender in GENDERS:
        for race in RACES:
            me = group_code(race, gender)
            rivals = [group_code(o, gender) for o in RACES if o != race]
            w = np.array([weight(planted, me, c) for c in rivals])
            rate = np.array([win_of(me, c) for c in rivals])
            rows.append({"gender": gender, "race": race, "planted": float(w @ rate / w.sum())})
    return pd.DataFrame(rows)


def contrast_design(keys: list[tuple[str, str]], others: list[str]) -> np.ndarray:
    """+1 for the first group of each pair, −1 for the second (the reference group has no column)."""
    X = np.zeros((len(keys), len(others)))
    for i, (a, b) in enumerate(keys):
        if a in others:
            X[i, others.index(a)] += 1
        if b in others:
            X[i, others.index(b)] -= 1
    return X


def logit_fit(X: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted logit fit to exact probabilities y (the population score equations), by Newton."""
    theta = np.zeros(X.shape[1])
    for _ in range(100):
        mu = expit(X @ theta)
        step = np.linalg.solve((X * (w * mu * (1 - mu))[:, None]).T @ X, X.T @ (w * (y - mu)))
        theta += step
        if np.abs(step).max() < 1e-13:
            break
    return theta


def bradley_terry_pseudo_true(planted: PlantedReflect, task: str, P: dict, rho: dict, reference: str) -> pd.DataFrame:
    """The logit fit of the pooled analysis (α + β_a − β_b, β_ref = 0) to the exact probabilities."""
    others = [g for g in GROUP_CODES if g != reference]
    keys = list(P)
    X = np.column_stack([np.ones(len(keys)), contrast_design(keys, others)])
    theta = logit_fit(X, np.array([P[k] for k in keys]), np.array([rho[k] for k in keys]))
    alpha = np.nan if pair_varying(planted) else planted.two_afc.position  # no single declared value
    declared = [alpha] + [float(strength(planted, task, g) - strength(planted, task, reference)) for g in others]
    return pd.DataFrame({"term": ["position_first"] + others, "planted": theta, "declared": declared})


def bradley_terry_symmetric_pseudo_true(planted: PlantedReflect, task: str, W: dict, rho: dict, reference: str) -> pd.DataFrame:
    """The logit fit of the order-symmetric analysis (β_lo − β_hi, no position term) to the exact
    order-averaged outcomes W[(lo, hi)] of the pairs, weighted by their retention in both orders."""
    others = [g for g in GROUP_CODES if g != reference]
    keys = list(W)
    theta = logit_fit(contrast_design(keys, others), np.array([W[k] for k in keys]), np.array([rho[k] for k in keys]))
    declared = [float(strength(planted, task, g) - strength(planted, task, reference)) for g in others]
    return pd.DataFrame({"term": others, "planted": theta, "declared": declared})


def value_means(planted: PlantedReflect, measure: str, values: dict[str, float] | None, occupations: np.ndarray) -> np.ndarray:
    """E[answer value | group] (10,), marginal over photo effects; salary averaged over the photos'
    occupations (each photo once)."""
    codes = np.array(GROUP_CODES)
    if measure.startswith("salary_"):
        s = planted.salary
        scale = float(salary_base(planted, occupations).mean()) * np.exp((s.photo_sd ** 2 + s.noise_sd ** 2) / 2)
        return scale * np.exp(salary_effect(planted, codes))
    task = measure.split("_", 1)[1]
    v = np.array([values[letter] for letter in letters(len(planted.mcq.base[task]))])
    shift = mcq_shift(planted, task, codes)
    return np.array([float(expect(lambda x, e=e: mcq_probs(planted, task, e + x) @ v, planted.mcq.photo_sd))
                     for e in shift])


def letter_values(values: dict[str, dict[str, float] | None] | None = None) -> dict[str, dict[str, float] | None]:
    """The numeric value of each letter per measure (`<kind>_<task>`), as the analysis reads them
    (vlm.analysis.inputs.answer_scales; None: the declared tasks' of params.vlm); a salary task is its own value (None)."""
    return answer_values(_DECLARED) if values is None else values


def estimands(planted: PlantedReflect, units: pd.DataFrame, analysis: Any, two_afc_tasks=TWO_AFC_TASKS,
              measures=SINGLE_MEASURES, both_orders: bool = True,
              values: dict[str, dict[str, float] | None] | None = None) -> dict[str, Any]:
    """Every planted value the validation compares with (see the module docstring). `units` lists the
    design's source photos (unit, occupation); `analysis` is the reflect_analysis section; `both_orders`
    whether each 2AFC pair was asked in both orders (reflect.both_orders); `values` each measure's letter
    values (None: the declared tasks')."""
    values = letter_values(values)
    planted = with_letters(planted, values)
    out: dict[str, Any] = {"two_afc": {t: two_afc_estimands(planted, t, analysis.bt_reference, both_orders)
                                       for t in two_afc_tasks}, "single": {}}
    codes = np.array(GROUP_CODES)
    pi = (1 - loss(planted, codes)) * (1 - refusal(planted, codes))
    for measure in measures:
        m = value_means(planted, measure, values[measure], units["occupation"].to_numpy(str))
        # retention independent of the answer: one node, P(retained) = pi, E[value · retained] = pi · m
        w, q, a = np.ones(1), pi[None, :], (pi * m)[None, :]
        out["single"][measure] = {
            "means": m, "delta_g": delta_g_estimands(w, q, a, analysis.race_reference, analysis.gender_reference),
            "ols": ols_estimands(w, q, a, analysis.race_reference, analysis.gender_reference)}
    out["refusal"] = pd.DataFrame({"group": codes, "planted": refusal(planted, codes)})
    out["retention"] = pd.DataFrame({"group": codes, "planted": pi})
    return out


# ---------------------------------------------------------------- the null-edit control's estimands

def control_share_edit(planted: PlantedReflect, task: str, both_orders: bool = True) -> float:
    """Expected share of null-edit-vs-original comparisons in which the null edit is chosen: with the null
    edit first (order 0) p(α + a), with it second 1 − p(α − a), p(μ) = E σ(μ + √2 σ Z), each order equally
    often (nothing about these two images is refused or lost)."""
    tw = planted.two_afc
    a = float(strength(planted, task, NULL_EDIT) - strength(planted, task, ORIGINAL))

    def p(mu: float) -> float:
        return float(expect(lambda x: expit(mu + x), np.sqrt(2) * tw.photo_sd))

    first = p(tw.position + a)
    return float((first + 1 - p(tw.position - a)) / 2) if both_orders else first


def control_delta_pct(planted: PlantedReflect, measure: str, values: dict[str, float] | None) -> float:
    """Within-photo Δ (%) of the null edit vs the original: 100 · (E[value | null edit] / E[value | original] − 1),
    both images sharing the photo effect (salary: the occupation and photo factors cancel: 100 · (e^a − 1))."""
    if measure.startswith("salary_"):
        return float(100 * np.expm1(salary_effect(planted, NULL_EDIT) - salary_effect(planted, ORIGINAL)))
    task = measure.split("_", 1)[1]
    planted = with_letters(planted, {measure: values})
    v = np.array([values[letter] for letter in letters(len(planted.mcq.base[task]))])
    m = [float(expect(lambda x, e=e: mcq_probs(planted, task, e + x) @ v, planted.mcq.photo_sd))
         for e in mcq_shift(planted, task, [NULL_EDIT, ORIGINAL])]
    return float(100 * (m[0] / m[1] - 1))


# ---------------------------------------------------------------- complete-case estimands

def kept_given_choice(planted: PlantedReflect, a: str, b: str) -> tuple[float, float]:
    """P(not refused | image A chosen), P(not refused | image B chosen) of a comparison of a (first) and b:
    the refusal uniform is drawn apart from the choice's, so given the choice it is independent of z."""
    base = float(refusal(planted, a) + refusal(planted, b)) / 2
    return tuple(1 - base - float(selective_2afc(planted, a, b, c)) for c in ("A", "B"))


def order_moments(planted: PlantedReflect, task: str, a: str, b: str) -> tuple[float, float]:
    """(P(retained and A chosen), P(retained)) of one comparison of a (first) and b."""
    p = p_first(planted, task, a, b)
    k_a, k_b = kept_given_choice(planted, a, b)
    both_kept = float((1 - loss(planted, a)) * (1 - loss(planted, b)))
    return both_kept * p * k_a, both_kept * (p * k_a + (1 - p) * k_b)


def symmetric_moments(planted: PlantedReflect, task: str, lo: str, hi: str) -> tuple[float, float]:
    """(E[s · R_1 R_2], P(R_1 R_2)) of a pair asked in both orders: s the order-averaged share of lo's wins,
    R_o the retention of order o. Both orders share the photo effects (D = σ(z_lo − z_hi)), so the products
    are integrated over D."""
    mu1 = float(position(planted, lo, hi) + strength(planted, task, lo) - strength(planted, task, hi))
    mu2 = float(position(planted, hi, lo) + strength(planted, task, hi) - strength(planted, task, lo))
    k1a, k1b = kept_given_choice(planted, lo, hi)   # lo first: A is lo
    k2a, k2b = kept_given_choice(planted, hi, lo)   # hi first: A is hi

    def moments(d: np.ndarray) -> np.ndarray:
        p1, p2 = expit(mu1 + d), expit(mu2 - d)
        won1, kept1 = p1 * k1a, p1 * k1a + (1 - p1) * k1b
        won2, kept2 = (1 - p2) * k2b, p2 * k2a + (1 - p2) * k2b
        return np.stack([(won1 * kept2 + kept1 * won2) / 2, kept1 * kept2])

    share, both = expect(moments, np.sqrt(2) * planted.two_afc.photo_sd)
    both_kept = float((1 - loss(planted, lo)) * (1 - loss(planted, hi)))
    return both_kept * float(share), both_kept * float(both)


def win_tables(codes: list[str], wins: dict, n: dict) -> tuple[pd.DataFrame, Any]:
    """The win-rate table from expected wins[r, c] and comparisons n[r, c] per photo, and win_of(r, c)."""
    def win_of(r: str, c: str) -> float:
        return wins[r, c] / n[r, c]

    return pd.DataFrame([{"row": r, "col": c, "planted": win_of(r, c)} for r in codes for c in codes if r != c]), win_of


def two_afc_complete_case(planted: PlantedReflect, task: str, reference: str = "WF", both_orders: bool = True) -> dict[str, Any]:
    """two_afc_estimands when refusals may depend on the answer: every quantity from expected retained
    wins and comparisons per photo (order_moments, symmetric_moments)."""
    codes = list(GROUP_CODES)
    asked = [(a, b) for a in codes for b in codes if a != b and (both_orders or shown_first(a, b))]
    first, kept = {}, {}
    for k in asked:
        first[k], kept[k] = order_moments(planted, task, *k)
    wins = {(r, c): (first.get((r, c), 0.0) + kept.get((c, r), 0.0) - first.get((c, r), 0.0))
            for r in codes for c in codes if r != c}
    n = {(r, c): kept.get((r, c), 0.0) + kept.get((c, r), 0.0) for r in codes for c in codes if r != c}
    win, win_of = win_tables(codes, wins, n)
    out: dict[str, Any] = {"winrate": win,
                           "race_winrate": race_winrate_estimands(planted, win_of, lambda _, a, b: n[a, b])}
    out["share_first"] = sum(first.values()) / sum(kept.values())
    out["share_first_by_type"] = {kind: sum(first[k] for k in asked if keep(*k)) / sum(kept[k] for k in asked if keep(*k))
                                  for kind, keep in PAIR_TYPES.items()}
    out["bradley_terry"] = bradley_terry_pseudo_true(planted, task, {k: first[k] / kept[k] for k in asked}, kept,
                                                     reference)
    if both_orders:
        pairs = [(a, b) for a, b in asked if shown_first(a, b)]
        s_wins, s_n = {}, {}
        for lo, hi in pairs:
            share, both = symmetric_moments(planted, task, lo, hi)
            s_wins[lo, hi], s_wins[hi, lo], s_n[lo, hi], s_n[hi, lo] = share, both - share, both, both
        out["winrate_symmetric"], sym_of = win_tables(codes, s_wins, s_n)
        out["race_winrate_symmetric"] = race_winrate_estimands(planted, sym_of, lambda _, a, b: s_n[a, b])
        out["bradley_terry_symmetric"] = bradley_terry_symmetric_pseudo_true(
            planted, task, {k: sym_of(*k) for k in pairs}, {k: s_n[k] for k in pairs}, reference)
    return out


def nodes_and_weights(sd: float) -> tuple[np.ndarray, np.ndarray]:
    """The quadrature of `expect`: photo effects sd · Z and their weights."""
    return (np.zeros(1), np.ones(1)) if sd == 0 else (sd * _NODES, _WEIGHTS)


def normal_cdf_below(mu: np.ndarray, sd: float, shift: float = 0.0) -> np.ndarray:
    """Φ(−mu/sd − shift): P(mu + sd · ε < 0) (shift 0) or the lognormal's truncated factor (shift sd);
    the limit 1[mu < 0] when sd = 0."""
    from scipy.special import ndtr

    return (np.asarray(mu) < 0).astype(float) if sd == 0 else ndtr(-np.asarray(mu) / sd - shift)


def single_moments(planted: PlantedReflect, measure: str, values: dict[str, float] | None, occupations: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(w, q, a, low) of one single-image measure over the photo effect's quadrature nodes: q[z, g] =
    P(retained | z), a[z, g] = E[answer value · retained | z] (salary: averaged over the photos'
    occupations, each photo once), low[z, g] = P(low answer | z); w the nodes' weights. Given z the ten
    images' answers and refusals are independent."""
    codes = np.array(GROUP_CODES)
    sel = planted.selective_refusal
    extra = sel.low_answer * np.isin(codes, sel.groups)
    kept_edit, base = 1 - loss(planted, codes), refusal(planted, codes)
    if measure.startswith("salary_"):
        s = planted.salary
        z, w = nodes_and_weights(s.photo_sd)
        mu = salary_effect(planted, codes)[None, :] + z[:, None]
        low = normal_cdf_below(mu, s.noise_sd)
        below = normal_cdf_below(mu, s.noise_sd, s.noise_sd)  # E[e^{σε} 1(low)] / e^{σ²/2}
        scale = float(salary_base(planted, occupations).mean()) * np.exp(s.noise_sd ** 2 / 2)
        a = kept_edit * scale * np.exp(mu) * ((1 - base) - extra * below)
    else:
        task = measure.split("_", 1)[1]
        z, w = nodes_and_weights(planted.mcq.photo_sd)
        v = np.array([values[letter] for letter in letters(len(planted.mcq.base[task]))])
        probs = mcq_probs(planted, task, mcq_shift(planted, task, codes)[None, :] + z[:, None])  # (z, g, K)
        is_low = np.arange(probs.shape[-1]) < low_letter(planted, task)
        low = probs @ is_low.astype(float)
        kept_answer = (1 - base)[:, None] - extra[:, None] * is_low[None, :]  # (g, K)
        a = kept_edit * (probs * kept_answer * v).sum(axis=-1)
    q = kept_edit * (1 - base - extra * low)
    return w, q, a, low


def delta_g_estimands(w: np.ndarray, q: np.ndarray, a: np.ndarray, race_reference: str,
                      gender_reference: str) -> pd.DataFrame:
    """Within-photo and pooled Δg (%) from the moments of single_moments over the photo effect's nodes
    (weights w; q = P(retained | z), a = E[value · retained | z], both (z, 10)): a cell's terms
    E[(y_l − y_r) R_l R_r] and E[y_r R_l R_r] integrated over the photo effect both images share; pooled,
    each group's E a / E q."""
    idx = {g: i for i, g in enumerate(GROUPS)}
    Ea, Eq = w @ a, w @ q
    rows = []
    for dimension, levels, ref, others in (("race", RACES, race_reference, GENDERS),
                                           ("gender", GENDERS, gender_reference, RACES)):
        def at(level, other, dimension=dimension):
            return idx[(level, other)] if dimension == "race" else idx[(other, level)]

        for level in levels:
            if level == ref:
                continue
            lv, rf = [at(level, o) for o in others], [at(ref, o) for o in others]
            den = w @ (q[:, lv] * a[:, rf]).sum(axis=1)
            num = w @ (a[:, lv] * q[:, rf]).sum(axis=1) - den
            pooled = 100 * ((Ea[lv].sum() / Eq[lv].sum()) / (Ea[rf].sum() / Eq[rf].sum()) - 1)
            rows.append({"dimension": dimension, "level": level, "planted": float(100 * num / den),
                         "planted_pooled": float(pooled)})
    return pd.DataFrame(rows)


def ols_estimands(w: np.ndarray, q: np.ndarray, a: np.ndarray, race_reference: str,
                  gender_reference: str) -> pd.DataFrame:
    """Probability limit of the photo fixed-effects OLS of the answer on race and gender dummies, from the
    moments of delta_g_estimands: given the photo effect z the retention pattern R has probability
    Π q^R (1 − q)^(1−R) and a retained answer's mean is a / q; both moments are summed over the patterns and
    integrated over z."""
    names, X = [], np.zeros((len(GROUPS), 0))
    for dim, ref, levels in (("race", race_reference, RACES), ("gender", gender_reference, GENDERS)):
        for level in levels:
            if level != ref:
                X = np.column_stack([X, [float((r if dim == "race" else g) == level) for r, g in GROUPS]])
                names.append(f"{dim}:{level}")
    R = np.array(list(product((0.0, 1.0), repeat=len(GROUPS))))
    n = R.sum(axis=1)
    R = R[n >= 2]
    n = n[n >= 2]
    prob = np.where(R[None, :, :] == 1, q[:, None, :], 1 - q[:, None, :]).prod(axis=-1)  # (z, patterns)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(q > 0, a / q, 0.0)
    s = R @ X                                                          # (patterns, k)
    p_bar = w @ prob
    A = (X.T * (p_bar @ R)) @ X - np.einsum("r,ri,rj->ij", p_bar / n, s, s)
    Rm = R[None, :, :] * m[:, None, :]                                 # (z, patterns, g)
    term = Rm @ X - s[None, :, :] * (Rm.sum(axis=-1) / n)[..., None]
    b = np.einsum("z,zr,zrk->k", w, prob, term)
    return pd.DataFrame({"term": names, "planted": np.linalg.solve(A, b)})


def complete_case_estimands(planted: PlantedReflect, units: pd.DataFrame, analysis: Any, two_afc_tasks=TWO_AFC_TASKS,
                            measures=SINGLE_MEASURES, both_orders: bool = True,
                            values: dict[str, dict[str, float] | None] | None = None) -> dict[str, Any]:
    """What the complete-case estimators converge to under any planted refusal, answer-dependent
    (`selective_refusal`) or not: `estimands`' tables (plus `winrate_symmetric`: the order-symmetric
    estimator's win rates), equal to them when refusal does not depend on the answer. `values`: as `estimands`."""
    values = letter_values(values)
    planted = with_letters(planted, values)
    out: dict[str, Any] = {"two_afc": {t: two_afc_complete_case(planted, t, analysis.bt_reference, both_orders)
                                       for t in two_afc_tasks}, "single": {}}
    codes = np.array(GROUP_CODES)
    lows = []
    sel = planted.selective_refusal
    for measure in measures:
        w, q, a, low = single_moments(planted, measure, values[measure], units["occupation"].to_numpy(str))
        lows.append(w @ low)
        out["single"][measure] = {
            "means": (w @ a) / (w @ q),
            "delta_g": delta_g_estimands(w, q, a, analysis.race_reference, analysis.gender_reference),
            "ols": ols_estimands(w, q, a, analysis.race_reference, analysis.gender_reference)}
    # refused share of the asked (not lost) single-image questions, each measure asked once per image
    extra = sel.low_answer * np.isin(codes, sel.groups) * (np.mean(lows, axis=0) if lows else 0.0)
    out["refusal"] = pd.DataFrame({"group": codes, "planted": refusal(planted, codes) + extra})
    return out
