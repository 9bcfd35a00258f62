//! The library crates below the CLI say whose fault an error is with their own typed
//! errors (`thiserror` enums such as `EngineError`, `StoreError`, `CallError`, `SqlError`):
//! `anyhow` is for the CLI and tests only. This checks the crates' manifests and sources,
//! so a library API that starts returning `anyhow::Error` fails here.

use std::path::{Path, PathBuf};

/// The library crates held to it: every crate below the CLI.
const LIBRARIES: [&str; 9] = [
    "schema", "state", "contract", "engine", "sql", "kafka", "runtime", "server", "cluster",
];

fn host() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn library_crates_return_typed_errors_not_anyhow() {
    let mut offenders = Vec::new();
    for name in LIBRARIES {
        let manifest = host().join(name).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        // Only [dependencies]: a dev-dependency would be for the crate's tests.
        let dependencies = text
            .split("\n[")
            .find(|section| section.starts_with("dependencies]"))
            .unwrap_or_default();
        if dependencies
            .lines()
            .any(|l| l.trim_start().starts_with("anyhow"))
        {
            offenders.push(format!("{} depends on anyhow", manifest.display()));
        }
        let mut files = Vec::new();
        rust_files(&host().join(name).join("src"), &mut files);
        assert!(!files.is_empty(), "no sources under host/{name}/src");
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap();
            if source.contains("anyhow::") {
                offenders.push(format!("{} names anyhow", file.display()));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

#[test]
fn the_check_sees_anyhow_where_it_is() {
    // The CLI uses anyhow, so the same reading of its manifest must find it: the check
    // above is not vacuous.
    let text = std::fs::read_to_string(host().join("cli/Cargo.toml")).unwrap();
    let dependencies = text
        .split("\n[")
        .find(|section| section.starts_with("dependencies]"))
        .unwrap_or_default();
    assert!(
        dependencies
            .lines()
            .any(|l| l.trim_start().starts_with("anyhow")),
        "{dependencies}"
    );
}
