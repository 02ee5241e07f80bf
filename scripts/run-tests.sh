#!/usr/bin/env bash
# The whole test suite on a fresh machine: install the project with every extra its tests use, start what
# the tests talk to (PostgreSQL; the review page's Chromium), build the documentation, then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the setup steps print (pip's notices, apt and dpkg) goes to a log; a step that fails shows its end.
python3 -m venv .venv
log=.venv/run-tests-setup.log
: > "$log"
step() {
  local what=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "run-tests: $what failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}
echo "run-tests: installing the project with its test extras; starting PostgreSQL and Chromium (log: $log)"
step "installing the project" .venv/bin/pip install -q --disable-pip-version-check -e '.[test,ner,spark,report]'

# PostgreSQL on 127.0.0.1:5432 (the audit and review stores are tested against it too).
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start >>"$log" 2>&1 || true
  fi
fi

# A real browser for the review page tests (Debian's chromium; never a downloaded one).
if [ -x scripts/install-browser.sh ]; then
  step "installing Chromium" scripts/install-browser.sh
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

echo "run-tests: documentation built; running the tests"
exec .venv/bin/python -m pytest -q "$@"
