"""Re-identification risk of a de-identified release (`deid-adapter risk`): one row per patient, then figures.

A release (a de-identified FHIR export, bundles or NDJSON, or an HL7v2 folder) becomes a table with one row
per patient holding its quasi-identifiers and its sensitive values. Over that table:

- Equivalence class: the patients that share every quasi-identifier value. `f_j` is its size in the release,
  `F_j` its size in the population the release was drawn from; `n` patients, `J` classes.
- k-anonymity: `k = min_j f_j`. Share below k: patients in classes with `f_j < k_target`, over n.
- Distinct l-diversity for a sensitive attribute: `l = min_j` (distinct sensitive values in class j). A patient
  may hold several values (conditions); one holding none counts as the value "none". Homogeneity is reported
  beside it: `max_confidence = max_j max_v` (patients of class j holding v) / f_j — 1.0 means some class
  discloses a value for all its members.
- Prosecutor risk (the attacker knows the target is in the release): a patient's risk is `1 / f_j`;
  maximum `1 / min_j f_j`, average `J / n` (the mean of `1 / f_j` over patients).
- Journalist risk (the attacker does not know whether the target is in the release): a patient's risk is
  `1 / F_j`; maximum `1 / min_j F_j`, average the mean of `1 / F_j` over patients. Population assumption:
  with `--population N` the release is a uniform random sample of N people (sampling fraction `pi = n / N`)
  and `F_j` is estimated as `max(f_j, round(f_j / pi))`; without it the release is taken to be the whole
  population (`F_j = f_j`), which makes journalist risk equal prosecutor risk — an upper bound.
- Marketer risk (the attacker matches as many patients as possible): the expected share re-identified,
  `(1 / n) * sum_j f_j / F_j`; equal to `J / n` when the release is the population. It is the same number
  as the per-patient average journalist risk; it is reported under its own name because data-release
  policies set a separate bar for it.

Suggested generalizations: a greedy walk up each quasi-identifier's hierarchy (year → 5-, 10-, 20-year bands
→ suppressed, ZIP3 → ZIP2 → suppressed, ...) taking at each step the one-level generalization with the most
progress toward k (`sum over patients of min(f_j, k)`), until k is reached. Each step is reported with the k
and the share below k it leaves, so a reader can stop earlier and suppress the patients still below k.

Residual PHI (when a gold sample is given): the text stack's misses on the site's own gold notes, measured
with `text_deid.evaluation.evaluate` (percentile bootstrap over documents), projected to the release's
narrative characters: residual PHI characters = narrative characters x PHI density of the gold sample x
character miss rate (1 - character recall). The 95% interval carries the miss rate's bootstrap interval; the
density is the gold sample's point estimate.

Nothing here keeps or reports a quasi-identifier value, a code or a text: only counts, shares and names.
"""
from __future__ import annotations

import base64
import hashlib
import html
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from adapter import files as fhir_files
from fhir_transforms.hl7v2 import message as er7
from fhir_transforms.errors import InputError
from fhir_transforms.r4.record import iter_resources
from fhir_transforms.r4.walker import KEY_TAG_SYSTEM, PROFILE_TAG_SYSTEM
from adapter.audit.trail import sha256_of
from text_deid import evaluation

QUASI_IDENTIFIERS = ("birth_year", "gender", "zip3", "race", "ethnicity", "death_year", "encounters")
DEFAULT_QUASI = QUASI_IDENTIFIERS
SENSITIVE_ATTRIBUTES = ("condition", "none")
MISSING = ""  # an absent value is a value of its own: it still separates patients
NONE_VALUE = "none"
AGE_OVER_89_URL = "http://deid-adapter.org/fhir/StructureDefinition/age-over-89"
RACE_URL = "http://hl7.org/fhir/us/core/StructureDefinition/us-core-race"
ETHNICITY_URL = "http://hl7.org/fhir/us/core/StructureDefinition/us-core-ethnicity"
TEXT_CONTENT = ("text/",)
NARRATIVE_KEYS = {"comment", "description", "conclusion", "valueString", "valueMarkdown"}
HL7_SUFFIXES = (".hl7", ".er7", ".txt", ".msg")
HL7_TEXT_TYPES = {"TX", "FT", "ST"}
TAG_RE = re.compile(r"<[^>]+>")


class ReleaseError(ValueError):
    """The folder is not a release this command can read (no FHIR resources, no HL7v2 messages, bad option)."""


@dataclass
class Release:
    """What the analysis needs of a release: patient rows, sensitive values, and release-wide facts (no PHI)."""

    format: str  # fhir | hl7v2
    rows: dict[str, dict[str, str]] = field(default_factory=dict)  # patient key → quasi-identifier → value
    sensitive: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    files: int = 0
    items: int = 0  # resources (FHIR) or messages (HL7v2)
    narrative_chars: int = 0
    key_ids: Counter = field(default_factory=Counter)
    profiles: Counter = field(default_factory=Counter)  # "name@version" (FHIR) or "name" (HL7v2)
    # Output record → its SHA-256 under each convention the audit trail has used (bytes as written; canonical JSON).
    output_hashes: dict[str, int] = field(default_factory=dict)
    output_records: int = 0

    def add_output(self, *digests: str) -> None:
        for d in digests:
            self.output_hashes.setdefault(d, self.output_records)
        self.output_records += 1
    unreadable_files: int = 0


# --- reading a release


def read_release(root: Path) -> Release:
    """Read a FHIR export (bundles or NDJSON) or an HL7v2 folder into patient rows; ReleaseError if neither."""
    if not root.exists():
        raise ReleaseError(f"{root}: no such file or folder")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    fhir = [p for p in files if p.suffix in fhir_files.SUFFIXES]
    hl7 = [p for p in files if p.suffix.lower() in HL7_SUFFIXES]
    if fhir:
        release = _read_fhir(root, fhir)
    elif hl7:
        release = _read_hl7(hl7)
    else:
        raise ReleaseError(f"{root}: no .json, .ndjson or HL7v2 files")
    if not release.rows:
        raise ReleaseError(f"{root}: no patients found in the release")
    return release


def _read_fhir(root: Path, paths: list[Path]) -> Release:
    release = Release("fhir")
    encounters: Counter = Counter()
    for path in paths:
        try:
            f = fhir_files.read(path, path.relative_to(root) if root.is_dir() else Path(path.name))
        except fhir_files.NoResources:
            continue
        except InputError:
            release.unreadable_files += 1
            continue
        release.files += 1
        raw = path.read_bytes()
        written = [line for line in raw.split(b"\n") if line.strip()] if f.ndjson else [raw]
        for top, data in zip(f.resources, written):
            release.add_output(hashlib.sha256(data).hexdigest(), sha256_of(top))
        for top in f.resources:
            for res in iter_resources(top):
                release.items += 1
                _tags(res, release)
                rtype = res.get("resourceType")
                release.narrative_chars += narrative_chars(res)
                if rtype == "Patient" and res.get("id"):
                    release.rows[res["id"]] = patient_row(res)
                elif rtype == "Encounter":
                    pid = _patient_of(res)
                    if pid:
                        encounters[pid] += 1
                elif rtype == "Condition":
                    pid = _patient_of(res)
                    if pid:
                        release.sensitive[pid].update(_codes(res.get("code")))
    for pid, row in release.rows.items():
        row["encounters"] = str(encounters.get(pid, 0))
    return release


def _tags(res: dict, release: Release) -> None:
    for tag in (res.get("meta") or {}).get("tag") or []:
        if not isinstance(tag, dict):
            continue
        if tag.get("system") == KEY_TAG_SYSTEM:
            release.key_ids[str(tag.get("code"))] += 1
        elif tag.get("system") == PROFILE_TAG_SYSTEM:
            release.profiles[str(tag.get("code"))] += 1


def patient_row(patient: dict) -> dict[str, str]:
    """A Patient's quasi-identifiers as the de-identified output holds them ("90+" where the age was aggregated)."""
    birth = str(patient.get("birthDate") or "")[:4]
    if not birth and any(e.get("url") == AGE_OVER_89_URL for e in (patient.get("_birthDate") or {}).get("extension", [])):
        birth = "90+"
    death = str(patient.get("deceasedDateTime") or "")[:4] or ("deceased" if patient.get("deceasedBoolean") else MISSING)
    address = next((a for a in patient.get("address") or [] if isinstance(a, dict)), {})
    return {
        "birth_year": birth,
        "gender": str(patient.get("gender") or MISSING),
        "zip3": str(address.get("postalCode") or MISSING)[:3],
        "race": _omb(patient, RACE_URL),
        "ethnicity": _omb(patient, ETHNICITY_URL),
        "death_year": death,
        "encounters": "0",
    }


def _omb(patient: dict, url: str) -> str:
    """The OMB category codes of a US Core race/ethnicity extension, sorted; empty when the extension was removed."""
    for ext in patient.get("extension") or []:
        if isinstance(ext, dict) and ext.get("url") == url:
            codes = sorted(str((sub.get("valueCoding") or {}).get("code")) for sub in ext.get("extension") or []
                           if sub.get("url") == "ombCategory")
            return "+".join(codes) or "text-only"
    return MISSING


def _patient_of(res: dict) -> str | None:
    for key in ("subject", "patient"):
        ref = res.get(key)
        if isinstance(ref, dict) and isinstance(ref.get("reference"), str):
            return re.split(r"[/:]", ref["reference"])[-1]
    return None


def _codes(concept) -> set[str]:
    if not isinstance(concept, dict):
        return set()
    codes = {f"{c.get('system')}|{c.get('code')}" for c in concept.get("coding") or [] if c.get("code")}
    return codes or ({f"text|{concept['text']}"} if concept.get("text") else set())


def narrative_chars(res: dict) -> int:
    """Characters of free text in one resource (not its contained ones): the text a detector could have missed.

    Counted: the visible text of Narrative.div, text/* attachments decoded, Annotation.text (`note`), and
    `comment`, `description`, `conclusion`, `valueString`, `valueMarkdown` anywhere in the resource.
    """
    total = 0

    def walk(node, key: str = "") -> None:
        nonlocal total
        if isinstance(node, dict):
            if node.get("resourceType") and node is not res:
                return  # a contained or bundled resource is counted on its own
            for k, v in node.items():
                if k == "div" and isinstance(v, str):
                    total += len(html.unescape(TAG_RE.sub("", v)).strip())
                elif k == "data" and isinstance(v, str) and str(node.get("contentType", "")).lower().startswith(TEXT_CONTENT):
                    try:
                        total += len(base64.b64decode(v).decode("utf-8", "replace"))
                    except ValueError:
                        pass
                elif k == "note" and isinstance(v, list):
                    total += sum(len(a.get("text", "")) for a in v if isinstance(a, dict) and isinstance(a.get("text"), str))
                elif k in NARRATIVE_KEYS and isinstance(v, str):
                    total += len(v)
                else:
                    walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)

    walk(res)
    return total


def _read_hl7(paths: list[Path]) -> Release:
    release = Release("hl7v2")
    visits: dict[str, set[str]] = defaultdict(set)
    for path in paths:
        try:
            messages = er7.parse_text(er7.decode_bytes(path.read_bytes()))
        except (InputError, OSError):
            release.unreadable_files += 1
            continue
        release.files += 1
        for message in messages:
            if message.envelope:
                continue
            release.items += 1
            release.add_output(sha256_of(message.to_er7()))
            _hl7_stamp(message, release)
            pid_seg = message.first("PID")
            if pid_seg is None:
                continue
            pid = _hl7_patient(pid_seg, message.delimiters)
            if not pid:
                continue
            row = hl7_patient_row(pid_seg, message.delimiters)
            old = release.rows.get(pid)
            release.rows[pid] = {k: row[k] or (old or {}).get(k, MISSING) for k in row}
            for seg in message.segments:
                if seg.sid == "PV1":
                    visits[pid].add(_component(seg.get(19), message.delimiters, 0) or f"message-{release.items}")
                elif seg.sid == "DG1":
                    code = _component(seg.get(3), message.delimiters, 0)
                    if code:
                        release.sensitive[pid].add(code)
                elif seg.sid in ("OBX", "NTE"):
                    release.narrative_chars += _hl7_narrative(seg, message.delimiters)
    for pid, row in release.rows.items():
        row["encounters"] = str(len(visits.get(pid, ())))
    return release


def _component(raw: str, d: er7.Delimiters, n: int, repetition: int = 0) -> str:
    field_ = er7.split_field(raw, d)
    try:
        return field_[repetition][n][0].strip()
    except IndexError:
        return ""


def _hl7_patient(pid: er7.Segment, d: er7.Delimiters) -> str:
    """The first patient identifier (PID-3, else PID-2): a pseudonym in a de-identified message."""
    return _component(pid.get(3), d, 0) or _component(pid.get(2), d, 0)


def hl7_patient_row(pid: er7.Segment, d: er7.Delimiters) -> dict[str, str]:
    """A PID segment's quasi-identifiers: PID-7 birth, PID-8 sex, PID-11.5 ZIP, PID-10 race, PID-22 ethnic group, PID-29 death."""
    races = sorted({r[0][0].strip() for r in er7.split_field(pid.get(10), d) if r and r[0] and r[0][0].strip()})
    return {
        "birth_year": pid.get(7)[:4] if pid.get(7) else MISSING,
        "gender": _component(pid.get(8), d, 0),
        "zip3": _component(pid.get(11), d, 4)[:3],
        "race": "+".join(races),
        "ethnicity": _component(pid.get(22), d, 0),
        "death_year": pid.get(29)[:4] if pid.get(29) else ("deceased" if _component(pid.get(30), d, 0) == "Y" else MISSING),
        "encounters": "0",
    }


def _hl7_narrative(seg: er7.Segment, d: er7.Delimiters) -> int:
    if seg.sid == "NTE":
        return len(seg.get(3))
    if _component(seg.get(2), d, 0) in HL7_TEXT_TYPES:
        return len(seg.get(5))
    return 0


def _hl7_stamp(message: er7.Message, release: Release) -> None:
    """MSH-8 of a de-identified message reads `deid/<key id>/<profile>`."""
    msh = message.first("MSH")
    parts = (msh.get(8) if msh else "").split("/")
    if len(parts) == 3 and parts[0] == "deid":
        release.key_ids[parts[1]] += 1
        release.profiles[parts[2]] += 1


# --- the table and its equivalence classes


@dataclass(frozen=True)
class Table:
    """Rows of quasi-identifier values (tuples in `quasi` order) and each row's sensitive values."""

    quasi: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    sensitive: tuple[frozenset[str], ...] = ()

    @classmethod
    def from_release(cls, release: Release, quasi: Sequence[str]) -> Table:
        keys = sorted(release.rows)
        return cls(tuple(quasi), tuple(tuple(release.rows[p].get(q, MISSING) for q in quasi) for p in keys),
                   tuple(frozenset(release.sensitive.get(p, ())) for p in keys))

    def classes(self) -> Counter:
        """Equivalence class → size."""
        return Counter(self.rows)


def class_sizes(rows: Iterable[tuple]) -> list[int]:
    """The size of each patient's equivalence class, in row order."""
    rows = list(rows)
    counts = Counter(rows)
    return [counts[r] for r in rows]


def k_anonymity(rows: Sequence[tuple]) -> int:
    """The size of the smallest equivalence class (0 for no rows)."""
    counts = Counter(rows)
    return min(counts.values()) if counts else 0


def size_distribution(rows: Sequence[tuple]) -> dict[int, int]:
    """Class size → number of classes of that size."""
    return dict(sorted(Counter(Counter(rows).values()).items()))


def share_below_k(rows: Sequence[tuple], k: int) -> float:
    """Share of patients in classes smaller than k."""
    sizes = class_sizes(rows)
    return sum(1 for s in sizes if s < k) / len(sizes) if sizes else 0.0


def l_diversity(rows: Sequence[tuple], sensitive: Sequence[frozenset[str]]) -> dict:
    """Distinct l-diversity (fewest distinct sensitive values in a class) and the worst class's homogeneity."""
    values: dict[tuple, Counter] = defaultdict(Counter)
    sizes: Counter = Counter()
    for row, held in zip(rows, sensitive):
        sizes[row] += 1
        values[row].update(held or {NONE_VALUE})
    if not sizes:
        return {"l": 0, "max_confidence": 0.0, "homogeneous_classes": 0, "classes_below_2": 0}
    distinct = {c: len(v) for c, v in values.items()}
    confidence = {c: max(v.values()) / sizes[c] for c, v in values.items()}
    return {
        "l": min(distinct.values()),
        "max_confidence": max(confidence.values()),
        "homogeneous_classes": sum(1 for c in confidence.values() if c >= 1.0),
        "classes_below_2": sum(1 for d in distinct.values() if d < 2),
    }


def population_sizes(sizes: Sequence[int], n: int, population: int | None) -> list[int]:
    """Estimated population class size F_j for each release class size f_j (see the module docstring)."""
    if not population or population <= n:
        return list(sizes)
    fraction = n / population
    return [max(f, round(f / fraction)) for f in sizes]


def risks(rows: Sequence[tuple], population: int | None = None) -> dict:
    """Prosecutor, journalist and marketer risks, maximum and average (formulas in the module docstring)."""
    n = len(rows)
    if not n:
        return {name: 0.0 for name in ("prosecutor_max", "prosecutor_avg", "journalist_max", "journalist_avg", "marketer")}
    counts = Counter(rows)
    f = list(counts.values())
    big_f = population_sizes(f, n, population)
    matched = sum(fj / Fj for fj, Fj in zip(f, big_f)) / n  # the mean over patients of 1 / F_j
    return {
        "prosecutor_max": 1 / min(f),
        "prosecutor_avg": len(f) / n,
        "journalist_max": 1 / min(big_f),
        "journalist_avg": matched,
        "marketer": matched,
    }


# --- generalization hierarchies

Generalizer = Callable[[str], str]
SUPPRESSED = "*"


def _year_band(width: int) -> Generalizer:
    def band(value: str) -> str:
        if not value.isdigit():
            return value
        start = int(value) // width * width
        return f"{start}-{start + width - 1}"
    return band


def _prefix(n: int) -> Generalizer:
    return lambda value: value[:n] if value else value


def _encounter_band(edges: Sequence[int]) -> Generalizer:
    def band(value: str) -> str:
        if not value.isdigit():
            return value
        v = int(value)
        for lo, hi in zip(edges, list(edges[1:]) + [None]):
            if hi is None or v < hi:
                return f"{lo}+" if hi is None else (str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}")
        return value
    return band


def _suppress(value: str) -> str:
    return SUPPRESSED


def _deceased(value: str) -> str:
    return "deceased" if value else value


# Quasi-identifier → (name of level, generalizer) for levels 1.. (level 0 is the value as released).
HIERARCHIES: dict[str, list[tuple[str, Generalizer]]] = {
    "birth_year": [("5-year bands", _year_band(5)), ("10-year bands", _year_band(10)),
                   ("20-year bands", _year_band(20)), ("suppressed", _suppress)],
    "gender": [("suppressed", _suppress)],
    "zip3": [("first 2 ZIP digits", _prefix(2)), ("first ZIP digit", _prefix(1)), ("suppressed", _suppress)],
    "race": [("suppressed", _suppress)],
    "ethnicity": [("suppressed", _suppress)],
    "death_year": [("10-year bands", _year_band(10)), ("deceased yes/no", _deceased), ("suppressed", _suppress)],
    "encounters": [("bands 0,1,2-4,5-9,10-19,20+", _encounter_band([0, 1, 2, 5, 10, 20])),
                   ("bands 0-4,5-19,20+", _encounter_band([0, 5, 20])), ("suppressed", _suppress)],
}


def generalize(table: Table, levels: Mapping[str, int]) -> list[tuple[str, ...]]:
    """The table's rows with each quasi-identifier raised to its level (0 = as released)."""
    funcs = []
    for q in table.quasi:
        level = levels.get(q, 0)
        funcs.append(HIERARCHIES[q][level - 1][1] if level else None)
    if not any(funcs):
        return list(table.rows)
    return [tuple(fn(v) if fn else v for fn, v in zip(funcs, row)) for row in table.rows]


def suggest_generalizations(table: Table, k: int, max_steps: int = 30) -> dict:
    """Greedy one-level steps up the hierarchies until k is reached; every step with its k and share below k."""
    levels = {q: 0 for q in table.quasi if q in HIERARCHIES}
    rows = list(table.rows)
    steps = []
    current_k = k_anonymity(rows)
    while current_k < k and len(steps) < max_steps:
        best = None
        for q in levels:
            if levels[q] >= len(HIERARCHIES[q]):
                continue
            trial = {**levels, q: levels[q] + 1}
            trial_rows = generalize(table, trial)
            # Most progress toward k (each patient counts its class size, capped at k); ties go to the
            # quasi-identifier with more levels left, whose step loses less.
            progress = sum(min(s, k) for s in class_sizes(trial_rows))
            score = (-progress, -(len(HIERARCHIES[q]) - trial[q]))
            if best is None or score < best[0]:
                best = (score, q, trial, trial_rows)
        if best is None:
            break
        _, q, levels, rows = best
        current_k = k_anonymity(rows)
        steps.append({"quasi_identifier": q, "to": HIERARCHIES[q][levels[q] - 1][0], "k": current_k,
                      "below_k_share": share_below_k(rows, k), "classes": len(set(rows))})
    return {
        "target_k": k,
        "reached": current_k >= k,
        "steps": steps,
        "levels": {q: (HIERARCHIES[q][lv - 1][0] if lv else "as released") for q, lv in levels.items()},
    }


def risk_by_quasi_identifier(table: Table, k: int) -> dict[str, dict]:
    """For each quasi-identifier: the share below k and the average prosecutor risk with it left out."""
    out = {}
    for i, q in enumerate(table.quasi):
        rows = [row[:i] + row[i + 1:] for row in table.rows]
        r = risks(rows)
        out[q] = {"below_k_share_without": share_below_k(rows, k), "prosecutor_avg_without": r["prosecutor_avg"],
                  "distinct_values": len({row[i] for row in table.rows})}
    return out


def analyze(table: Table, k: int = 5, population: int | None = None, sensitive: str = "condition") -> dict:
    """Every risk figure of a table, JSON-ready; counts and shares only."""
    rows = list(table.rows)
    result = {
        "patients": len(rows),
        "quasi_identifiers": list(table.quasi),
        "target_k": k,
        "k_anonymity": k_anonymity(rows),
        "equivalence_classes": len(set(rows)),
        "class_size_distribution": {str(s): c for s, c in size_distribution(rows).items()},
        "below_k_share": share_below_k(rows, k),
        "below_k_patients": sum(1 for s in class_sizes(rows) if s < k),
        "risks": risks(rows, population),
        "population": {"size": population if population and population > len(rows) else len(rows),
                       "assumption": ("the release is a uniform random sample of the stated population"
                                      if population and population > len(rows) else
                                      "the release is the whole population (journalist risk = prosecutor risk, an upper bound)")},
        "risk_by_quasi_identifier": risk_by_quasi_identifier(table, k),
        "suggested_generalizations": suggest_generalizations(table, k),
    }
    if sensitive != "none":
        result["l_diversity"] = {"attribute": sensitive, **l_diversity(rows, table.sensitive)}
    return result


# --- residual PHI from a gold sample


def residual_phi(gold: list[dict], predicted: dict[str, list[dict]], narrative_chars: int) -> dict:
    """The stack's miss rates on the gold sample (95% bootstrap intervals) projected to the release's narrative."""
    result = evaluation.evaluate(gold, predicted)
    counts = result["counts"]
    total_chars = counts["gold_characters"] + counts["other_characters"]
    density = counts["gold_characters"] / total_chars if total_chars else 0.0
    recall = result["char_recall"]
    miss, (miss_lo, miss_hi) = 1 - recall["value"], (1 - recall["ci95"][1], 1 - recall["ci95"][0])
    span_recall = result["span_recall"]
    span_density = counts["gold_spans"] / total_chars if total_chars else 0.0
    return {
        "gold_documents": counts["documents"],
        "gold_spans": counts["gold_spans"],
        "missed_gold_spans": counts["missed_gold_spans"],
        "phi_density": density,
        "char_recall": recall,
        "span_recall": span_recall,
        "char_miss_rate": {"value": miss, "ci95": [miss_lo, miss_hi]},
        "narrative_chars": narrative_chars,
        "residual_phi_chars": {"value": narrative_chars * density * miss,
                               "ci95": [narrative_chars * density * miss_lo, narrative_chars * density * miss_hi]},
        "residual_phi_spans": {"value": narrative_chars * span_density * (1 - span_recall["value"]),
                               "ci95": [narrative_chars * span_density * (1 - span_recall["ci95"][1]),
                                        narrative_chars * span_density * (1 - span_recall["ci95"][0])]},
        "recall_by_category": {c: {"gold": v["gold"], "missed": v["missed"], **v["recall"]}
                               for c, v in result["per_category"].items()},
        "bootstrap": result["bootstrap"],
        "method": "residual = narrative characters x gold PHI density x (1 - character recall); the interval "
                  "carries the recall's 95% bootstrap interval, the density is the gold sample's point estimate",
    }


# --- thresholds


HIGHER_IS_BETTER = {"k_anonymity", "l", "char_recall", "span_recall", "char_recall_lower", "span_recall_lower"}
CHECK_RE = re.compile(r"^\s*([a-z_]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*$")


@dataclass(frozen=True)
class Threshold:
    """One check: a metric, `>=` or `<=`, and a bound."""

    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"


def parse_thresholds(specs: Iterable[str]) -> list[Threshold]:
    """`k_anonymity>=5,prosecutor_max<=0.2` (comma separated, repeatable) → thresholds; ValueError when malformed."""
    out = []
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            m = CHECK_RE.match(part)
            if not m:
                raise ValueError(f"threshold {part!r}: write METRIC>=VALUE or METRIC<=VALUE (e.g. k_anonymity>=5)")
            if m.group(1) not in METRIC_NAMES:
                raise ValueError(f"threshold {part!r}: unknown metric (known: {', '.join(METRIC_NAMES)})")
            out.append(Threshold(m.group(1), m.group(2), float(m.group(3))))
    return out


METRIC_NAMES = ("k_anonymity", "below_k_share", "l", "max_confidence", "prosecutor_max", "prosecutor_avg",
                "journalist_max", "journalist_avg", "marketer", "char_recall", "char_recall_lower", "span_recall",
                "span_recall_lower", "residual_phi_chars", "residual_phi_chars_upper")


def metric_values(figures: dict) -> dict[str, float]:
    """Flat metric name → value for the thresholds; metrics not measured are absent."""
    out = {"k_anonymity": figures["k_anonymity"], "below_k_share": figures["below_k_share"], **figures["risks"]}
    if "l_diversity" in figures:
        out["l"] = figures["l_diversity"]["l"]
        out["max_confidence"] = figures["l_diversity"]["max_confidence"]
    phi = figures.get("residual_phi")
    if phi:
        out.update(char_recall=phi["char_recall"]["value"], char_recall_lower=phi["char_recall"]["ci95"][0],
                   span_recall=phi["span_recall"]["value"], span_recall_lower=phi["span_recall"]["ci95"][0],
                   residual_phi_chars=phi["residual_phi_chars"]["value"],
                   residual_phi_chars_upper=phi["residual_phi_chars"]["ci95"][1])
    return out


def check(thresholds: Sequence[Threshold], figures: dict) -> list[dict]:
    """Pass/fail per threshold; a metric that was not measured fails (a check cannot pass on missing evidence)."""
    values = metric_values(figures)
    results = []
    for t in thresholds:
        value = values.get(t.metric)
        ok = value is not None and not (isinstance(value, float) and math.isnan(value)) and (
            value >= t.bound if t.op == ">=" else value <= t.bound)
        results.append({"check": str(t), "metric": t.metric, "value": value, "passed": bool(ok),
                         **({} if value is not None else {"note": "not measured"})})
    return results


def iter_figures_strings(figures) -> Iterator[str]:
    """Every string in the figures (keys and values): what a PHI check of the report reads."""
    if isinstance(figures, dict):
        for k, v in figures.items():
            yield str(k)
            yield from iter_figures_strings(v)
    elif isinstance(figures, list):
        for v in figures:
            yield from iter_figures_strings(v)
    elif isinstance(figures, str):
        yield figures
