#!/usr/bin/env bash
# Installs the tools the Python SDK builds with, into a virtual environment of its own:
# componentize-py, which packages a Python app and CPython into a WebAssembly component.
#
# Idempotent and quick when already installed. Prints the venv's componentize-py path last.
#   STATEBOX_PYTHON_VENV   where the venv goes (default ~/.cache/statebox/python)
#   STATEBOX_PYTHON        the Python that creates it (default python3)
set -euo pipefail

# The componentize-py release the SDK is tested with (the newest on PyPI when it was
# written): it generates bindings for our WIT, and its components run on wasmtime 48.
COMPONENTIZE_PY_VERSION="0.25.1"

venv="${STATEBOX_PYTHON_VENV:-$HOME/.cache/statebox/python}"
python="${STATEBOX_PYTHON:-python3}"

if [ -x "$venv/bin/componentize-py" ] &&
    [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("componentize-py"))' 2>/dev/null)" = "$COMPONENTIZE_PY_VERSION" ]; then
    echo "$venv/bin/componentize-py"
    exit 0
fi

echo "installing componentize-py $COMPONENTIZE_PY_VERSION into $venv" >&2
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "componentize-py==$COMPONENTIZE_PY_VERSION" >&2
echo "$venv/bin/componentize-py"
