"""Audit stores for the audit tests: a SQLite file, and a throwaway schema on a real PostgreSQL server.

PostgreSQL: DEID_ADAPTER_TEST_PG (a SQLAlchemy URL), default postgresql+psycopg://postgres@127.0.0.1:5432/test.
Each test gets its own schema, dropped afterwards. When the server does not answer the PostgreSQL cases are
skipped with the reason (`.ci/run` starts the server first, so CI runs them).
"""
from __future__ import annotations

import os
import secrets
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from fhir_transforms.keys import Key, key_id_for

PG_URL = os.environ.get("DEID_ADAPTER_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def audit_key(seed: int = 7) -> Key:
    secret = bytes([seed]) * 32
    return Key(key_id_for(secret, "audit"), secret)


def _postgres_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty audit store URL on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.sqlite'}"
        return
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    schema = f"deid_audit_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as e:  # noqa: BLE001 — any connection failure means: no server here
        admin.dispose()
        pytest.skip(f"PostgreSQL at {PG_URL} does not answer ({type(e).__name__}); set DEID_ADAPTER_TEST_PG")
    try:
        yield _postgres_url(schema)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def dump(url: str) -> bytes:
    """Every value of every table in the store, as text: what a canary search reads."""
    engine = create_engine(url)
    parts = []
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            tables = [r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")]
        else:
            tables = [r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"))]
        for t in tables:
            for row in conn.exec_driver_sql(f'SELECT * FROM "{t}"'):
                parts.append(repr(tuple(row)))
    engine.dispose()
    return "\n".join(parts).encode()
