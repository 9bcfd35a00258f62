#!/usr/bin/env bash
# Regenerates the console screenshots in docs/ (linked from the README): runs the browser
# test, which saves the main pages as PNGs when STATEBOX_SCREENSHOTS is set.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
"$root/tests/console/setup.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statebox/target}"
cargo build --release -p statebox
mkdir -p docs
STATEBOX_SCREENSHOTS="$root/docs" cargo test --release -p statebox-tests --test all -- \
    --exact console::the_console_drives_tenants_pipelines_state_and_upgrades_in_a_real_browser
ls -l docs/console-*.png
