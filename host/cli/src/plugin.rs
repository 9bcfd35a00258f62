//! Resolving `--processor`: a `.wasm` file as is, or a plugin folder built with cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Returns the `.wasm` component for a `--processor` argument, building a plugin folder
/// (a cargo package) for `wasm32-wasip2` first.
pub(crate) fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_owned());
    }
    let manifest = path.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("{} is a folder without a Cargo.toml", path.display()))?;
    let name = package_name(&text)
        .with_context(|| format!("no [package] name in {}", manifest.display()))?;
    // Plugins get their own target directory: next to a shared CARGO_TARGET_DIR if there
    // is one (so repeated builds are warm), else inside the plugin folder.
    let target_dir = std::env::var_os("STATEBOX_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|d| PathBuf::from(d).join("wasm-plugins"))
        })
        .unwrap_or_else(|| path.join("target"));
    eprintln!("building plugin {name} for wasm32-wasip2 ...");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args([
            "build",
            "--quiet",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
        ])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .status()
        .context("cannot run cargo to build the plugin")?;
    if !status.success() {
        bail!("building plugin {} failed", path.display());
    }
    let wasm = target_dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    if !wasm.exists() {
        bail!(
            "cargo built {name} but {} is missing (is it a cdylib?)",
            wasm.display()
        );
    }
    Ok(wasm)
}

fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if let Some(rest) = line.strip_prefix("name").filter(|_| in_package) {
            let value = rest.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_package_name() {
        let toml = "[workspace]\nname = \"x\"\n[package]\nname = \"session-tracker\"\nversion = \"0.1.0\"\n";
        assert_eq!(package_name(toml).as_deref(), Some("session-tracker"));
    }
}
