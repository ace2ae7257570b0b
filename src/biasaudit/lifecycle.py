"""Hosted models change under the same name: their lifecycle as data, with its evidence, and who answered.

`data/reference/models/lifecycle.yaml` holds one entry per hosted model id a profile names: its status
(`served`, `deprecated` with the announced shutdown date, `retired` with the day it stopped, or `unconfirmed`
with what the other pages `claimed`), the pages that say so (`evidence`: url, the page's date, the day it was
read, the page's own words as `quote`, and our reading as `says`), the chain of replacements its provider
documents (`replacements`, one step per page), the values of request parameters it takes (`accepts`), and
`aliases` — other names the API may report for it (`modelVersion`, the OpenAI-compatible `model`).

A status other than `unconfirmed` must rest on a quote from a page of the model's provider (its domains are
the file's `providers:`); a status that rests only on third-party pages, or on a provider page whose words were
not kept, is `unconfirmed`, and `missing` says what evidence is lacking (`parse` refuses anything else). A
deprecated model whose shutdown date has passed is retired (`ModelStatus.effective`, from today's date).
`biasaudit check` lists every retired model as a missing need (weights.needs), so a profile that names one exits
1 before any request, and warns on every unconfirmed one (`warnings`) without failing; it refuses a parameter
value a model does not accept (`refused_values`), naming the values it does. The probe of every hosted stage
asks `stop_reason` first: a retired model stops the stage without a request.

`answered_as_asked(asked, reported)` is the rule every hosted backend applies to each answer: the name the
API reports must be the model asked, a dated snapshot of it (`gpt-5` → `gpt-5-2025-08-07`,
`gemini-2.0-flash` → `gemini-2.0-flash-001`), or one of its declared aliases (fnmatch patterns). Anything
else is a re-routed answer: it is failed (never cached) and the stage stops, naming both. An answer that names
no model cannot be checked: its row records `UNVERIFIED` as the answering version (`version_of`), and the engine
stops the stage on such a row under `execution.require_verified_model` (on by default).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from biasaudit.pipeline.work import UNVERIFIED  # the answering version a row records when the API named none

LIFECYCLE_FILE = Path("data/reference/models/lifecycle.yaml")
STATUSES = ("served", "deprecated", "retired", "unconfirmed")
CONFIRMED = ("served", "deprecated", "retired")
# a snapshot suffix the providers append to the name asked: -2025-08-07 (OpenAI, DashScope), -001 (Google),
# -09-2025 (Google previews), -20250807
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{2}-\d{4}|\d{3}|\d{8})$")


class LifecycleError(ValueError):
    """The lifecycle file cannot be read: the message names the file and the line (YAML) or the key (schema)."""


def today() -> date:
    """The day lifecycle dates are compared with (a function, so that tests can fix the clock)."""
    return date.today()


@dataclass(frozen=True)
class Evidence:
    url: str
    says: str                      # our reading of the page (never presented as its words)
    quote: str = ""                # the page's own words, verbatim ('…' marks a cut); '' when none was kept
    page_date: str = ""            # the date the page gives the statement (a changelog entry's day)
    read: str = ""                 # the day we read the page
    third_party: bool = False      # outside the provider's domains (set by `parse`)
    model: str = ""                # a replacement step: the model this page names

    def cite(self) -> str:
        when = ", ".join(x for x in (f"dated {self.page_date}" if self.page_date else "",
                                     f"read {self.read}" if self.read else "") if x)
        who = "third-party page " if self.third_party else ""
        words = f': "{self.quote}"' if self.quote else f" (no quote kept: {self.says})"
        return f"{who}{self.url}{f' ({when})' if when else ''}{words}"

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in ("", False)}


@dataclass(frozen=True)
class Accepts:
    values: tuple[str, ...]
    source: Evidence


@dataclass(frozen=True)
class ModelStatus:
    model_id: str
    provider: str
    status: str                    # served | deprecated | retired | unconfirmed
    evidence: tuple[Evidence, ...] = ()
    date: str = ""                 # deprecated: announced shutdown; retired: the day it stopped; unconfirmed: claimed
    claimed: str = ""              # unconfirmed: the status the unquoted or third-party pages claim
    missing: str = ""              # unconfirmed: the evidence that is lacking
    replacements: tuple[Evidence, ...] = ()  # the provider's chain, one step per page (Evidence.model)
    accepts: dict[str, Accepts] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # other names the API may report for this model (fnmatch patterns)
    api: str = ""

    @property
    def replacement(self) -> str:
        """The model to use instead: the last step of the documented chain ('' when none is named)."""
        return self.replacements[-1].model if self.replacements else ""

    @property
    def source(self) -> str:
        """The first provider page among the evidence (else the first page)."""
        own = [e for e in self.evidence if not e.third_party]
        return (own or list(self.evidence))[0].url if self.evidence else ""

    @property
    def basis(self) -> str:
        """The provider's quoted page a confirmed status rests on, cited with its date and words."""
        quoted = [e for e in self.evidence if e.quote and not e.third_party]
        return (quoted or list(self.evidence))[0].cite() if self.evidence else ""

    def effective(self, on: date | None = None) -> str:
        """The status on the day `on` (today): a deprecated model whose shutdown date has passed is retired."""
        on = on or today()
        if self.status == "deprecated" and self.date and date.fromisoformat(self.date) <= on:
            return "retired"
        return self.status

    def chain(self) -> str:
        """'a → b (url, dated …) → c (url)' as the provider documents it, or that it names none."""
        if not self.replacements:
            return "no replacement named"
        steps = [f"{s.model} ({s.url}{', dated ' + s.page_date if s.page_date else ''}"
                 f"{', third-party' if s.third_party else ''})" for s in self.replacements]
        return " → ".join([self.model_id, *steps])

    def line(self, on: date | None = None) -> str:
        """One line for `biasaudit check` and the run records."""
        status, who = self.effective(on), f"{self.model_id} ({self.provider})"
        if status == "retired":
            passed = " (its shutdown date has passed)" if self.status == "deprecated" else ""
            return f"{who} retired on {self.date}{passed}; {self.chain()} (source: {self.basis})"
        if status == "deprecated":
            return f"{who} deprecated, shutdown {self.date}; {self.chain()} (source: {self.basis})"
        if status == "unconfirmed":
            claim = self.claimed + (f" on {self.date}" if self.date else "")
            if self.claimed == "deprecated" and self.date and date.fromisoformat(self.date) <= (on or today()):
                claim += " (a date that has passed)"
            pages = "; ".join(e.cite() for e in self.evidence)
            chain = f"; {self.chain()}" if self.claimed != "served" else ""
            return f"{who} unconfirmed: claimed {claim}; pages: {pages}; missing: {self.missing}{chain}"
        return f"{who} served (source: {self.basis})"

    def record(self, on: date | None = None) -> dict[str, Any]:
        return {"model_id": self.model_id, "provider": self.provider, "status": self.effective(on),
                "listed_status": self.status, "claimed": self.claimed, "date": self.date,
                "replacement": self.replacement, "replacements": [s.record() for s in self.replacements],
                "source": self.source, "evidence": [e.record() for e in self.evidence], "missing": self.missing}


def lifecycle_path() -> Path:
    """The working directory's data/reference/models/lifecycle.yaml, else the project's own."""
    if LIFECYCLE_FILE.is_file():
        return LIFECYCLE_FILE
    return Path(__file__).resolve().parents[2] / LIFECYCLE_FILE


def _day(value: Any, where: str) -> str:
    if value in (None, ""):
        return ""
    try:
        return date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a date (YYYY-MM-DD)") from None


def _evidence(raw: Any, where: str, domains: tuple[str, ...], step: bool = False) -> Evidence:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with url and says")
    unknown = set(raw) - {"url", "says", "quote", "page_date", "read", "model"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    url = str(raw.get("url") or "")
    host = urlparse(url).hostname or ""
    if urlparse(url).scheme != "https" or not host:
        raise ValueError(f"{where}.url: an https address is required, got {url!r}")
    if not raw.get("says"):
        raise ValueError(f"{where}.says: what the page says is required")
    if step and not raw.get("model"):
        raise ValueError(f"{where}.model: the model this page names is required")
    own = any(host == d or host.endswith("." + d) for d in domains)
    return Evidence(url=url, says=" ".join(str(raw["says"]).split()), quote=str(raw.get("quote") or ""),
                    page_date=_day(raw.get("page_date"), f"{where}.page_date"), read=_day(raw.get("read"), f"{where}.read"),
                    third_party=not own, model=str(raw.get("model") or ""))


def parse(data: dict[str, Any], where: str = "lifecycle") -> dict[str, ModelStatus]:
    """{model id: ModelStatus} from the YAML mapping; a LifecycleError naming the file, entry and key otherwise."""
    try:
        return _parse(data)
    except LifecycleError:
        raise
    except ValueError as exc:
        raise LifecycleError(f"{where}: {exc}") from None


def _parse(data: dict[str, Any]) -> dict[str, ModelStatus]:
    if not isinstance(data, dict):
        raise ValueError("expected a mapping with providers: and models:")
    providers = {str(k): tuple(str(d) for d in (v or ())) for k, v in (data.get("providers") or {}).items()}
    out: dict[str, ModelStatus] = {}
    for model_id, entry in (data.get("models") or {}).items():
        key = f"models.{model_id}"
        if not isinstance(entry, dict):
            raise ValueError(f"{key}: expected a mapping")
        status = entry.get("status")
        if status not in STATUSES:
            raise ValueError(f"{key}.status must be one of {STATUSES}, got {status!r}")
        provider = str(entry.get("provider") or "")
        if provider not in providers:
            raise ValueError(f"{key}.provider: {provider!r} is not among providers: ({', '.join(providers)}), "
                             "which give the domains of its own pages")
        raw_evidence = entry.get("evidence") or []
        if not isinstance(raw_evidence, list) or not raw_evidence:
            raise ValueError(f"{key}.evidence is required: the pages that state the status")
        evidence = tuple(_evidence(e, f"{key}.evidence[{i}]", providers[provider]) for i, e in enumerate(raw_evidence))
        day = _day(entry.get("date"), f"{key}.date")
        claimed = str(entry.get("claimed") or "")
        if status in CONFIRMED:
            if not any(e.quote and not e.third_party for e in evidence):
                raise ValueError(f"{key}.status: '{status}' needs a quote from a page of {provider} "
                                 f"({', '.join(providers[provider])}); without one the status is unconfirmed "
                                 "(claimed: the status the other pages give; missing: what evidence is lacking)")
            if claimed or entry.get("missing"):
                raise ValueError(f"{key}: claimed and missing belong to an unconfirmed entry")
        else:
            if claimed not in CONFIRMED:
                raise ValueError(f"{key}.claimed must be one of {CONFIRMED} for an unconfirmed model, got {claimed!r}")
            if not entry.get("missing"):
                raise ValueError(f"{key}.missing is required for an unconfirmed model: the evidence that is lacking")
        if (status if status in CONFIRMED else claimed) in ("deprecated", "retired") and not day:
            raise ValueError(f"{key}.date is required for a {status if status in CONFIRMED else 'claimed ' + claimed} model")
        steps = entry.get("replacements") or []
        if not isinstance(steps, list):
            raise ValueError(f"{key}.replacements: expected a list of steps (model, url, says)")
        accepts: dict[str, Accepts] = {}
        for param, spec in (entry.get("accepts") or {}).items():
            if not isinstance(spec, dict) or not spec.get("values"):
                raise ValueError(f"{key}.accepts.{param}.values: the accepted values are required")
            source = _evidence({k: v for k, v in spec.items() if k != "values"}, f"{key}.accepts.{param}",
                               providers[provider])
            accepts[str(param)] = Accepts(tuple(str(v) for v in spec["values"]), source)
        out[str(model_id)] = ModelStatus(
            model_id=str(model_id), provider=provider, status=status, evidence=evidence, date=day, claimed=claimed,
            missing=" ".join(str(entry.get("missing") or "").split()),
            replacements=tuple(_evidence(s, f"{key}.replacements[{i}]", providers[provider], step=True)
                               for i, s in enumerate(steps)),
            accepts=accepts, aliases=tuple(entry.get("aliases") or ()), api=str(entry.get("api") or ""))
    return out


@lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int) -> dict[str, ModelStatus]:
    from biasaudit.config import ParamsError, strict_yaml

    try:
        data = strict_yaml(Path(path).read_text(encoding="utf-8"), path) or {}
    except ParamsError as exc:
        raise LifecycleError(str(exc)) from None
    return parse(data, path)


def table(path: Path | None = None) -> dict[str, ModelStatus]:
    """Every model of the lifecycle file (cached while the file is unchanged)."""
    path = Path(path) if path is not None else lifecycle_path()
    if not path.is_file():
        return {}
    return _load(str(path), path.stat().st_mtime_ns)


def bare(model_id: str) -> str:
    """`models/gemini-x` → `gemini-x`; `publishers/google/models/imagen-x` → `imagen-x`."""
    return str(model_id or "").rsplit("models/", 1)[-1]


_VARIANT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{2}-\d{4}|\d{3}|\d{8}|latest|preview(-[\w.-]+)?)$")


def status_of(model_id: str, path: Path | None = None) -> ModelStatus | None:
    """The entry of `model_id`, whatever its case, prefix (`models/`) or variant suffix (a dated snapshot,
    -001, -latest, -preview-…): a snapshot of a retired model is retired too."""
    entries = table(path)
    name = bare(model_id).strip().lower()
    if name in entries:
        return entries[name]
    for known, entry in entries.items():
        if name.startswith(known + "-") and _VARIANT.fullmatch(name[len(known):]):
            return entry
    return None


def status_record(model_id: str, path: Path | None = None, versions: Any = None) -> dict[str, Any]:
    """What a run records about a model it used: its lifecycle entry, or `unlisted` (a local or user model); with
    the run's rows' `model_version` values (`versions`), the versions that answered and how many answers named
    none (`unverified_answers`: recorded only under execution.require_verified_model false)."""
    found = status_of(model_id, path)
    out = found.record() if found else {"model_id": model_id, "status": "unlisted"}
    if versions is not None:
        seen = [str(v) for v in versions if v is not None and str(v) not in ("", "nan")]
        out["answering_versions"] = sorted(set(seen) - {UNVERIFIED})
        out["unverified_answers"] = sum(v == UNVERIFIED for v in seen)
    return out


def stop_reason(model_id: str, on: date | None = None) -> str:
    """Why a hosted stage must not send a request to `model_id` on the day `on` (today): a retired model, or a
    deprecated one whose shutdown date has passed; '' otherwise (an unconfirmed claim does not stop: the probe
    asks the API)."""
    found = status_of(model_id)
    if found is None or found.effective(on) != "retired":
        return ""
    return f"{found.line(on)} (data/reference/models/lifecycle.yaml)"


def hosted_specs(cfg: Any) -> list[tuple[str, str, Any]]:
    """(params key, dvc stage, spec) of every hosted model the parameters name (registry.is_hosted)."""
    from biasaudit import registry

    return [(key, stage, spec) for kind, key, stage, spec in cfg.backends() if registry.is_hosted(kind, spec.backend)]


def warnings(cfg: Any, on: date | None = None) -> list[str]:
    """One line per unconfirmed hosted model the parameters name: what is claimed, every page with its words
    or our reading of it, and the evidence that is missing (`biasaudit check` warns; it does not fail)."""
    seen, out = set(), []
    for key, _, spec in hosted_specs(cfg):
        found = status_of(spec.model_id)
        if found is not None and found.status == "unconfirmed" and found.model_id not in seen:
            seen.add(found.model_id)
            out.append(f"{key}.model_id: {found.line(on)}")
    return out


def refused_values(cfg: Any, stage: str = "") -> list[str]:
    """Every request parameter of a hosted model set to a value the model does not take (its entry's
    `accepts`), as '<params key>.<parameter>: <model> accepts a, b, c, not 'x' (source …)'; `stage` (a dvc
    address, `reflect@gpt-6.1-sol`): only its model's. An empty value ('' = the backend's default for the
    model) is not checked."""
    out = []
    for key, used_by, spec in hosted_specs(cfg):
        if stage and not (used_by == stage or (used_by.endswith("@*") and stage.split("@")[0] == used_by[:-2])):
            continue
        found = status_of(spec.model_id)
        for param, accepts in (found.accepts.items() if found else ()):
            value = getattr(spec, param, None)
            if value in (None, "") or str(value) in accepts.values:
                continue
            src = accepts.source
            out.append(f"{key}.{param}: {found.model_id} accepts {', '.join(accepts.values)}, not {value!r} "
                       f"(source: {src.url}{', read ' + src.read if src.read else ''}: {src.says})")
    return out


def answered_as_asked(asked: str, reported: str | None, aliases: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether the model an API says answered is the one asked (see the module docstring). No reported
    name (an API that reports none) cannot be checked and passes here (`mismatch` decides on it)."""
    if not reported or reported == UNVERIFIED:
        return True
    a, r = bare(asked), bare(reported)
    if r == a or (r.startswith(a) and _SNAPSHOT.fullmatch(r[len(a):]) is not None):
        return True
    known = tuple(aliases) + (status_of(a).aliases if status_of(a) else ())
    return any(fnmatch.fnmatchcase(r, pattern) for pattern in known)


def mismatch_reason(asked: str, reported: str) -> str:
    return (f"model mismatch: asked {bare(asked)}, answered by {bare(reported)} (a re-routed or renamed model; "
            f"declare {bare(reported)} among the model's aliases only if it is the same model)")


def mismatch(asked: str, reported: str | None) -> str:
    """'' when the model an API reports is the one asked (answered_as_asked) or when it reports none (recorded
    as UNVERIFIED: the engine stops on that under execution.require_verified_model), else the reason naming both."""
    return "" if answered_as_asked(asked, reported) else mismatch_reason(asked, reported or "")


def version_of(reported: str | None) -> str:
    """What a row records as the answering version: the name the API reported, else UNVERIFIED."""
    return str(reported) if reported and reported != UNVERIFIED else UNVERIFIED


__all__ = ["CONFIRMED", "LIFECYCLE_FILE", "STATUSES", "UNVERIFIED", "Accepts", "Evidence", "LifecycleError",
           "ModelStatus", "answered_as_asked", "bare", "hosted_specs", "lifecycle_path", "mismatch",
           "mismatch_reason", "parse", "refused_values", "status_of", "status_record", "stop_reason", "table",
           "today", "version_of", "warnings"]
