#!/usr/bin/env bash
# Installs the S3-compatible server the object-store tests start on loopback: moto's
# `moto_server` (PyPI `moto[s3,server]`), into a virtual environment of its own. moto
# honours `If-None-Match: *` on PUT, which the task store's create-only writes rely on.
#
# Idempotent and quick when already installed. Prints the `moto_server` path last, where
# `statebox_tests::s3` looks for it.
#   STATEBOX_S3_VENV   where the venv goes (default ~/.cache/statebox/s3-venv)
#   STATEBOX_PYTHON    the Python that creates it (default python3)
set -euo pipefail

# The moto release the tests were written against (the newest on PyPI then).
MOTO_VERSION="5.2.5"

venv="${STATEBOX_S3_VENV:-$HOME/.cache/statebox/s3-venv}"
python="${STATEBOX_PYTHON:-python3}"

if [ -x "$venv/bin/moto_server" ] &&
    [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null)" = "$MOTO_VERSION" ]; then
    echo "$venv/bin/moto_server"
    exit 0
fi

echo "installing moto $MOTO_VERSION into $venv" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "moto[s3,server]==$MOTO_VERSION" >&2
echo "$venv/bin/moto_server"
