"""Strict parsing of model answers: exactly one allowed option, or None with a reason.

The raw answer is always kept by the caller; these functions only decide what it means.
    parse_choice("**B**", ("A", "B"))               -> ("B", "")
    parse_choice("Answer: hispanic/latino", LABELS) -> ("hispanic", "")  (with aliases)
    parse_choice("I can't determine race", LABELS)  -> (None, "refusal: ...")
    parse_usd("$85,000")                            -> (85000, "")
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# Answers that decline the task. Checked before matching options, so "I cannot say if she is white"
# counts as a refusal rather than a label.
REFUSAL_PATTERNS = (
    r"\bI(?:'m| am)? (?:can ?not|can't|cannot|won't|will not|am unable|'m unable|unable)\b",
    r"\b(?:not able|unable) to (?:determine|identify|tell|say|classify|infer|assess)",
    r"\bI (?:do not|don't) (?:feel comfortable|think it(?:'s| is) appropriate)",
    r"\b(?:sorry|apologi[sz]e)\b",
    r"\b(?:impossible|not possible|inappropriate) to (?:determine|tell|say|classify|infer)",
    r"\bas an AI\b",
    r"\bcannot be determined\b",
)
_REFUSAL_RE = re.compile("|".join(REFUSAL_PATTERNS), re.IGNORECASE)
_PREFIX_RE = re.compile(r"^\s*(?:final\s+)?(?:answer|label|option|choice|classification|race(?:/ethnicity)?)\s*[:=\-]\s*",
                        re.IGNORECASE)
_DECOR_RE = re.compile(r"[*_`\"'“”‘’\[\](){}<>]")

# Common spellings of the Method A labels.
LABEL_ALIASES: dict[str, str] = {
    "hispanic/latino": "hispanic", "hispanic or latino": "hispanic", "latino": "hispanic", "latina": "hispanic",
    "latinx": "hispanic", "latino/hispanic": "hispanic", "caucasian": "white", "african american": "black",
    "african-american": "black", "east asian": "asian", "south asian": "asian", "southeast asian": "asian",
}


def _norm(text: str) -> str:
    text = _DECOR_RE.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip().lower()


def is_refusal(text: str) -> bool:
    return bool(_REFUSAL_RE.search(text or ""))


def parse_choice(text: str | None, options: Sequence[str],
                 aliases: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Map an answer to exactly one of `options` (case-insensitive), or (None, reason).

    Accepts the option itself ("White", "**white**", "Answer: white.", "white - the person ..."),
    a letter when options are letters ("A.", "(b)", "Answer: c"), and `aliases` (defaults to
    LABEL_ALIASES restricted to the options). Reasons: 'empty answer', 'refusal: …',
    'several options: a, b', 'off-list answer: …'.
    """
    if text is None or not str(text).strip():
        return None, "empty answer"
    raw = str(text).strip()
    opts = {o.lower(): o for o in options}
    if any("_" in o for o in options):  # a group set's `visible_minority`: `_` is part of the word, not decoration
        raw = raw.replace("_", " ")
        opts = {o.lower().replace("_", " "): o for o in options}
    if aliases is None:
        aliases = {k: v for k, v in LABEL_ALIASES.items() if v in opts}
    alias_map = {k.lower(): opts[v.lower()] for k, v in aliases.items() if v.lower() in opts}
    norm = _norm(_PREFIX_RE.sub("", _DECOR_RE.sub("", raw)))
    norm = norm.rstrip(" .!,;:")
    # 1. the whole answer is one option or alias
    if norm in opts:
        return opts[norm], ""
    if norm in alias_map:
        return alias_map[norm], ""
    if is_refusal(raw):
        return None, f"refusal: {raw[:120]}"
    # 2. letter options ("A", "B", ...) only count at the start: "B. nurse", "(c) because ..."
    if opts and all(len(o) == 1 for o in opts):
        body = _PREFIX_RE.sub("", raw.strip().lstrip("*_`[ ")).lstrip("*_`[ ")
        m = re.match(r"^\(?([A-Za-z])\)?([.):,*]|\s|$)", body)
        # a lowercase letter followed by a space is an article ("a person"), not an answer
        if m and m.group(1).lower() in opts and not (m.group(1).islower() and m.group(0) == m.group(1) + m.group(2) and m.group(2).isspace()):
            others = {t for t in re.findall(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])", body[m.end():])
                      if t.lower() in opts and t.lower() != m.group(1).lower()}
            if others:
                return None, "several options: " + ", ".join([m.group(1).upper(), *sorted(others)])
            return opts[m.group(1).lower()], ""
        return None, f"off-list answer: {raw[:120]}"
    # 3. find every option / alias mentioned as a whole word (longest names first, no overlaps)
    names = sorted({**{k: opts[k] for k in opts}, **alias_map}.items(), key=lambda kv: -len(kv[0]))
    found: dict[str, int] = {}
    taken = norm
    for name, option in names:
        pattern = re.compile(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])")
        m = pattern.search(taken)
        if m:
            found.setdefault(option, m.start())
            taken = pattern.sub(" " * len(name), taken)
    if len(found) > 1:
        return None, "several options: " + ", ".join(sorted(found, key=found.get))
    if len(found) == 1:
        return next(iter(found)), ""
    return None, f"off-list answer: {raw[:120]}"


_NUM = r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)\s*(k|thousand|m|million)?"
_USD_RE = re.compile(r"(?:US)?\$?\s*" + _NUM, re.IGNORECASE)
_RANGE_RE = re.compile(r"\$?\s*" + _NUM + r"\s*(?:-|–|—|to)\s*\$?\s*" + _NUM, re.IGNORECASE)
_MULT = {"k": 1_000, "thousand": 1_000, "m": 1_000_000, "million": 1_000_000}


def _amount(number: str, suffix: str | None) -> float:
    return float(number.replace(",", "")) * _MULT.get((suffix or "").lower(), 1)


def parse_usd(text: str | None) -> tuple[int | None, str]:
    """A yearly salary in US dollars from an answer: "$85,000", "85k", "USD 85000", "$1.2 million".

    A range ("$80,000-$90,000", "80k to 90k") gives its midpoint with reason 'range: lo-hi';
    several distinct amounts, a refusal or no number give None with a reason.
    """
    if text is None or not str(text).strip():
        return None, "empty answer"
    raw = str(text)
    if is_refusal(raw) and not re.search(r"\d", raw):
        return None, f"refusal: {raw.strip()[:120]}"
    m = _RANGE_RE.search(raw)
    if m:
        lo, hi = _amount(m.group(1), m.group(2) or m.group(4)), _amount(m.group(3), m.group(4))
        if hi < lo:
            return None, f"bad range: {m.group(0)}"
        return int(round((lo + hi) / 2)), f"range: {int(lo)}-{int(hi)}"
    amounts = [_amount(n, s) for n, s in _USD_RE.findall(raw)]
    amounts = [a for a in amounts if a >= 1]
    if not amounts:
        return None, f"no amount: {raw.strip()[:120]}"
    if len(set(amounts)) > 1:
        return None, "several amounts: " + ", ".join(str(int(a)) for a in amounts[:5])
    return int(round(amounts[0])), ""
