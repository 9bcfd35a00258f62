//! The disk cache of compiled components, keyed by the BLAKE3 hash of the component's
//! bytes: loading a processor the host compiled before skips Cranelift.
//!
//! A cache keyed by content only grows: every edit of a processor, and every build whose
//! bytes name where it was built, adds an entry. [`trim`] keeps a directory of entries
//! within a size, removing the least recently used first ([`mark_used`] on every hit), so
//! a user's cache and a CI machine's stay bounded. The CLI's build caches of Python and
//! JavaScript processors use the same two functions.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::{CacheWriteError, LoadError};

/// What the CLI's cache of compiled components keeps (in bytes) before it removes the least
/// recently used: about a hundred Python processors (~37 MiB compiled each), or a thousand
/// Rust ones.
pub const COMPILED_MAX_BYTES: u64 = 4 << 30;

/// Compiles `bytes` (whose content hash is `hash`), or reads the artifact an earlier
/// compilation left in `cache_dir`; a fresh compilation is written there for next time.
/// Past `max_bytes` (if given), the least recently used artifacts are removed after a
/// fresh one is written.
///
/// A component is compiled once however many processes (or threads) load it at once: the
/// one compiling holds the entry's lock ([`lock_entry`]), and the others wait for it and
/// read its artifact. Compiling a Python processor takes seconds of CPU; a test run that
/// starts forty processes over a few components compiled each of them many times over.
pub(crate) fn compile_cached(
    engine: &Engine,
    cache_dir: Option<&Path>,
    max_bytes: Option<u64>,
    bytes: &[u8],
    hash: &str,
) -> Result<Component, LoadError> {
    let cached = cache_dir.map(|dir| dir.join(format!("{hash}.cwasm")));
    let read = || cached.as_deref().map(|path| read_cached(engine, path));
    let first = read();
    if let Some(Cached::Usable(component)) = first {
        return Ok(component);
    }
    let lock = cached.as_deref().and_then(lock_entry);
    // Another loader may have made the entry while this one waited for the lock; an
    // unusable one (already warned about) is compiled again and replaced.
    if lock.is_some()
        && matches!(first, Some(Cached::Absent))
        && let Some(Cached::Usable(component)) = read()
    {
        return Ok(component);
    }
    #[cfg(test)]
    tests::COMPILED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(hash.to_owned());
    let component =
        Component::new(engine, bytes).map_err(|e| LoadError::Invalid(format!("{e:#}")))?;
    if let (Some(path), Some(dir)) = (&cached, cache_dir) {
        match write_cache(path, &component) {
            Ok(()) => {
                if let Some(max_bytes) = max_bytes {
                    trim(dir, "cwasm", max_bytes, path);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not cache compiled component"),
        }
    }
    drop(lock);
    Ok(component)
}

/// What the cache holds at a path.
enum Cached {
    Absent,
    /// A file wasmtime does not take (from another engine version or configuration, or
    /// damaged): warned about once, then compiled again over.
    Unusable,
    Usable(Component),
}

/// The component cached at `path`, if there is a usable one (marked used).
fn read_cached(engine: &Engine, path: &Path) -> Cached {
    if !path.exists() {
        return Cached::Absent;
    }
    // SAFETY: the cache directory holds only artifacts this host compiled itself (written
    // by `compile_cached` under the content hash of the source); wasmtime checks that the
    // artifact matches this engine's version and configuration.
    match unsafe { Component::deserialize_file(engine, path) } {
        Ok(component) => {
            mark_used(path);
            Cached::Usable(component)
        }
        Err(e) => {
            #[cfg(test)]
            tests::UNUSABLE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(path.to_owned());
            tracing::warn!(error = %e, path = %path.display(), "ignoring unusable cached component");
            Cached::Unusable
        }
    }
}

/// The lock of the cache entry `path` while it is being made (compiled, or built by the
/// CLI): `<path>.lock`, locked (waiting while another process or thread holds it).
/// Dropping it removes the file, then unlocks: a loader waiting on the removed file finds
/// the artifact once it has the lock; one arriving later finds the artifact before looking
/// for a lock. `None` (best effort: the entry is made without waiting) if the file cannot
/// be made or locked.
pub fn lock_entry(path: &Path) -> Option<EntryLock> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let opened = std::fs::create_dir_all(path.parent()?).and_then(|()| {
        std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
    });
    let file = match opened.and_then(|file| file.lock().map(|()| file)) {
        Ok(file) => file,
        Err(e) => {
            tracing::debug!(error = %e, lock = %lock_path.display(), "cannot lock a cache entry");
            return None;
        }
    };
    Some(EntryLock {
        path: lock_path,
        _file: file,
    })
}

/// A cache entry's lock; see [`lock_entry`].
#[must_use = "the entry is unlocked when this is dropped"]
pub struct EntryLock {
    path: PathBuf,
    /// Locked; closing it unlocks.
    _file: std::fs::File,
}

impl Drop for EntryLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Marks the cache entry `path` as just used (its modification time), so [`trim`] removes
/// it last. Best effort: an entry it cannot touch is only the likelier to go.
pub fn mark_used(path: &Path) {
    let touched = std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(error = %e, entry = %path.display(), "cannot mark a cache entry used");
    }
}

/// Removes files named `*.{extension}` from `dir`, least recently used (modified) first,
/// until those left hold at most `max_bytes`; `keep` (the entry just written) stays
/// whatever its size. Returns how many bytes it removed.
///
/// Best effort, beside other processes using the cache: an entry goes only once newer ones
/// fill the bound, so one just used (marked) stays; a compiled artefact removed as another
/// process opens it is a miss there (compiled again), and a file being read stays readable
/// until closed. Other files (temporary ones, MACs) are left alone.
pub fn trim(dir: &Path, extension: &str, max_bytes: u64, keep: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut entries: Vec<(SystemTime, u64, PathBuf)> = read
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let path = entry.path();
            if path.extension()? != extension || path == keep {
                return None;
            }
            let meta = entry.metadata().ok()?;
            meta.is_file().then(|| {
                (
                    meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    meta.len(),
                    path,
                )
            })
        })
        .collect();
    let kept = std::fs::metadata(keep).map_or(0, |m| m.len());
    let mut total = kept + entries.iter().map(|&(_, len, _)| len).sum::<u64>();
    if total <= max_bytes {
        return 0;
    }
    entries.sort_unstable_by_key(|&(modified, _, _)| modified);
    let mut removed = 0;
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => removed += len,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::debug!(error = %e, entry = %path.display(), "cannot trim a cache entry");
                continue;
            }
        }
        // Gone either way: removed here, or by another process trimming the same cache.
        total -= len;
    }
    removed
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// The hashes of the components [`compile_cached`] compiled, one per compilation.
    pub(super) static COMPILED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// The unusable cache files [`read_cached`] warned about, one per warning.
    pub(super) static UNUSABLE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    fn compilations(hash: &str) -> usize {
        COMPILED
            .lock()
            .unwrap()
            .iter()
            .filter(|h| *h == hash)
            .count()
    }

    /// The smallest component: an empty one.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    /// Loaders of a component another is compiling wait for it and read its artifact: three
    /// loaders that find the entry locked compile it once between them.
    #[test]
    fn loaders_of_a_component_being_compiled_wait_and_read_its_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let engine = crate::sandbox::engine().unwrap();
        let hash = "being-compiled";
        let path = dir.path().join(format!("{hash}.cwasm"));
        let lock_file = dir.path().join(format!("{hash}.cwasm.lock"));
        // Held here, as a process compiling the component would hold it.
        let held = lock_entry(&path).unwrap();
        assert!(lock_file.exists());
        let started = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let loaders: Vec<_> = (0..3)
            .map(|_| {
                let (engine, dir) = (engine.clone(), dir.path().to_owned());
                let started = started.clone();
                std::thread::spawn(move || {
                    started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    compile_cached(&engine, Some(&dir), None, EMPTY_COMPONENT, hash).map(|_| ())
                })
            })
            .collect();
        // Every loader is past its first look at the cache and waiting on the lock well
        // before the lock is let go, however busy the machine.
        while started.load(std::sync::atomic::Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            loaders.iter().all(|l| !l.is_finished()),
            "the loaders wait for the lock"
        );
        assert_eq!(compilations(hash), 0);
        drop(held);
        for loader in loaders {
            loader.join().unwrap().unwrap();
        }
        assert_eq!(compilations(hash), 1, "one compiled, the others read");
        assert!(path.exists());
        assert!(!lock_file.exists(), "the lock's file is removed");
        // A later load reads the artifact without compiling or locking.
        compile_cached(&engine, Some(dir.path()), None, EMPTY_COMPONENT, hash).unwrap();
        assert_eq!(compilations(hash), 1);
        assert!(!lock_file.exists());
    }

    /// An unusable cached file is warned about once, compiled over, and read the next time.
    #[test]
    fn an_unusable_cached_file_is_warned_about_once_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let engine = crate::sandbox::engine().unwrap();
        let hash = "unusable";
        let path = dir.path().join(format!("{hash}.cwasm"));
        std::fs::write(&path, b"not a compiled component").unwrap();
        let warnings = || {
            UNUSABLE
                .lock()
                .unwrap()
                .iter()
                .filter(|p| **p == path)
                .count()
        };
        compile_cached(&engine, Some(dir.path()), None, EMPTY_COMPONENT, hash).unwrap();
        assert_eq!((compilations(hash), warnings()), (1, 1));
        compile_cached(&engine, Some(dir.path()), None, EMPTY_COMPONENT, hash).unwrap();
        assert_eq!(
            (compilations(hash), warnings()),
            (1, 1),
            "the replacement is read"
        );
    }

    /// Without a cache nothing is locked: each load compiles.
    #[test]
    fn without_a_cache_each_load_compiles() {
        let engine = crate::sandbox::engine().unwrap();
        let hash = "uncached";
        for _ in 0..2 {
            compile_cached(&engine, None, None, EMPTY_COMPONENT, hash).unwrap();
        }
        assert_eq!(compilations(hash), 2);
    }

    /// An entry of `len` bytes last used `age_s` seconds ago.
    fn entry(dir: &Path, name: &str, len: usize, age_s: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, vec![0u8; len]).unwrap();
        let f = std::fs::File::options().append(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
        path
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn trimming_removes_the_least_recently_used_entries_until_the_rest_fit() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        entry(d, "oldest.cwasm", 400, 400);
        let used = entry(d, "used-long-ago.cwasm", 400, 300);
        entry(d, "old.cwasm", 400, 200);
        entry(d, "recent.cwasm", 400, 100);
        // Not entries of this cache: a temporary file and a MAC, however old.
        entry(d, ".tmp-1-2", 5000, 500);
        entry(d, "a.cwasm.mac", 5000, 500);
        // A hit makes an old entry the newest.
        mark_used(&used);
        let fresh = entry(d, "fresh.cwasm", 400, 0);
        // Five entries of 400 bytes in 1,200: the two least recently used go.
        assert_eq!(trim(d, "cwasm", 1200, &fresh), 800);
        assert_eq!(
            names(d),
            [
                ".tmp-1-2",
                "a.cwasm.mac",
                "fresh.cwasm",
                "recent.cwasm",
                "used-long-ago.cwasm"
            ]
        );
        // Within the bound nothing goes.
        assert_eq!(trim(d, "cwasm", 1200, &fresh), 0);
        assert_eq!(names(d).len(), 5);
    }

    #[test]
    fn the_entry_just_written_stays_even_when_it_alone_is_over_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        entry(d, "older.wasm", 100, 100);
        let fresh = entry(d, "fresh.wasm", 1000, 0);
        assert_eq!(trim(d, "wasm", 500, &fresh), 100);
        assert_eq!(names(d), ["fresh.wasm"]);
        // A missing directory is an empty cache.
        assert_eq!(trim(&d.join("missing"), "wasm", 0, &fresh), 0);
    }
}
