"""Clinical terms: name and place spans that are clinical words, read against the clinical vocabulary.

The vocabulary (`mappings/data/clinical-vocabulary.tsv.gz`, built by `scripts/build_clinical_vocabulary.py`
from ICD-10-CM, the samples' code displays and a curated list) is loaded once, on first use.

* A span all of whose words are clinical words ("Hemoglobin A1c", "Serum Creatinine", "Cardiology") is a
  term unless the text marks a person or place right before it ("Dr.", "Mr.", "lives in", "seen at").
  Words that are also names or places ("heart", "colon", "normal") need less: "by", "pt", "in", "at" keep
  them.
* An eponym or a place is a term when a clinical head word follows, perhaps after a few capitalized or
  clinical words ("Lynch syndrome", "Parkinson's disease", "Glasgow Coma Scale", "SPRINT trial").
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mappings
from text_deid.spans import Span

VOCABULARY = Path(mappings.__file__).resolve().parent / "data" / "clinical-vocabulary.tsv.gz"
CURATED = VOCABULARY.parent / "clinical-vocabulary-curated.txt"  # an input of the build, read by the note generator
CATEGORIES = frozenset({"NAME", "GEOGRAPHIC_LOCATION"})
# the model's guesses of these that are only clinical words ("umol" as an e-mail, "DM2" as an identifier)
MODEL_SLIP_CATEGORIES = frozenset({"EMAIL_ADDRESS", "PHONE_NUMBER", "FAX_NUMBER", "UNIQUE_IDENTIFIER"})
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
CONNECTIVES = frozenset({"of", "and", "the", "in", "for", "to", "with", "on", "&"})
TITLES = r"(?:Dr|Drs|Mr|Mrs|Ms|Miss|Mx|Prof|Doctor|Professor|Nurse|Sister|Rev)\.?"
# Before a span: what makes any span a person or a place.
STRONG_CONTEXT_RE = re.compile(
    rf"(?:\b{TITLES}|\b(?:named|called|name\s+is|surname|née)"
    r"|\b(?:lives?|lived|living|resides?|resided|residing|born|raised|moved|relocated|travel(?:l)?ed|returned|"
    r"emigrated|immigrated|works?|worked)\s+(?:in|at|to|from|near)|\b(?:seen|treated|evaluated)\s+at"
    r"|\b(?:resident|native|citizen)\s+of|\bhometown(?:\s+of|\s+is)?)\s+(?:the\s+)?$", re.IGNORECASE)
# Before a span of words that are also names or places: a weaker cue is enough.
WEAK_CONTEXT_RE = re.compile(
    r"\b(?:by|per|pt|patient|pt\.|contact|in|at|near|to|from|via|with|cc|attn|attending|provider|son|daughter|"
    r"wife|husband|mother|father|sister|brother)[:,]?\s+(?:the\s+)?$", re.IGNORECASE)
# After a span: a credential or a person's role marks a person.
PERSON_AFTER_RE = re.compile(r"^,?\s*(?:MD|M\.D\.|DO|RN|NP|PA|PA-C|PhD|FNP|CNM|DDS|PharmD)\b|^['’]s\s+(?:wife|husband|"
                             r"son|daughter|mother|father|family|home|house|office)\b")
TITLE_START_RE = re.compile(rf"^{TITLES}\s")
POSSESSIVE_RE = re.compile(r"(?:['’]s|s['’]|['’])(?=\W|$)")
NEXT_WORD_RE = re.compile(r"^(?:['’]s|s['’]|['’])?([\s-]+)([A-Za-z][A-Za-z0-9]*)(?:['’]s)?")
MAX_WORDS_BEFORE_HEAD = 3
# Suffixes of clinical words the vocabulary may lack in this form ("Echocardiography" beside "echocardiogram");
# no Census name ends in one (-aitis is a Lithuanian surname ending).
CLINICAL_SUFFIX_RE = re.compile(r"^[a-z]{3,}(?:ectomy|otomy|ostomy|plasty|scopy|graphy|itis|aemia|emia|uria|algia|"
                                r"pathy|plasia|ology|ologist|iatric|iatry|ectasis|megaly|penia|cytosis|rrhea|rrhoea|"
                                r"oscopic|ographic)$")
# after a name of two words or more or a place, only these heads make it a term ("John Smith test results" stays
# a name, "Boston equation" a place)
STRICT_HEADS = frozenset({"rule", "rules", "fever", "virus", "questionnaire", "index", "staging", "syndrome",
                          "syndromes", "disease", "diseases", "sign", "reflex", "criteria", "classification",
                          "scale", "score", "palsy", "phenomenon", "maneuver", "manoeuvre", "procedure", "trial",
                          "lymphoma", "sarcoma", "carcinoma", "tumor", "tumour", "fracture", "triad", "clinician"})


@dataclass(frozen=True)
class ClinicalVocabulary:
    terms: frozenset[str]  # lowercase clinical words that are no name or place
    ambiguous: frozenset[str]  # lowercase clinical words that are also names or places
    heads: frozenset[str]  # words after an eponym or place that make it clinical
    sources: tuple[str, ...]  # the header lines naming each source and its licence

    def is_word(self, word: str) -> bool:
        """A clinical word: in the vocabulary, or with a clinical suffix."""
        return (word in self.terms or word in self.ambiguous
                or (bool(CLINICAL_SUFFIX_RE.match(word)) and not word.endswith("aitis")))


@lru_cache(maxsize=1)
def vocabulary() -> ClinicalVocabulary:
    """The clinical vocabulary, read once."""
    terms, ambiguous, heads, sources = set(), set(), set(), []
    with gzip.open(VOCABULARY, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("# source "):
                sources.append(line[len("# source "):].strip())
            if line.startswith("#"):
                continue
            word, kind, _ = line.rstrip("\n").split("\t")
            (heads if kind == "head" else ambiguous if kind == "ambiguous" else terms).add(word)
    return ClinicalVocabulary(frozenset(terms), frozenset(ambiguous), frozenset(heads), tuple(sources))


def _words(covered: str) -> list[str]:
    return [w.lower() for w in WORD_RE.findall(POSSESSIVE_RE.sub("", covered))]


def marks_person_or_place(text: str, span: Span, weak: bool) -> bool:
    """A title or a place cue right before the span (`weak`: also "by", "pt", "in", "at"), or a credential after."""
    before = text[max(0, span.start - 40):span.start]
    covered = text[span.start:span.end]
    return bool(STRONG_CONTEXT_RE.search(before) or TITLE_START_RE.match(covered)
                or PERSON_AFTER_RE.match(text[span.end:span.end + 20])
                or (weak and WEAK_CONTEXT_RE.search(before)))


def _head_follows(text: str, end: int, heads: frozenset[str]) -> bool:
    """A head word after `end`, perhaps after a few capitalized clinical words ("Glasgow Coma Scale") or
    hyphen-joined eponyms ("Glasgow-Blatchford score")."""
    vocab = vocabulary()
    rest = text[end:end + 80]
    for _ in range(MAX_WORDS_BEFORE_HEAD + 1):
        m = NEXT_WORD_RE.match(rest)
        if not m:
            return False
        joint, word = m.group(1), m.group(2)
        if word.lower() in heads:
            return True
        if not (word[0].isupper() and (joint == "-" or vocab.is_word(word.lower()))):
            return False
        rest = rest[m.end():]
    return False


def is_clinical_term(text: str, span: Span) -> bool:
    """The name or place span is a clinical term in this text (see the module's docstring)."""
    covered = text[span.start:span.end]
    vocab = vocabulary()
    words = _words(covered)
    if not words:
        return False
    if span.category not in CATEGORIES:  # a word with a digit counts only as a word of the vocabulary ("dm2")
        return (span.category in MODEL_SLIP_CATEGORIES and span.detector == "ner" and "@" not in covered
                and all(vocab.is_word(w) for w in words))
    content = [w for w in words if w not in CONNECTIVES]
    last = content[-1] if content else ""
    if len(content) > 1 and last in vocab.heads and not any(c.isdigit() for c in last):
        return not marks_person_or_place(text, span, weak=False)  # "Lynch syndrome" inside the span
    if content and all(vocab.is_word(w) for w in content):
        weak = any(w in vocab.ambiguous for w in content)
        return not marks_person_or_place(text, span, weak=weak)
    strict = span.category != "NAME" or len(content) > 1
    if _head_follows(text, span.end, STRICT_HEADS if strict else vocab.heads):
        return not marks_person_or_place(text, span, weak=False)
    return False
