//! Resolving `--processor`: a `.wasm` file as is, or a plugin folder built with cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// Returns the `.wasm` component for a `--processor` argument, building a plugin folder
/// (a cargo package) for `wasm32-wasip2` first.
pub(crate) fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    // A Python processor, as a `.py` file or a folder with a `processor.py`, is built with
    // the Python SDK (cached by content hash).
    if path.extension().is_some_and(|e| e == "py") && path.is_file() {
        return crate::python::build(path, &crate::python::PythonOptions::default());
    }
    if path.join("processor.py").is_file() {
        let options = crate::python::PythonOptions {
            name: path
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
            ..Default::default()
        };
        return crate::python::build(&path.join("processor.py"), &options);
    }
    if is_js_processor(path) {
        return build_js(path);
    }
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

/// Whether `path` is a JavaScript/TypeScript processor: a `.ts`/`.js` file, or a folder that
/// is not a cargo package and holds a `package.json` or a `processor.ts`/`processor.js`.
fn is_js_processor(path: &Path) -> bool {
    const SOURCES: [&str; 4] = ["ts", "mts", "js", "mjs"];
    if path.is_file() {
        return path
            .extension()
            .is_some_and(|e| SOURCES.iter().any(|s| e == *s));
    }
    path.is_dir()
        && !path.join("Cargo.toml").exists()
        && (path.join("package.json").is_file()
            || SOURCES
                .iter()
                .any(|ext| path.join(format!("processor.{ext}")).is_file()))
}

/// Builds a JavaScript/TypeScript processor with the JS SDK's `build.mjs` (esbuild, then
/// componentize-js), which caches components by content hash, so an unchanged processor is
/// not rebuilt. `$STATEBOX_JS_SDK` overrides where the SDK is (default: `guest-sdk/js` of
/// the source tree this binary was built from).
fn build_js(path: &Path) -> anyhow::Result<PathBuf> {
    let sdk = std::env::var_os("STATEBOX_JS_SDK")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk/js"));
    let script = sdk.join("build.mjs");
    if !script.is_file() {
        bail!(
            "{} is a JavaScript processor, but the JavaScript SDK is not at {} \
             (set STATEBOX_JS_SDK to the guest-sdk/js folder)",
            path.display(),
            sdk.display()
        );
    }
    let cache = user_cache_dir("js")?;
    eprintln!("building JavaScript processor {} ...", path.display());
    let output = Command::new(std::env::var_os("STATEBOX_NODE").unwrap_or_else(|| "node".into()))
        .arg(&script)
        .arg(path)
        .arg("--cache-dir")
        .arg(&cache)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run node (Node.js 20+) to build the JavaScript processor")?;
    if !output.status.success() {
        bail!("building JavaScript processor {} failed", path.display());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let wasm = stdout
        .lines()
        .last()
        .map(|line| PathBuf::from(line.trim()))
        .filter(|wasm| wasm.is_file())
        .with_context(|| format!("build.mjs printed no component path: {stdout}"))?;
    // build.mjs finds or adds the component; the cache's bound is kept here.
    statebox_runtime::cache::mark_used(&wasm);
    statebox_runtime::cache::trim(&cache, "wasm", JS_BUILDS_MAX_BYTES, &wasm);
    Ok(wasm)
}

/// What the cache of built JavaScript processors keeps (in bytes) before it removes the
/// least recently used.
const JS_BUILDS_MAX_BYTES: u64 = 1 << 30;

/// The directory `sub` of this user's cache of built components: under the CLI's cache
/// (`$STATEBOX_CACHE_DIR`, `$XDG_CACHE_HOME/statebox/components` or
/// `$HOME/.cache/statebox/components`). Without a home or cache directory, under
/// `statebox-<uid>` in the system's temporary directory, which must be this user's own:
/// created with mode 0700, or, if it exists, a real directory (not a symlink) owned by
/// this user that nobody else can write to. Anything else there is refused, since
/// another user could have planted components in it, or a symlink to elsewhere.
pub(crate) fn user_cache_dir(sub: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = crate::cache_dir() {
        return Ok(dir.join(sub));
    }
    let dir = private_dir(&std::env::temp_dir(), &format!("statebox-{}", euid()))?;
    Ok(dir.join(sub))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `parent/name`, created with mode 0700 if it does not exist, and checked to be a
/// directory (not a symlink) owned by this user and closed to everyone else.
fn private_dir(parent: &Path, name: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = parent.join(name);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| format!("cannot create the cache {}", dir.display()));
        }
    }
    // Not followed: a symlink planted under this name is refused, not trusted.
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("cannot read the cache {}", dir.display()))?;
    if !meta.file_type().is_dir() {
        bail!(
            "the cache {} is not a directory (a symlink or file someone else may have put \
             there); remove it, or set STATEBOX_CACHE_DIR or HOME",
            dir.display()
        );
    }
    if meta.uid() != euid() {
        bail!(
            "the cache {} belongs to user {}, not to this user ({}): it cannot be trusted; \
             remove it, or set STATEBOX_CACHE_DIR or HOME",
            dir.display(),
            meta.uid(),
            euid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        bail!(
            "the cache {} is open to other users (mode {:o}; it must be 700): it cannot be \
             trusted; remove it, or set STATEBOX_CACHE_DIR or HOME",
            dir.display(),
            meta.mode() & 0o777
        );
    }
    Ok(dir)
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
    fn the_temporary_cache_is_private_and_refused_when_it_is_not() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let tmp = tempfile::tempdir().unwrap();
        // Created with mode 0700, and accepted again as it is.
        let dir = private_dir(tmp.path(), "statebox-test").unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(private_dir(tmp.path(), "statebox-test").unwrap(), dir);
        // Opened to others: refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(tmp.path(), "statebox-test").unwrap_err();
        assert!(e.to_string().contains("mode 777"), "{e}");
        // A symlink planted under the name, even to a private directory of this user.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("planted")).unwrap();
        let e = private_dir(tmp.path(), "planted").unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // A file under the name.
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        assert!(private_dir(tmp.path(), "file").is_err());
        // Another user's directory (only root can make one here).
        if euid() == 0 {
            let theirs = tmp.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = private_dir(tmp.path(), "theirs").unwrap_err();
            assert!(e.to_string().contains("belongs to user 65534"), "{e}");
        }
    }

    #[test]
    fn reads_the_package_name() {
        let toml = "[workspace]\nname = \"x\"\n[package]\nname = \"session-tracker\"\nversion = \"0.1.0\"\n";
        assert_eq!(package_name(toml).as_deref(), Some("session-tracker"));
    }
}
