"""The re-identification vault (off by default): each pseudonym issued is stored with its original value,
encrypted with AES-256-GCM under a vault key that the audit trail and the pseudonym key know nothing of.

Only `deid-adapter vault reidentify PSEUDONYM --reason …` with the vault key returns an original, and every
attempt (granted or denied) is an audit record naming who asked and why. The vault store is a database of
its own (default ~/.local/state/deid-adapter/vault.sqlite) so its access can be restricted apart from the
audit trail.
"""
from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Optional, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from adapter.audit import trail as audit
from fhir_transforms import keys
from fhir_transforms.encryption import DecryptionFailed, ValueCipher
from fhir_transforms.fpe import FormatPreservingCipher, FpeFallback, derive_key, fpe_format
from adapter import settings

if TYPE_CHECKING:
    from sqlalchemy import Table

VAULT_ENV = "DEID_ADAPTER_VAULT"
VAULT_KEY_ENV = "DEID_ADAPTER_VAULT_KEY_FILE"
SEEN_LIMIT = 1_000_000  # pseudonyms this process remembers as stored, to skip re-inserting them



@lru_cache(maxsize=None)
def entries() -> Table:
    """The vault's table. SQLAlchemy is imported here, when a vault is opened (a run without --vault never loads it)."""
    import sqlalchemy as sa

    return sa.Table(
        "deid_vault_entry", sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pseudonym", sa.String(80), nullable=False),
        sa.Column("namespace", sa.Text, nullable=False),
        sa.Column("key_id", sa.String(40), nullable=False),  # the pseudonym key that issued it
        sa.Column("vault_key_id", sa.String(40), nullable=False),
        sa.Column("nonce", sa.String(24), nullable=False),
        sa.Column("ciphertext", sa.Text, nullable=False),
        sa.Column("created", sa.String(40), nullable=False),
        sa.UniqueConstraint("key_id", "namespace", "pseudonym", name="deid_vault_entry_issued"),
        sa.Index("deid_vault_entry_pseudonym", "pseudonym"),
    )


class VaultError(RuntimeError):
    """The vault cannot be written or read."""


class ReidentificationDenied(VaultError):
    """No original is returned: no vault key, a wrong one, or an unknown pseudonym. Never says more than that."""


@dataclass(frozen=True)
class Relink:
    pseudonym: str
    namespace: str
    key_id: str
    vault_key_id: str
    original: str


def _aad(key_id: str, namespace: str, pseudonym: str) -> bytes:
    # Binds a ciphertext to its row: moving it to another pseudonym makes decryption fail.
    return f"deid-adapter vault\x00{key_id}\x00{namespace}\x00{pseudonym}".encode()


def vault_url(target=None) -> str:
    """A SQLAlchemy URL from a URL, a SQLite path, or None (DEID_ADAPTER_VAULT, else the default vault.sqlite)."""
    return audit.database_url(target or settings.vault_store() or audit.state_dir() / "vault.sqlite")


class Vault:
    """The store of encrypted originals: pending pseudonyms are written by `flush`, read back by `reidentify`."""

    def __init__(self, url: str, vault_key: Optional[keys.Key] = None):
        self.url = url
        self.vault_key = vault_key
        self.engine = audit.make_engine(url)
        self._aead = AESGCM(vault_key.secret) if vault_key else None
        self.pending: dict[tuple[str, str, str], str] = {}
        self.seen: set[tuple[str, str, str]] = set()
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.begin() as conn:
                audit.create_tables(conn, entries().metadata)
        except SQLAlchemyError as e:
            raise VaultError(f"vault store {self.display_url}: {type(e).__name__}") from None

    @property
    def display_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def recorder(self, key_id: str):
        """A Pseudonymizer.on_issue callback that queues each pseudonym issued under pseudonym key `key_id`."""
        def on_issue(namespace: str, original: str, pseudonym: str) -> None:
            k = (key_id, namespace, pseudonym)
            if k not in self.seen:
                self.pending[k] = original
        return on_issue

    def flush(self) -> None:
        """Encrypt and store the pending pseudonyms (one transaction); they are durable on return."""
        if not self.pending:
            return
        if self._aead is None:
            raise VaultError("no vault key: cannot store originals")
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        rows = []
        for (key_id, namespace, pseudonym), original in self.pending.items():
            nonce = secrets.token_bytes(12)
            sealed = self._aead.encrypt(nonce, original.encode(), _aad(key_id, namespace, pseudonym))
            rows.append({"pseudonym": pseudonym, "namespace": namespace, "key_id": key_id,
                         "vault_key_id": self.vault_key.key_id, "nonce": base64.b64encode(nonce).decode(),
                         "ciphertext": base64.b64encode(sealed).decode(), "created": now})
        from sqlalchemy.dialects import postgresql, sqlite
        from sqlalchemy.exc import SQLAlchemyError

        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        try:
            with self.engine.begin() as conn:
                conn.execute(dialect.insert(entries()).on_conflict_do_nothing(), rows)
        except SQLAlchemyError as e:
            raise VaultError(f"vault store {self.display_url}: {type(e).__name__}") from None
        if len(self.seen) > SEEN_LIMIT:
            self.seen.clear()
        self.seen.update(self.pending)
        self.pending = {}

    def discard(self) -> None:
        """Forget pseudonyms of an output that is not written: nothing of it is kept."""
        self.pending = {}

    def reidentify(self, pseudonym: str, ring: Sequence[keys.Key]) -> list[Relink]:
        """The originals behind `pseudonym`, decrypted with a vault key of `ring`; ReidentificationDenied otherwise."""
        import sqlalchemy as sa

        table = entries()
        by_id = {k.key_id: k for k in ring}
        try:
            with self.engine.connect().execution_options(audit_read=True) as conn, conn.begin():
                rows = conn.execute(sa.select(table).where(table.c.pseudonym == pseudonym)
                                    .order_by(table.c.id)).all()
        except sa.exc.SQLAlchemyError as e:
            raise VaultError(f"vault store {self.display_url}: {type(e).__name__}") from None
        if not rows:
            raise ReidentificationDenied("pseudonym not in the vault")
        found = []
        for row in rows:
            key = by_id.get(row.vault_key_id)
            if key is None:
                raise ReidentificationDenied(f"wrong vault key (the entry was sealed with vault key {row.vault_key_id})")
            try:
                original = AESGCM(key.secret).decrypt(base64.b64decode(row.nonce), base64.b64decode(row.ciphertext),
                                                      _aad(row.key_id, row.namespace, row.pseudonym))
            except (InvalidTag, ValueError):
                raise ReidentificationDenied("the vault entry does not decrypt with this vault key") from None
            found.append(Relink(row.pseudonym, row.namespace, row.key_id, row.vault_key_id, original.decode()))
        return found

    def close(self) -> None:
        self.engine.dispose()


def reidentify(vault: Vault, trail: audit.AuditTrail, pseudonym: str, ring: Sequence[keys.Key], *, actor: str,
               reason: str, key_problem: str | None = None) -> list[Relink]:
    """Re-link a pseudonym under control: the attempt is an audit record (durable) before any original is returned.
    `key_problem`: why the caller has no ring (a key of the wrong purpose, say), recorded as the denial's reason."""
    detail = {"pseudonym": pseudonym, "reason": reason, "vault_key_ids": sorted(k.key_id for k in ring)}
    try:
        if not ring:
            raise ReidentificationDenied(key_problem or "no vault key given")
        found = vault.reidentify(pseudonym, ring)
    except ReidentificationDenied as e:
        trail.append([audit.AuditEntry("reidentify-denied", actor, "vault", detail={**detail, "denied": str(e)})])
        raise
    trail.append([audit.AuditEntry(
        "reidentify", actor, "vault", key_id=found[0].key_id,
        detail={**detail, "returned": [{"namespace": r.namespace, "key_id": r.key_id, "vault_key_id": r.vault_key_id}
                                       for r in found]})])
    return found


def decrypt(trail: audit.AuditTrail, value: str, ring: Sequence[keys.Key], options: dict, *, actor: str,
            reason: str, key_problem: str | None = None) -> tuple[str, str]:
    """The original behind an `encrypt` output, with a vault key of `ring` and the rule's format settings
    (`format`, and for fpe `alphabet`, `keep_prefix`, `check_digit`); (original, vault key id). The attempt is an
    audit record (durable) before the original is returned.

    AES-SIV authenticates: a wrong key is refused. FF3-1 does not: a wrong key gives a wrong value, so compare the
    vault key id this returns with the one the release was made with."""
    detail = {"value": value, "method": "encrypt", "reason": reason, "settings": dict(sorted(options.items())),
              "vault_key_ids": sorted(k.key_id for k in ring)}
    fmt = fpe_format({k: v for k, v in options.items() if k != "format"}) if options.get("format") == "fpe" else None
    try:
        if not ring:
            raise ReidentificationDenied(key_problem or "no vault key given")
        for key in ring:
            try:
                original = ValueCipher(key).decrypt(value, fmt)
                break
            except DecryptionFailed as e:
                problem = str(e)
        else:
            raise ReidentificationDenied(problem)
    except ReidentificationDenied as e:
        trail.append([audit.AuditEntry("reidentify-denied", actor, "vault", detail={**detail, "denied": str(e)})])
        raise
    trail.append([audit.AuditEntry("reidentify", actor, "vault", detail={**detail, "vault_key_id": key.key_id})])
    return original, key.key_id


def reverse_fpe(trail: audit.AuditTrail, pseudonym: str, system: str, pseudonym_key: Optional[keys.Key],
                options: dict, *, actor: str, reason: str) -> str:
    """Reverse an `fpe` pseudonym of an identifier of `system` with the FPE key (HKDF of the pseudonym key) and the
    rule's settings; the attempt is an audit record (durable) before the original is returned.

    FF3-1 has no integrity check: a wrong key or wrong settings give a wrong value, not an error, so compare the key
    id the output names (meta tag, MSH-8) with the key id this returns in the audit record.
    """
    namespace = "identifier|" + system
    detail = {"pseudonym": pseudonym, "namespace": namespace, "method": "fpe", "reason": reason,
              "settings": {k: v for k, v in sorted(options.items())}}
    try:
        if pseudonym_key is None:
            raise ReidentificationDenied("no pseudonym key given (the FPE key is derived from it)")
        try:
            cipher = FormatPreservingCipher(derive_key(pseudonym_key.secret))
            original = cipher.decrypt(namespace, pseudonym, fpe_format(options))
        except FpeFallback as e:
            raise ReidentificationDenied(f"not an fpe pseudonym under these settings ({e.reason})") from None
        except ValueError as e:
            raise ReidentificationDenied(str(e)) from None
    except ReidentificationDenied as e:
        trail.append([audit.AuditEntry("reidentify-denied", actor, "vault", detail={**detail, "denied": str(e)})])
        raise
    trail.append([audit.AuditEntry("reidentify", actor, "vault", key_id=pseudonym_key.key_id, detail=detail)])
    return original
