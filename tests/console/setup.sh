#!/usr/bin/env bash
# Installs what the console's browser tests need: Debian's chromium (browser downloads are
# blocked, so Playwright's own `install` cannot be used) and playwright-core from the
# committed package-lock.json. Idempotent: returns at once when both are there.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v chromium >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "tests/console/setup.sh: Node.js 20+ with npm is needed for the browser tests" >&2
    exit 1
fi
# npm writes node_modules/.package-lock.json after a successful install; when it is newer than
# the lock file, nothing has changed since.
if [ node_modules/.package-lock.json -nt package-lock.json ] && [ -d node_modules/playwright-core ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
