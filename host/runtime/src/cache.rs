//! The disk cache of compiled components, keyed by the BLAKE3 hash of the component's
//! bytes: loading a processor the host compiled before skips Cranelift.

use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::{CacheWriteError, LoadError};

/// Compiles `bytes` (whose content hash is `hash`), or reads the artifact an earlier
/// compilation left in `cache_dir`; a fresh compilation is written there for next time.
pub(crate) fn compile_cached(
    engine: &Engine,
    cache_dir: Option<&Path>,
    bytes: &[u8],
    hash: &str,
) -> Result<Component, LoadError> {
    let cached = cache_dir.map(|dir| dir.join(format!("{hash}.cwasm")));
    if let Some(path) = cached.as_ref().filter(|p| p.exists()) {
        // SAFETY: the cache directory holds only artifacts this host compiled itself
        // (written below under the content hash of the source); wasmtime checks that
        // the artifact matches this engine's version and configuration.
        match unsafe { Component::deserialize_file(engine, path) } {
            Ok(c) => return Ok(c),
            Err(e) => tracing::warn!(error = %e, "ignoring unusable cached component"),
        }
    }
    let component =
        Component::new(engine, bytes).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
    if let Some(Err(e)) = cached.as_ref().map(|path| write_cache(path, &component)) {
        tracing::warn!(error = %e, "could not cache compiled component");
    }
    Ok(component)
}

/// Writes the artifact under a temporary name and renames it into place, so a reader never
/// sees half of one.
fn write_cache(path: &Path, component: &Component) -> Result<(), CacheWriteError> {
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = temp_path_in(dir);
    let bytes = component.serialize().map_err(CacheWriteError::Serialize)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn temp_path_in(dir: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    dir.join(format!(".tmp-{}-{nanos}", std::process::id()))
}
