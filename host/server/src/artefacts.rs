//! The compiled-component cache, guarded: the runtime loads a cached artefact as native
//! code, so the server lets it load only artefacts this host wrote itself.
//!
//! - The cache directory must be a real directory (not a symlink) owned by the server's
//!   user and writable by no one else; the server's own cache (`compiled/` in the data
//!   directory) is made `0700`. Anything else refuses to start, naming the directory.
//! - Every artefact the runtime writes is sealed with a keyed BLAKE3 MAC (its content under a
//!   random key kept in the cache directory, mode `0600`), in a `.mac` file beside it. Before
//!   each load, an artefact that is not a regular file owned by the server's user, is
//!   writable by others, or has no matching MAC is removed, so the runtime compiles the
//!   component afresh instead of loading it.
//!
//! What remains trusted is the server's own user: whoever can write as it can replace the
//! binary too.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why the compiled-component cache cannot be used: the server refuses to start, naming
/// the directory or file (the operator's to fix).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The cache, or a file in it, is not one the server may trust: owned by another user,
    /// writable by others, a symlink, a key that is not private or is damaged.
    #[error("{0}")]
    Untrusted(String),
    /// A file operation on the cache failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The OS gave no randomness for the cache's key.
    #[error("no randomness for a key: {0}")]
    NoRandomness(String),
}

/// `what` as the context of an I/O error of the cache.
fn io(what: String) -> impl FnOnce(std::io::Error) -> CacheError {
    move |source| CacheError::Io { what, source }
}

/// The guarded cache directory and its MAC key.
pub(crate) struct ArtefactGuard {
    dir: PathBuf,
    key: [u8; 32],
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Refuses `path` unless it is owned by the server's user and writable by no one else.
fn check_owned(path: &Path, meta: &std::fs::Metadata) -> Result<(), CacheError> {
    if meta.uid() != euid() {
        return Err(CacheError::Untrusted(format!(
            "{} belongs to user {}, not to the server's user {}: the server loads compiled \
             code only from a cache it owns",
            path.display(),
            meta.uid(),
            euid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(CacheError::Untrusted(format!(
            "{} is writable by other users (mode {:o}): the server loads compiled code only \
             from a cache no one else can write",
            path.display(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

impl ArtefactGuard {
    /// Opens (creating it if needed) the cache directory `dir`; `own` says it is the
    /// server's own, which is made private.
    pub fn open(dir: &Path, own: bool) -> Result<ArtefactGuard, CacheError> {
        std::fs::create_dir_all(dir)
            .map_err(io(format!("cannot create the cache {}", dir.display())))?;
        let meta =
            std::fs::symlink_metadata(dir).map_err(io(format!("cannot read {}", dir.display())))?;
        if !meta.is_dir() {
            return Err(CacheError::Untrusted(format!(
                "the cache {} is not a directory (a symlink?): the server loads compiled code \
                 only from a directory it owns",
                dir.display()
            )));
        }
        if own && meta.uid() == euid() && meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(format!("cannot make {} private", dir.display())))?;
        }
        let meta =
            std::fs::symlink_metadata(dir).map_err(io(format!("cannot read {}", dir.display())))?;
        check_owned(dir, &meta)?;
        let key = read_or_create_key(&dir.join(".statebox-mac-key"))?;
        Ok(ArtefactGuard {
            dir: dir.to_owned(),
            key,
        })
    }

    fn artefact(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.cwasm"))
    }

    fn mac_path(&self, hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}.cwasm.mac"))
    }

    /// The MAC of the artefact of `hash` as it is now, if it is a file the server may trust
    /// to be its own (owned by its user, writable by no one else).
    fn mac_of(&self, hash: &str) -> Option<String> {
        let path = self.artefact(hash);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() || check_owned(&path, &meta).is_err() {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        Some(blake3::keyed_hash(&self.key, &bytes).to_hex().to_string())
    }

    /// Before a load of the component with BLAKE3 `hash`: removes a cached artefact the
    /// server did not write (no MAC, a wrong one, or a file it cannot trust), so the runtime
    /// compiles the component instead of loading it.
    pub fn before_load(&self, hash: &str) {
        let path = self.artefact(hash);
        if std::fs::symlink_metadata(&path).is_err() {
            return;
        }
        let recorded = std::fs::read_to_string(self.mac_path(hash)).ok();
        let verified = match (self.mac_of(hash), recorded) {
            (Some(actual), Some(recorded)) => {
                crate::auth::constant_time_eq(actual.as_bytes(), recorded.trim().as_bytes())
            }
            _ => false,
        };
        if !verified {
            tracing::warn!(
                artefact = %path.display(),
                "removing a compiled artefact this server did not write; compiling afresh"
            );
            let _ = std::fs::remove_file(&path);
            let _ = std::fs::remove_file(self.mac_path(hash));
        }
    }

    /// After a load: seals the artefact the runtime just wrote (if it wrote one).
    pub fn after_load(&self, hash: &str) {
        let Some(actual) = self.mac_of(hash) else {
            return;
        };
        let recorded = std::fs::read_to_string(self.mac_path(hash)).ok();
        if recorded.as_deref().map(str::trim) == Some(actual.as_str()) {
            return;
        }
        if let Err(e) = crate::registry::write_atomically(&self.mac_path(hash), actual.as_bytes()) {
            tracing::warn!(error = %e, "cannot record a compiled artefact's MAC");
        }
    }

    /// Bytes of the artefact of `hash` (0 if there is none).
    pub fn size(&self, hash: &str) -> u64 {
        std::fs::metadata(self.artefact(hash)).map_or(0, |m| m.len())
    }

    /// Removes the artefact of `hash` and its MAC.
    pub fn remove(&self, hash: &str) {
        let _ = std::fs::remove_file(self.artefact(hash));
        let _ = std::fs::remove_file(self.mac_path(hash));
    }
}

/// The MAC key in `path`, created (random, mode `0600`, atomically) if missing.
fn read_or_create_key(path: &Path) -> Result<[u8; 32], CacheError> {
    for _ in 0..2 {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => {
                if !meta.is_file() || meta.mode() & 0o077 != 0 {
                    return Err(CacheError::Untrusted(format!(
                        "the cache's key {} is not a private file (mode {:o})",
                        path.display(),
                        meta.mode() & 0o7777
                    )));
                }
                check_owned(path, &meta)?;
                let bytes =
                    std::fs::read(path).map_err(io(format!("cannot read {}", path.display())))?;
                return <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                    CacheError::Untrusted(format!("the cache's key {} is damaged", path.display()))
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
        }
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| CacheError::NoRandomness(e.to_string()))?;
        // Written aside and linked into place: another server starting on the same cache
        // at the same time reads one whole key, never a half-written one.
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io(format!("cannot create {}", tmp.display())))?;
            f.write_all(&key)
                .and_then(|()| f.sync_all())
                .map_err(io(format!("cannot write {}", tmp.display())))?;
        }
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(format!("cannot create {}", path.display()))(e)),
        }
    }
    Err(CacheError::Untrusted(format!(
        "cannot create the cache's key {}",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artefacts_the_server_did_not_write_are_removed_before_a_load() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("compiled");
        let guard = ArtefactGuard::open(&cache, true).unwrap();
        let mode = std::fs::metadata(&cache).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Written by "the runtime", sealed after the load: kept.
        std::fs::write(cache.join("aa.cwasm"), b"compiled by us").unwrap();
        guard.after_load("aa");
        guard.before_load("aa");
        assert!(cache.join("aa.cwasm").exists());
        // Replaced behind the server's back: removed.
        std::fs::write(cache.join("aa.cwasm"), b"planted").unwrap();
        guard.before_load("aa");
        assert!(!cache.join("aa.cwasm").exists());
        // Planted without a MAC: removed.
        std::fs::write(cache.join("bb.cwasm"), b"planted").unwrap();
        guard.before_load("bb");
        assert!(!cache.join("bb.cwasm").exists());
        // Writable by others: not trusted, even with a MAC.
        std::fs::write(cache.join("cc.cwasm"), b"compiled by us").unwrap();
        guard.after_load("cc");
        std::fs::set_permissions(
            cache.join("cc.cwasm"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        guard.before_load("cc");
        assert!(!cache.join("cc.cwasm").exists());
        // The key survives a restart; a second guard verifies the first one's MACs.
        std::fs::write(cache.join("dd.cwasm"), b"compiled by us").unwrap();
        guard.after_load("dd");
        let again = ArtefactGuard::open(&cache, true).unwrap();
        again.before_load("dd");
        assert!(cache.join("dd.cwasm").exists());
    }

    #[test]
    fn a_cache_writable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("shared");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ArtefactGuard::open(&cache, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("writable by other users"), "{err}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        let err = ArtefactGuard::open(&link, false).err().unwrap().to_string();
        assert!(err.contains("not a directory"), "{err}");
    }
}
