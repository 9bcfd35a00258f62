#!/usr/bin/env bash
# Installs the peers `statebox bench peers` runs next to Statebox, and nothing when they are
# already there:
#   - a venv at ~/.cache/statebox/peers-venv with PySpark 4.3 (Spark's jars come with it) and
#     what its `transformWithState` Python API needs (pandas, pyarrow, protobuf, grpcio);
#   - Flink 2.3's jars, taken from the PyPI wheel `apache-flink-libraries` (PyFlink ships
#     the whole Flink distribution's lib/ folder in it), unpacked into
#     ~/.cache/statebox/peers/flink-lib.
# Both come from PyPI, so no Maven and no downloads from elsewhere. Java 17 (`java`, `javac`)
# must be on the machine. Not run by CI: no test needs the peers.
#
# STATEBOX_PEERS_WHEEL_DIR may name a folder that already holds the Flink wheel (it is
# 329 MB); /tmp/flinkdl is looked at too. Without either the wheel is downloaded.
set -euo pipefail

PYSPARK_VERSION=4.3.0
FLINK_VERSION=2.3.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/statebox"
venv="$cache/peers-venv"
peers="$cache/peers"
flink_lib="$peers/flink-lib"

command -v javac >/dev/null || { echo "setup.sh: javac (Java 17) is needed" >&2; exit 1; }

# The venv: made and filled only when PySpark of that version cannot be imported from it.
if ! "$venv/bin/python" -c "import pyspark, pandas, pyarrow, grpc, google.protobuf, sys; sys.exit(pyspark.__version__ != '$PYSPARK_VERSION')" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        "pyspark==$PYSPARK_VERSION" pandas pyarrow protobuf grpcio
fi

# Flink's jars: unpacked only when flink-dist of that version is missing; the marker file is
# written last, so an interrupted unpack is done again.
if [ ! -f "$flink_lib/.complete-$FLINK_VERSION" ]; then
    wheel_name="apache_flink_libraries-$FLINK_VERSION-py2.py3-none-any.whl"
    wheel=""
    for dir in "${STATEBOX_PEERS_WHEEL_DIR:-}" /tmp/flinkdl "$peers/download"; do
        if [ -n "$dir" ] && [ -f "$dir/$wheel_name" ]; then
            wheel="$dir/$wheel_name"
            break
        fi
    done
    if [ -z "$wheel" ]; then
        mkdir -p "$peers/download"
        "$venv/bin/pip" download -q --disable-pip-version-check --no-deps \
            -d "$peers/download" "apache-flink-libraries==$FLINK_VERSION"
        wheel="$peers/download/$wheel_name"
    fi
    rm -rf "$flink_lib"
    mkdir -p "$flink_lib"
    # The wheel is a zip; the venv's Python unpacks it (no `unzip` needed on the machine).
    "$venv/bin/python" - "$wheel" "$flink_lib" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.startswith("pyflink/lib/") and name.endswith(".jar"):
            with z.open(info) as src, open(os.path.join(dest, os.path.basename(name)), "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
PY
    touch "$flink_lib/.complete-$FLINK_VERSION"
    # The downloaded wheel is not needed once unpacked.
    rm -rf "$peers/download"
fi

echo "peers installed: $venv (PySpark $PYSPARK_VERSION), $flink_lib (Flink $FLINK_VERSION)"
