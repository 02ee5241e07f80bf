#!/usr/bin/env bash
# The fhir and hl7 commands' outputs on the shared samples, for comparing two checkouts byte for byte:
#   scripts/sample-outputs.sh CHECKOUT OUT_DIR        (then: diff -r OUT_A OUT_B)
# CHECKOUT: a checkout (a `git worktree` of another commit, say), run with this checkout's .venv unless PYTHON
# is set; the key is DEID_ADAPTER_KEY_FILE (one key for both runs); the audit trail is off. Only the .log files
# name OUT_DIR; the rc file lists commands that did not exit 0 (the peer folder holds malformed messages: 2).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
checkout="$(cd "$1" && pwd)"
out="$2"
python="${PYTHON:-$here/.venv/bin/python}"
: "${DEID_ADAPTER_KEY_FILE:?set DEID_ADAPTER_KEY_FILE to a key file (deid-adapter keys init KEY)}"
rm -rf "$out" && mkdir -p "$out" && out="$(cd "$out" && pwd)"
cd "$checkout"
export DEID_ADAPTER_AUDIT=off PYTHONPATH="$checkout"
run() {  # NAME ARGS...: one command, its log, and its exit status when not 0
  local name="$1"; shift
  "$python" -m adapter.cli "$@" --today 2026-01-15 > "$out/$name.log" 2>&1 || echo "$name rc=$?" >> "$out/rc"
}
run fhir-off fhir ../shared/data/fhir "$out/fhir-off" --validate off --stack patterns
run fhir-full fhir ../shared/data/fhir "$out/fhir-full" --validate full --profile longitudinal
run hl7 hl7 ../shared/data/hl7v2 "$out/hl7"
run hl7peer hl7 ../shared/data/hl7v2-peer "$out/hl7peer" --stack patterns
