#!/usr/bin/env bash
# Debian's Chromium for the review page's browser tests (Playwright drives it with executable_path);
# never a browser downloaded by a test tool. Idempotent: does nothing when /usr/bin/chromium exists.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium
/usr/bin/chromium --version 2>/dev/null | grep -v "unexpected operator" || true
