"""Is a word an English word? `wordfreq`'s frequency of the word in English, read once into a dict."""
from __future__ import annotations

import math
from functools import lru_cache

# Zipf frequency (log10 of uses per billion words + 3) from which a word counts as English: "reed" 4.1,
# "oslo" 3.5 and "ivan" 3.9 are English words by this measure; "katrine" 2.3 and "eklund" 2.1 are not.
ENGLISH_ZIPF = 3.5


@lru_cache(maxsize=1)
def _frequencies() -> dict[str, float]:
    from wordfreq import get_frequency_dict  # noqa: PLC0415 - loaded on first use, not at import

    return get_frequency_dict("en", wordlist="best")


def zipf(word: str) -> float:
    """`word`'s Zipf frequency in English (0.0 for a word wordfreq has never seen)."""
    f = _frequencies().get(word.lower().replace("’", "'"), 0.0)
    return math.log10(f * 1e9) if f else 0.0


def is_english_word(word: str, threshold: float = ENGLISH_ZIPF) -> bool:
    """Is `word` (any case) at least as frequent in English as `threshold` (a Zipf frequency)?"""
    return zipf(word) >= threshold
