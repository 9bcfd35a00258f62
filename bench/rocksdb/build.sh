#!/usr/bin/env bash
# Builds RocksDB as a release library for benchmarks and production runs, and does nothing
# when it is already built.
#
# Statebox links Debian's librocksdb by default (`.ci/setup` installs it; compiling RocksDB
# with every fresh build would cost CI ~15 more minutes). Debian's library is compiled
# without `-DNDEBUG`: every assertion and every test sync point of RocksDB runs, in each
# memtable insert, block read and flush. This script compiles the RocksDB the `rocksdb`
# crate's own bindings are generated from (7.9.2, from the `librocksdb-sys` sources `cargo
# fetch` puts in the registry) with `-DNDEBUG -O2` and hardware checksums, as a shared
# library in ~/.cache/statebox/rocksdb-release/lib. 12–18 minutes on 2 cores.
#
# A `statebox` binary built as usual loads it instead of Debian's with
#     LD_LIBRARY_PATH=~/.cache/statebox/rocksdb-release/lib statebox bench count ...
# The directory also holds the file name Debian's library has (librocksdb.so.7.8), linked to
# the new one: the `rocksdb` crate uses RocksDB's C API only, and 7.9's is 7.8's plus
# additions. `statebox bench` reports which library a run used and whether it has
# assertions on (`"rocksdb"` in its summary line). Not run by CI: no test needs it.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${XDG_CACHE_HOME:-$HOME/.cache}/statebox/rocksdb-release"

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
# which halves the compile time. PORTABLE=1 with USE_SSE=1 targets x86-64 with SSE4.2,
# PCLMUL, AVX2, BMI and LZCNT (Haswell, 2013, and later): without USE_SSE, RocksDB computes
# its checksums (WAL records, blocks) in software, 2% of a run's CPU.
# PORTABLE and USE_SSE reach RocksDB's platform detection only through the environment (as
# make's arguments they are ignored), so every flag is passed there.
flags=(DEBUG_LEVEL=0 PORTABLE=1 USE_SSE=1 USE_RTTI=1 DISABLE_WARNING_AS_ERROR=1 EXTRA_CXXFLAGS=-g0)
# A library built with other flags is built again.
if [ -f "$lib" ] && [ "$(cat "$out/lib/.flags" 2>/dev/null)" != "${flags[*]}" ]; then
    rm -f "$lib"
fi

if [ ! -f "$lib" ]; then
    # Built in a copy: the registry's sources stay as cargo unpacked them.
    rm -rf "$out/src"
    mkdir -p "$out/lib"
    cp -r "$src" "$out/src"
    env "${flags[@]}" make -C "$out/src" -j"$(nproc)" shared_lib >"$out/build.log" 2>&1 ||
        { tail -20 "$out/build.log" >&2; echo "build.sh: RocksDB did not build (log: $out/build.log)" >&2; exit 1; }
    cp "$out/src/librocksdb.so.$version" "$lib.tmp"
    mv "$lib.tmp" "$lib"
    echo "${flags[*]}" >"$out/lib/.flags"
    rm -rf "$out/src"
fi

# Every name a binary may ask for: this version's sonames, and the one of Debian's library
# that default builds link against.
major_minor="${version%.*}"
names=("librocksdb.so.${version%%.*}" "librocksdb.so.$major_minor" librocksdb.so)
debian="$(readlink -f /usr/lib/x86_64-linux-gnu/librocksdb.so 2>/dev/null || true)"
if [ -n "$debian" ] && [ -f "$debian" ]; then
    soname="$(objdump -p "$debian" | sed -n 's/^ *SONAME *//p')"
    [ -n "$soname" ] && names+=("$soname")
fi
for name in "${names[@]}"; do
    ln -sfn "librocksdb.so.$version" "$out/lib/$name"
done
echo "$out/lib"
