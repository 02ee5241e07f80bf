"""Replace merged spans with `[CATEGORY]` tags or consistent keyed surrogates."""
from __future__ import annotations

from typing import Callable

from text_deid.spans import Span

Surrogate = Callable[[str, str], str]  # (category, covered text) -> replacement


def tag(category: str, _covered: str) -> str:
    return f"[{category}]"


def apply(text: str, spans: list[Span], replacement: Surrogate = tag) -> str:
    """Rewrite `text` with each (disjoint, sorted) span replaced."""
    out, pos = [], 0
    for s in spans:
        out.append(text[pos:s.start])
        out.append(replacement(s.category, text[s.start:s.end]))
        pos = s.end
    out.append(text[pos:])
    return "".join(out)
