"""The one module that reads deid-adapter's environment. The edges ask it and pass what it returns down, so no
engine or detector reads the environment. (CLI options that name a variable, such as `--key-file` and
DEID_ADAPTER_KEY_FILE, are read by the CLI's own option parsing.)"""
from __future__ import annotations

import os
from pathlib import Path

from fhir_transforms.errors import SettingsError
from text_deid.detectors.llm import LlmSettings
from text_deid.detectors.ner import NerSettings


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def _number(name: str, kind: type, default):
    value = _get(name)
    try:
        number = kind(value) if value is not None else default
    except ValueError:
        raise SettingsError(f"{name} must be a number") from None
    if number is not None and number <= 0:
        raise SettingsError(f"{name} must be positive")
    return number


def llm(url: str | None = None, model: str | None = None) -> LlmSettings:
    """The LLM components' settings: the options given, else DEID_ADAPTER_LLM_URL / _MODEL, and the limits
    DEID_ADAPTER_LLM_TIMEOUT_S (120), _CONCURRENCY (4) and _NUM_CTX (8192)."""
    return LlmSettings(url or _get("DEID_ADAPTER_LLM_URL"), model or _get("DEID_ADAPTER_LLM_MODEL"),
                       timeout_s=_number("DEID_ADAPTER_LLM_TIMEOUT_S", float, 120.0),
                       concurrency=_number("DEID_ADAPTER_LLM_CONCURRENCY", int, 4),
                       num_ctx=_number("DEID_ADAPTER_LLM_NUM_CTX", int, 8192))


def ner() -> NerSettings:
    """The NER detector's settings: DEID_ADAPTER_NER_MODEL, _LABELS, _THREADS and _THRESHOLD (unset: defaults)."""
    return NerSettings(_get("DEID_ADAPTER_NER_MODEL"), _get("DEID_ADAPTER_NER_LABELS"),
                       _number("DEID_ADAPTER_NER_THREADS", int, None),
                       _number("DEID_ADAPTER_NER_THRESHOLD", float, None))


def state_dir() -> Path:
    """Where the default stores and the audit key live: $XDG_STATE_HOME/deid-adapter or ~/.local/state/deid-adapter."""
    return Path(_get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")) / "deid-adapter"


def audit_store() -> str | None:
    """DEID_ADAPTER_AUDIT: the audit store (a SQLAlchemy URL, a SQLite path, or 'off')."""
    return _get("DEID_ADAPTER_AUDIT")


def audit_key_file() -> str | None:
    """DEID_ADAPTER_AUDIT_KEY_FILE: the key that signs the audit trail."""
    return _get("DEID_ADAPTER_AUDIT_KEY_FILE")


def audit_anchor() -> str | None:
    """DEID_ADAPTER_AUDIT_ANCHOR: the audit store's anchor file (default: beside a SQLite store, else in the state folder)."""
    return _get("DEID_ADAPTER_AUDIT_ANCHOR")


def actor() -> str | None:
    """DEID_ADAPTER_ACTOR: who acts, for the audit trail."""
    return _get("DEID_ADAPTER_ACTOR")


def vault_key_file() -> str | None:
    """DEID_ADAPTER_VAULT_KEY_FILE: the vault key (the `encrypt` method encrypts under it)."""
    return _get("DEID_ADAPTER_VAULT_KEY_FILE")


def vault_store() -> str | None:
    """DEID_ADAPTER_VAULT: the re-identification vault's store."""
    return _get("DEID_ADAPTER_VAULT")


def review_queue() -> str | None:
    """DEID_ADAPTER_REVIEW_QUEUE: the review queue's store."""
    return _get("DEID_ADAPTER_REVIEW_QUEUE")
