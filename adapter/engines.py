"""Builds the engines from settings, for every edge: one place that knows how a profile, a key, a stack and a
clock make a de-identifier."""
from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Optional

from fhir_transforms import dates, keys
from fhir_transforms.errors import SettingsError
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.rules import ProfileError, load_profile
from adapter import settings
from text_deid.stack import LlmSettings, StackUnavailable, TextStack, build_stack


def fhir_engine(key_file: Optional[Path], profile: str, stack: Optional[str], validate: bool, today: Optional[str],
                llm: Optional[LlmSettings] = None) -> Deidentifier:
    """The FHIR engine for a key file, a packaged profile, a stack and an optional fixed day (YYYY-MM-DD)."""
    try:
        key = keys.load_key(key_file)
        prof = load_profile(profile)
        clock = (lambda d=date.fromisoformat(today): d) if today else dates.today
        stack_used = text_stack(stack, llm)  # last: a stack with a model takes seconds to build
    except (keys.KeyError_, ProfileError, StackUnavailable, ValueError) as e:
        raise SettingsError(str(e)) from e
    return Deidentifier(prof, Pseudonymizer(key), stack_used, clock, validate)


def text_stack(name: str | None, llm: LlmSettings | None = None) -> TextStack:
    """The named text stack; settings not given come from the environment (StackUnavailable if it cannot be built)."""
    return build_stack(name, llm or settings.llm(), settings.ner())
