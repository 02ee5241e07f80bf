"""Builds the engines from settings, for every edge: one place that knows how a profile, a key, a stack and a
clock make a de-identifier."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Optional

from fhir_transforms import dates, keys
from fhir_transforms.errors import SettingsError
from fhir_transforms.hl7v2.rules import HL7Profile, hl7_site_profile, load_hl7_profile
from fhir_transforms.pseudonym import Pseudonymizer
from fhir_transforms.r4 import versions
from fhir_transforms.r4.record import Deidentifier
from fhir_transforms.r4.site import site_profile
from fhir_transforms.rules import Profile, ProfileError, load_profile
from fhir_transforms.site_rules import SiteRules, read_site_rules
from adapter import settings
from text_deid.stack import LlmSettings, StackUnavailable, TextStack, build_stack

DEFAULT_PROFILE = "safe-harbor"


@dataclass(frozen=True)
class Profiles:
    """Both engines' profiles for a run: a packaged profile, or a site rules file over the one it extends."""

    fhir: Profile
    hl7: HL7Profile
    site: SiteRules | None = None

    @property
    def name(self) -> str:
        return self.fhir.name


def profiles(profile: Optional[str], rules: Optional[Path] = None) -> Profiles:
    """The packaged profile by name (default safe-harbor), or with `rules` the site rules file merged onto the
    profile it extends, both parts checked (SettingsError names the file and line of each problem)."""
    try:
        if rules is None:
            name = profile or DEFAULT_PROFILE
            return Profiles(load_profile(name), load_hl7_profile(name))
        site = read_site_rules(rules)
        if profile and profile != site.extends:
            raise SettingsError(f"--profile {profile[:64]!r} and --rules {rules} (extends {site.extends}) disagree: "
                                "give one of them")
        return Profiles(site_profile(site), hl7_site_profile(site), site)
    except ProfileError as e:
        raise SettingsError(str(e)) from e


def fhir_engine(key_file: Optional[Path], profile: Optional[str], stack: Optional[str], validate: bool,
                today: Optional[str], llm: Optional[LlmSettings] = None, vault_key_file: Optional[Path] = None,
                fhir_version: str = versions.DEFAULT, rules: Optional[Path] = None) -> Deidentifier:
    """The FHIR engine for a key file, a packaged profile (or a site rules file), a stack, an optional fixed day
    (YYYY-MM-DD) and the input's FHIR version (r4, r5 or auto); with the vault key when the profile encrypts
    (`vault_key_file`, else DEID_ADAPTER_VAULT_KEY_FILE)."""
    try:
        key = keys.load_key(key_file)
        prof = profiles(profile, rules).fhir
        clock = (lambda d=date.fromisoformat(today): d) if today else dates.today
        stack_used = text_stack(stack, llm)  # last: a stack with a model takes seconds to build
    except (keys.KeyError_, ProfileError, StackUnavailable, ValueError) as e:
        raise SettingsError(str(e)) from e
    pseudo = Pseudonymizer(key)
    with_vault_key(pseudo, prof.methods, vault_key_file)
    return Deidentifier(prof, pseudo, stack_used, clock, validate, fhir_version=versions.check(fhir_version))


def with_vault_key(pseudo: Pseudonymizer, methods: set[str], vault_key_file: Optional[Path] = None) -> None:
    """Give the `encrypt` method the vault key when a profile's rules use it; SettingsError when there is none.
    A profile that does not encrypt never reads the vault key."""
    if "encrypt" not in methods or pseudo.cipher is not None:
        return
    try:
        pseudo.use_vault_key(keys.load_key(vault_key_file or settings.vault_key_file(), "vault"))
    except keys.KeyError_ as e:
        raise SettingsError(f"the profile's encrypt rules need the vault key (--vault-key-file or "
                            f"DEID_ADAPTER_VAULT_KEY_FILE): {e}") from e


def text_stack(name: str | None, llm: LlmSettings | None = None) -> TextStack:
    """The named text stack; settings not given come from the environment (StackUnavailable if it cannot be built)."""
    return build_stack(name, llm or settings.llm(), settings.ner())
