#!/usr/bin/env bash
# Installs the JavaScript SDK's build tools (componentize-js, jco, esbuild, TypeScript) into
# guest-sdk/js/node_modules from the committed package-lock.json. Idempotent: when the
# installed tree already matches the lock file it returns at once.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "guest-sdk/js/setup.sh: Node.js 20+ with npm is needed to build JavaScript processors" >&2
    exit 1
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
    echo "guest-sdk/js/setup.sh: Node.js 20+ is needed, found $(node --version)" >&2
    exit 1
fi

# npm writes node_modules/.package-lock.json after a successful install; when it is newer than
# the lock file (and the engine binaries are there) nothing has changed since.
if [ node_modules/.package-lock.json -nt package-lock.json ] \
    && [ -d node_modules/@bytecodealliance/wizer ] && [ -d node_modules/esbuild ] \
    && [ -f node_modules/@bytecodealliance/componentize-js/lib/starlingmonkey_embedding.wasm ]; then
    exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
