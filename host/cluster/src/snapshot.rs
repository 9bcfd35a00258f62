//! Snapshots of a task's RocksDB checkpoint: upload (SSTs content-addressed, the rest per
//! upload, then a create-only manifest), restore (verified), and retention.

use std::collections::HashSet;
use std::io::{Read as _, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt as _, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::keys;
use crate::task::{TaskStore, now_ms};

/// The manifest format this crate writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// Files up to this size are uploaded with one PUT; larger ones in parts (S3 caps a single
/// PUT at 5 GiB, and a part-wise upload keeps memory bounded).
const SINGLE_PUT_MAX: u64 = 16 << 20;
/// The part size of a multipart upload, and the read buffer of hashing and uploading.
const PART: usize = 8 << 20;
/// How many parts of one file are in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// A snapshot manifest, stored create-only at `snapshots/<batch>.json`: the files of a
/// RocksDB checkpoint of the task's state after batch `batch`. A snapshot exists once its
/// manifest does; files without a manifest are an interrupted upload and are never read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The task.
    pub task: String,
    /// The last batch whose effects the checkpoint holds.
    pub batch: u64,
    /// The owner generation that uploaded it.
    pub generation: u64,
    /// The upload's unique id: the directory of its per-snapshot files, so two uploads of
    /// one batch (a fenced owner and its successor, or a retry) never overwrite each
    /// other's files.
    pub upload: String,
    /// When it was uploaded (the uploader's clock), in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Every file of the checkpoint.
    pub files: Vec<ManifestFile>,
}

/// One file of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Its name in the checkpoint directory (`000012.sst`, `CURRENT`, …).
    pub name: String,
    /// Its object key relative to the task's directory: `files/<blake3>.sst` for SSTs
    /// (immutable in RocksDB, so shared by every snapshot holding them) and
    /// `snapshots/<batch>/<upload>/<name>` for the rest (MANIFEST-*, OPTIONS-*, CURRENT,
    /// *.log change between checkpoints under the same names).
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// The BLAKE3 hash of its content, hex.
    pub blake3: String,
}

/// How many snapshots to keep, and how old an unreferenced object must be to be deleted.
///
/// Keep more than one: a successor that read the latest manifest just before this owner
/// wrote a newer one is still restoring the older snapshot, and must find its files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Snapshots kept, the newest included (at least 1). Older manifests are deleted after
    /// a new one is written.
    pub keep: usize,
    /// Objects under `files/` and `snapshots/` that no kept manifest lists are deleted only
    /// once older than this: an upload in progress (whose manifest is not written yet, by
    /// this worker or a successor) must not lose its files.
    pub grace: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: 3,
            grace: Duration::from_secs(15 * 60),
        }
    }
}

impl TaskStore {
    fn manifest_path(&self, batch: u64) -> Path {
        self.path(&format!("{}/{}.json", keys::SNAPSHOTS, keys::number(batch)))
    }

    /// The manifest objects (`snapshots/<batch>.json`), ascending by batch.
    fn manifest_metas(&self) -> Result<Vec<(u64, ObjectMeta)>> {
        let shared = &self.shared;
        let dir = self.path(keys::SNAPSHOTS);
        let listed = shared
            .block_on(shared.store.list_with_delimiter(Some(&dir)))
            .map_err(|e| shared.err(format!("list {dir}/"), e))?;
        let mut manifests: Vec<(u64, ObjectMeta)> = listed
            .objects
            .into_iter()
            .filter_map(|m| Some((m.location.filename().and_then(keys::parse_manifest)?, m)))
            .collect();
        manifests.sort_by_key(|(b, _)| *b);
        Ok(manifests)
    }

    /// The batches that have a snapshot, ascending.
    pub fn snapshot_batches(&self) -> Result<Vec<u64>> {
        Ok(self.manifest_metas()?.into_iter().map(|(b, _)| b).collect())
    }

    pub(crate) fn latest_manifest_meta(&self) -> Result<Option<(u64, ObjectMeta)>> {
        Ok(self.manifest_metas()?.pop())
    }

    /// The manifest of batch `batch`'s snapshot, if there is one.
    pub fn snapshot(&self, batch: u64) -> Result<Option<Manifest>> {
        let path = self.manifest_path(batch);
        let Some(body) = self.get(&path, "read a snapshot manifest")? else {
            return Ok(None);
        };
        let corrupt = |reason: String| Error::Corrupt {
            task: self.name.clone(),
            what: format!("snapshot manifest {path}"),
            reason,
        };
        let manifest: Manifest =
            serde_json::from_slice(&body).map_err(|e| corrupt(format!("not a manifest: {e}")))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(corrupt(format!(
                "format {} (this build reads {MANIFEST_FORMAT})",
                manifest.format
            )));
        }
        if manifest.task != self.name || manifest.batch != batch {
            return Err(corrupt(format!(
                "it says task {} batch {}",
                manifest.task, manifest.batch
            )));
        }
        for f in &manifest.files {
            let key_ok = (f.key.starts_with("files/") || f.key.starts_with("snapshots/"))
                && f.key.split('/').all(keys::is_plain_file_name);
            if !keys::is_plain_file_name(&f.name) || !key_ok {
                return Err(corrupt(format!(
                    "bad file entry {:?} at {:?}",
                    f.name, f.key
                )));
            }
        }
        Ok(Some(manifest))
    }

    /// The newest snapshot's manifest, if any: what a new owner restores.
    pub fn latest_snapshot(&self) -> Result<Option<Manifest>> {
        match self.manifest_metas()?.pop() {
            Some((batch, _)) => self.snapshot(batch),
            None => Ok(None),
        }
    }

    /// Uploads `dir`, a RocksDB checkpoint of the task's state after batch `batch` (SSTs
    /// hard-linked, MANIFEST-*, CURRENT, OPTIONS-*, maybe *.log; no subdirectories), as
    /// `generation`. SSTs already in `files/` (same hash and size) are not uploaded again.
    /// The manifest is written last, create-only, after checking ownership once more: an
    /// upload that stops before it (a crash, a lost connection, a fence) leaves the previous
    /// snapshot the latest. If a snapshot of `batch` already exists (another owner's, or
    /// this worker's earlier attempt), that stored manifest is returned: by determinism it
    /// holds the same state. After writing a manifest, applies `retention`; a failure there
    /// is logged, not returned, because the snapshot itself is durable.
    pub fn upload_snapshot(
        &self,
        generation: u64,
        batch: u64,
        dir: &std::path::Path,
        retention: &Retention,
    ) -> Result<Manifest> {
        self.upload_snapshot_observed(generation, batch, dir, retention, |_, _| {})
    }

    /// [`TaskStore::upload_snapshot`], calling `observe(file, uploaded)` as each file is
    /// in the store (`uploaded` is false for an SST that was already there), for progress
    /// reports and to act between files.
    pub fn upload_snapshot_observed(
        &self,
        generation: u64,
        batch: u64,
        dir: &std::path::Path,
        retention: &Retention,
        mut observe: impl FnMut(&ManifestFile, bool),
    ) -> Result<Manifest> {
        if retention.keep == 0 {
            return Err(Error::Config(
                "snapshot retention must keep at least one snapshot".into(),
            ));
        }
        self.shared.check_writable("upload a snapshot")?;
        self.check_owner(generation)?;
        if let Some(stored) = self.snapshot(batch)? {
            tracing::debug!(task = %self.name, batch, "the snapshot already exists");
            return Ok(stored);
        }
        let names = checkpoint_files(dir)?;
        let upload = upload_id(generation, batch);
        let (mut sent_files, mut sent_bytes) = (0usize, 0u64);
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let local = dir.join(&name);
            let (size, blake3) = hash_file(&local)?;
            let (key, uploaded) = if name.ends_with(".sst") {
                let key = format!("{}/{blake3}.sst", keys::FILES);
                let path = self.path(&key);
                let present = self.has_object(&path, size)?;
                if !present {
                    self.upload_file(&local, &path, size, &blake3)?;
                }
                (key, !present)
            } else {
                let key = format!(
                    "{}/{}/{upload}/{name}",
                    keys::SNAPSHOTS,
                    keys::number(batch)
                );
                self.upload_file(&local, &self.path(&key), size, &blake3)?;
                (key, true)
            };
            if uploaded {
                sent_files += 1;
                sent_bytes += size;
            }
            let file = ManifestFile {
                name,
                key,
                size,
                blake3,
            };
            observe(&file, uploaded);
            files.push(file);
        }
        self.check_owner(generation)?;
        let manifest = Manifest {
            format: MANIFEST_FORMAT,
            task: self.name.clone(),
            batch,
            generation,
            upload,
            created_at_ms: now_ms(),
            files,
        };
        let body = serde_json::to_vec_pretty(&manifest).expect("a manifest serialises");
        let path = self.manifest_path(batch);
        if !self.put_create(&path, body, "write a snapshot manifest")? {
            let stored = self.snapshot(batch)?.ok_or_else(|| Error::Corrupt {
                task: self.name.clone(),
                what: format!("snapshot manifest {path}"),
                reason: "a create-only write found it, but reading it found nothing".into(),
            })?;
            if stored.upload != manifest.upload {
                tracing::info!(task = %self.name, batch, "another owner stored this snapshot first; keeping theirs");
            }
            return Ok(stored);
        }
        tracing::info!(
            task = %self.name,
            batch,
            files = manifest.files.len(),
            uploaded_files = sent_files,
            uploaded_bytes = sent_bytes,
            "uploaded a snapshot"
        );
        if let Err(e) = self.prune(retention) {
            tracing::warn!(task = %self.name, error = %e, "snapshot retention failed; old objects stay");
        }
        Ok(manifest)
    }

    /// Whether `path` holds an object of `size` bytes.
    fn has_object(&self, path: &Path, size: u64) -> Result<bool> {
        let shared = &self.shared;
        match shared.block_on(shared.store.head(path)) {
            Ok(meta) => Ok(meta.size == size),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(shared.err(format!("look for {path}"), e)),
        }
    }

    /// Uploads the local file (overwriting: every key written here is either content
    /// addressed or unique to the upload), checking that it still has the size and hash
    /// measured before, so a checkpoint changed under our feet is not stored as another.
    fn upload_file(
        &self,
        local: &std::path::Path,
        path: &Path,
        size: u64,
        blake3: &str,
    ) -> Result<()> {
        let shared = &self.shared;
        shared.check_writable("upload a snapshot file")?;
        let read_err = |source| Error::Local {
            doing: format!("read {}", local.display()),
            source,
        };
        let mut file = std::fs::File::open(local).map_err(read_err)?;
        let mut hasher = blake3::Hasher::new();
        let mut read = 0u64;
        let stored = if size <= SINGLE_PUT_MAX {
            let mut body = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            file.read_to_end(&mut body).map_err(read_err)?;
            hasher.update(&body);
            read = body.len() as u64;
            shared
                .block_on(shared.store.put(path, PutPayload::from(body)))
                .map(drop)
        } else {
            shared.block_on(async {
                let upload = shared.store.put_multipart(path).await?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
                let mut buf = vec![0u8; PART];
                loop {
                    let n = match file.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) => {
                            writer.abort().await?;
                            return Err(object_store::Error::Generic {
                                store: "local file",
                                source: Box::new(e),
                            });
                        }
                    };
                    hasher.update(&buf[..n]);
                    read += n as u64;
                    writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                    writer.write(&buf[..n]);
                }
                writer.finish().await.map(drop)
            })
        };
        stored.map_err(|e| shared.err(format!("upload {} to {path}", local.display()), e))?;
        let hash = hasher.finalize().to_hex();
        if read != size || hash.as_str() != blake3 {
            return Err(Error::Local {
                doing: format!(
                    "upload {}: it changed while being uploaded ({size} bytes before, {read} \
                     after); a checkpoint directory must not change",
                    local.display()
                ),
                source: std::io::Error::other("file changed during upload"),
            });
        }
        Ok(())
    }

    /// Downloads every file of `manifest` into `dest`, a directory that must not exist or
    /// be empty, verifying each file's size and hash: a missing or damaged object is
    /// [`Error::Corrupt`] naming it. On success `dest` is a checkpoint directory RocksDB
    /// opens as is; on failure it holds a partial download, to be removed before retrying.
    pub fn restore(&self, manifest: &Manifest, dest: &std::path::Path) -> Result<()> {
        if manifest.task != self.name {
            return Err(Error::Config(format!(
                "restore: the manifest is task {}'s, not task {}'s",
                manifest.task, self.name
            )));
        }
        match std::fs::read_dir(dest) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(Error::Config(format!(
                        "restore needs a fresh directory, and {} is not empty",
                        dest.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Local {
                    doing: format!("read the restore directory {}", dest.display()),
                    source,
                });
            }
        }
        std::fs::create_dir_all(dest).map_err(|source| Error::Local {
            doing: format!("create the restore directory {}", dest.display()),
            source,
        })?;
        for file in &manifest.files {
            if !keys::is_plain_file_name(&file.name) {
                return Err(self.corrupt_file(manifest, file, "not a plain file name".into()));
            }
            self.download(manifest, file, &dest.join(&file.name))?;
        }
        tracing::info!(task = %self.name, batch = manifest.batch, files = manifest.files.len(), dest = %dest.display(), "restored a snapshot");
        Ok(())
    }

    fn corrupt_file(&self, manifest: &Manifest, file: &ManifestFile, reason: String) -> Error {
        Error::Corrupt {
            task: self.name.clone(),
            what: format!(
                "snapshot {}'s file {} ({})",
                manifest.batch,
                file.name,
                self.path(&file.key)
            ),
            reason,
        }
    }

    fn download(
        &self,
        manifest: &Manifest,
        file: &ManifestFile,
        local: &std::path::Path,
    ) -> Result<()> {
        let shared = &self.shared;
        let path = self.path(&file.key);
        let write_err = |source| Error::Local {
            doing: format!("write {}", local.display()),
            source,
        };
        let (size, hash) = shared.block_on(async {
            let got = match shared.store.get(&path).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(self.corrupt_file(manifest, file, "missing from the store".into()));
                }
                Err(e) => return Err(shared.err(format!("download {path}"), e)),
            };
            let mut out = std::fs::File::create(local).map_err(write_err)?;
            let mut stream = got.into_stream();
            let mut hasher = blake3::Hasher::new();
            let mut size = 0u64;
            while let Some(chunk) = stream
                .try_next()
                .await
                .map_err(|e| shared.err(format!("download {path}"), e))?
            {
                hasher.update(&chunk);
                size += chunk.len() as u64;
                out.write_all(&chunk).map_err(write_err)?;
            }
            out.flush().map_err(write_err)?;
            Ok((size, hasher.finalize().to_hex()))
        })?;
        if size != file.size || hash.as_str() != file.blake3 {
            let _ = std::fs::remove_file(local);
            return Err(self.corrupt_file(
                manifest,
                file,
                format!(
                    "expected {} bytes with BLAKE3 {}, found {size} bytes with BLAKE3 {hash}",
                    file.size, file.blake3
                ),
            ));
        }
        Ok(())
    }

    /// Deletes manifests beyond the newest `retention.keep`, then objects under `files/`
    /// and `snapshots/` that no kept manifest lists and that are older than
    /// `retention.grace`. Reads every kept manifest first and deletes nothing if one cannot
    /// be read, so a damaged manifest never makes its files look unreferenced.
    fn prune(&self, retention: &Retention) -> Result<()> {
        let batches = self.snapshot_batches()?;
        let (old, kept) = batches.split_at(batches.len().saturating_sub(retention.keep));
        let mut referenced = HashSet::new();
        for &batch in kept {
            if let Some(manifest) = self.snapshot(batch)? {
                referenced.extend(manifest.files.into_iter().map(|f| f.key));
            }
        }
        for &batch in old {
            self.delete(
                &self.manifest_path(batch),
                "delete an old snapshot manifest",
            )?;
        }
        let grace_ms = i64::try_from(retention.grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = i64::try_from(now_ms())
            .unwrap_or(i64::MAX)
            .saturating_sub(grace_ms);
        let mut deleted = 0usize;
        for dir in [keys::FILES, keys::SNAPSHOTS] {
            for meta in self.shared.list(&self.path(dir))? {
                let Some(rel) = self.rel(&meta.location) else {
                    continue;
                };
                let is_manifest = rel
                    .strip_prefix("snapshots/")
                    .is_some_and(|n| keys::parse_manifest(n).is_some());
                if is_manifest
                    || referenced.contains(&rel)
                    || meta.last_modified.timestamp_millis() > cutoff
                {
                    continue;
                }
                self.delete(&meta.location, "delete an unreferenced snapshot file")?;
                deleted += 1;
            }
        }
        tracing::debug!(task = %self.name, manifests = old.len(), objects = deleted, "snapshot retention");
        Ok(())
    }
}

/// The file names of a checkpoint directory, sorted; subdirectories are refused (RocksDB
/// checkpoints are flat, so one means the wrong directory was given).
fn checkpoint_files(dir: &std::path::Path) -> Result<Vec<String>> {
    let local = |source| Error::Local {
        doing: format!("read the checkpoint directory {}", dir.display()),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(local)? {
        let entry = entry.map_err(local)?;
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(local)?;
        let name = entry.file_name().into_string().map_err(|n| {
            Error::Config(format!(
                "checkpoint directory {}: file name {n:?} is not UTF-8",
                dir.display()
            ))
        })?;
        if !meta.is_file() {
            return Err(Error::Config(format!(
                "{} is not a RocksDB checkpoint: {name} is not a regular file",
                dir.display()
            )));
        }
        names.push(name);
    }
    if names.is_empty() {
        return Err(Error::Config(format!(
            "{} is not a RocksDB checkpoint: it is empty",
            dir.display()
        )));
    }
    names.sort();
    Ok(names)
}

/// A file's size and BLAKE3 hash.
fn hash_file(path: &std::path::Path) -> Result<(u64, String)> {
    let local = |source| Error::Local {
        doing: format!("read {}", path.display()),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(local)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; PART];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(local)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hasher.finalize().to_hex().to_string()))
}

/// A name no other upload has: the generation, then a hash of the batch, the clock, the
/// process and a counter of this process's uploads.
fn upload_id(generation: u64, batch: u64) -> String {
    static UPLOADS: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = blake3::Hasher::new();
    h.update(&batch.to_le_bytes());
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&UPLOADS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let hex = h.finalize().to_hex();
    format!("{}-{}", keys::number(generation), &hex[..16])
}
