#!/usr/bin/env bash
# Builds RocksDB as a release library and installs it in /usr/local/lib, where every build
# of Statebox links it (`.cargo/config.toml`); does nothing when the library installed there
# was built by this script with the same flags. The README's first command runs it; `.ci/run`
# does not (10–18 minutes would take a cold CI run past its budget), so CI tests on Debian's.
#
# Debian's librocksdb is compiled without `-DNDEBUG`: every assertion and every test sync
# point of RocksDB runs, in each memtable insert, block read and flush, and its checksums
# are computed in software. On it a batch's commit takes 29–40% longer (README, "RocksDB
# built with assertions"). This script compiles the RocksDB the `rocksdb` crate's own
# bindings are generated from (7.9.2, from the `librocksdb-sys` sources `cargo fetch` puts
# in the registry) with `-DNDEBUG -O2`, and with hardware checksums where this machine's
# CPU has the instructions. 10–18 minutes on 2 cores, once per machine: the library is kept
# in ~/.cache/statebox/rocksdb-release/lib and copied from there.
#
# Its soname (librocksdb.so.7.9) differs from Debian's (librocksdb.so.7.8), which stays
# installed: a build made without this library links Debian's instead, and runs.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${XDG_CACHE_HOME:-$HOME/.cache}/statebox/rocksdb-release"
prefix=/usr/local/lib

# One run at a time: a second (another checkout's setup, say) waits, then finds the library
# built and installed.
mkdir -p "$out"
exec 9>"$out/.lock"
if ! flock -n 9; then
    echo "install-rocksdb.sh: another run is building or installing RocksDB; waiting for it" >&2
    flock 9
fi

# The sources: the librocksdb-sys package of the lock file.
cargo fetch --locked --quiet --manifest-path "$root/Cargo.toml"
sys_dir="$(cargo metadata --locked --format-version 1 --manifest-path "$root/Cargo.toml" |
    python3 -c 'import json, os, sys
pkgs = [p for p in json.load(sys.stdin)["packages"] if p["name"] == "librocksdb-sys"]
print(os.path.dirname(pkgs[0]["manifest_path"]))')"
src="$sys_dir/rocksdb"
version="$(sed -n 's/^#define ROCKSDB_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
    "$src/include/rocksdb/version.h" | paste -sd.)"
lib="$out/lib/librocksdb.so.$version"

# DEBUG_LEVEL=0 is RocksDB's release build (-DNDEBUG -O2); -g0 leaves out debug information,
# which halves the compile time. PORTABLE=1 does not tune for this CPU's model; USE_SSE=1
# adds SSE4.2, PCLMUL, AVX2, BMI and LZCNT (Haswell, 2013, and later), so checksums (WAL
# records, blocks) are computed in hardware, and is left out on a CPU that lacks any of them.
# PORTABLE and USE_SSE reach RocksDB's platform detection only through the environment (as
# make's arguments they are ignored), so every flag is passed there.
cpu="$(grep -m1 '^flags' /proc/cpuinfo || true)"
sse=(USE_SSE=1)
for f in sse4_2 pclmulqdq avx2 bmi1 abm; do
    [[ " ${cpu#*:} " == *" $f "* ]] || sse=()
done
flags=(DEBUG_LEVEL=0 PORTABLE=1 "${sse[@]}" USE_RTTI=1 DISABLE_WARNING_AS_ERROR=1 EXTRA_CXXFLAGS=-g0)

# A library built with other flags is built again.
if [ -f "$lib" ] && [ "$(cat "$out/lib/.flags" 2>/dev/null)" != "${flags[*]}" ]; then
    rm -f "$lib"
fi
if [ ! -f "$lib" ]; then
    # Built in a copy: the registry's sources stay as cargo unpacked them.
    rm -rf "$out/src"
    mkdir -p "$out/lib"
    cp -r "$src" "$out/src"
    echo "install-rocksdb.sh: building RocksDB $version (10–18 minutes on 2 cores; log: $out/build.log)" >&2
    env "${flags[@]}" make -C "$out/src" -j"$(nproc)" shared_lib >"$out/build.log" 2>&1 ||
        { tail -20 "$out/build.log" >&2; echo "install-rocksdb.sh: RocksDB did not build (log: $out/build.log)" >&2; exit 1; }
    cp "$out/src/librocksdb.so.$version" "$lib.tmp"
    mv "$lib.tmp" "$lib"
    echo "${flags[*]}" >"$out/lib/.flags"
    rm -rf "$out/src"
fi

# Installed under its full version, with the names the linker (librocksdb.so) and the loader
# (the soname, librocksdb.so.MAJOR.MINOR) look for.
if ! cmp -s "$lib" "$prefix/librocksdb.so.$version"; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo mkdir -p "$prefix"
    $sudo install -m 0644 "$lib" "$prefix/librocksdb.so.$version"
    for name in "librocksdb.so.${version%.*}" librocksdb.so; do
        $sudo ln -sfn "librocksdb.so.$version" "$prefix/$name"
    done
    $sudo ldconfig
    # Binaries built before this linked Debian's library, and the `rocksdb` crate's build
    # script does not look for the library again: its artefacts are removed from this
    # checkout's target directory and `.ci/run`'s, so their next build links this one.
    for dir in "$root/target" "${CARGO_TARGET_DIR:-$HOME/.cache/statebox/target}"; do
        if [ -d "$dir/release" ]; then
            cargo clean --quiet --release -p librocksdb-sys --manifest-path "$root/Cargo.toml" \
                --target-dir "$dir"
        fi
    done
fi
