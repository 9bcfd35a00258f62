//! Builds every guest the tests use (the example plugins and the purpose-built test
//! guests) for `wasm32-wasip2`, and tells the tests where the components are through
//! `STATEBOX_GUEST_<NAME>` environment variables.
//!
//! The guests get their own target directory: a build script must not wait on the cargo
//! lock of the build that is running it.

use std::path::PathBuf;
use std::process::Command;

/// Every guest: its cargo package, which is also its folder's name under `plugins/` or
/// `tests/guests/` (its component is the package name with `_` for `-`, `.wasm`).
const GUESTS: &[&str] = &[
    "counter",
    "session-tracker",
    "scd1",
    "misbehave",
    "state-ops",
    "state-ops-held",
    "heartbeat-monitor",
    "sessionizer",
    "dedup-ttl",
    "timer-ops",
    "user-profile-v1",
    "user-profile-v2",
    "user-profile-v3",
    "profile-kind-change",
    "profile-ttl-added",
    "counter-reset",
    "http-call",
    "hostile-calls",
    "hostile-upload",
];

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("workspace root").to_owned();
    for dir in ["wit", "guest-sdk/rust", "plugins", "tests/guests"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out.
    let target = out_dir
        .ancestors()
        .nth(4)
        .expect("target dir")
        .join("wasm-guests");

    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(&root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target);
    for g in GUESTS {
        cmd.args(["-p", g]);
    }
    // Flags meant for the host build must not leak into the guest build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    // The guests' debug info names the directory they were built in; mapped to `.`, a guest
    // is the same bytes in every clone, so the tests' cache of compiled components (keyed by
    // the bytes) keeps serving it instead of gaining an entry per clone.
    cmd.env(
        "CARGO_ENCODED_RUSTFLAGS",
        format!("--remap-path-prefix={}=.", root.display()),
    );
    let status = cmd.status().expect("run cargo to build the guests");
    assert!(
        status.success(),
        "building the wasm32-wasip2 guests failed (is the target installed? run .ci/setup)"
    );
    // The list itself, for the test that every guest built here is used
    // (`tests/all/guests_used.rs`), and the directory holding the components.
    println!("cargo:rustc-env=STATEBOX_GUESTS={}", GUESTS.join(","));
    println!(
        "cargo:rustc-env=STATEBOX_GUEST_DIR={}",
        target.join("wasm32-wasip2/release").display()
    );
    for g in GUESTS {
        let wasm = target
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", g.replace('-', "_")));
        assert!(
            wasm.exists(),
            "guest {g} was built but {} is missing",
            wasm.display()
        );
        println!(
            "cargo:rustc-env=STATEBOX_GUEST_{}={}",
            g.replace('-', "_").to_uppercase(),
            wasm.display()
        );
    }
}
