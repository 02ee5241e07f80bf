#!/usr/bin/env bash
# The whole test suite on a fresh machine: install the project with every extra its tests use, start what
# the tests talk to (PostgreSQL; the review page's Chromium), build the documentation, then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,ner,spark,report]' 2>&1 | grep -v "is ignored: it is neither" || true

# PostgreSQL on 127.0.0.1:5432 (the audit and review stores are tested against it too).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start || true
  fi
fi

# A real browser for the review page tests (Debian's chromium; never a downloaded one).
if [ -x scripts/install-browser.sh ]; then
  scripts/install-browser.sh
fi

# The documentation site: --strict fails on a broken link or anchor, or a page missing from the nav. Not -q: it
# hides the warnings that strict mode counts, so the build would pass.
site="$(mktemp -d)"
docs_status=0
docs_log="$(.venv/bin/mkdocs build --strict -d "$site" 2>&1)" || docs_status=$?
rm -rf "$site"
if [ "$docs_status" -ne 0 ]; then
  printf '%s\n' "$docs_log" >&2
  exit "$docs_status"
fi

exec .venv/bin/python -m pytest -q "$@"
