//! Opening a store from a URL, the I/O runtime behind the synchronous API, and the
//! store-wide view (`tasks()`) that `statebox group status` shows.

use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::TryStreamExt as _;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt as _, PutMode, PutOptions};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::keys;
use crate::task::TaskStore;

/// The accepted URL forms, quoted by every URL error.
const ACCEPTED: &str = "s3://BUCKET/PREFIX, file:///ABSOLUTE/DIR, a directory path, or memory://";

/// What every handle on one store shares: the backend, the prefix, and the runtime that
/// drives its futures.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The prefix under which `tasks/` lives (empty for the bucket's or directory's root).
    pub(crate) root: Path,
    /// The URL as given, for messages.
    pub(crate) url: String,
    /// False for a store opened with [`StateStore::open_read_only`]: every write is refused
    /// before it reaches the backend.
    writable: bool,
    /// A current-thread runtime: the engine and the worker threads are synchronous, so each
    /// call blocks on its own future. Several threads may call at once (tokio lets the
    /// current-thread scheduler be driven by whichever `block_on` holds it).
    runtime: tokio::runtime::Runtime,
}

impl Shared {
    /// Runs one store operation to completion on this thread.
    ///
    /// # Panics
    ///
    /// When called from inside an async runtime (tokio forbids nested `block_on`): async
    /// callers use `spawn_blocking`.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// `Ok` if this handle may write; `doing` names the write refused otherwise.
    pub(crate) fn check_writable(&self, doing: &str) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "state store {} is open read-only: cannot {doing}",
                self.url
            )))
        }
    }

    /// An [`Error::Store`] for a failed operation.
    pub(crate) fn err(&self, doing: impl Into<String>, source: object_store::Error) -> Error {
        Error::Store {
            url: self.url.clone(),
            doing: doing.into(),
            source,
        }
    }

    /// Every object under `prefix`, in key order (backends do not promise an order).
    pub(crate) fn list(&self, prefix: &Path) -> Result<Vec<ObjectMeta>> {
        let mut all: Vec<ObjectMeta> = self
            .block_on(self.store.list(Some(prefix)).try_collect())
            .map_err(|e| self.err(format!("list {prefix}/"), e))?;
        all.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(all)
    }
}

/// A state store: the object-store location under which every task of a query keeps its
/// plans, snapshots and owner generations. Cheap to clone; every clone shares one
/// connection pool and runtime.
#[derive(Clone)]
pub struct StateStore {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateStore")
            .field("url", &self.shared.url)
            .finish_non_exhaustive()
    }
}

/// One task as `statebox group status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskSummary {
    /// The task's name (`<topic>-<partition>`).
    pub name: String,
    /// The newest owner generation claimed, if any.
    pub owner_generation: Option<u64>,
    /// The newest batch with a stored plan, if any.
    pub latest_plan: Option<u64>,
    /// The batch of the newest snapshot manifest, if any.
    pub snapshot_batch: Option<u64>,
    /// When that manifest was written (the store's clock), in milliseconds since the Unix
    /// epoch.
    pub snapshot_at_ms: Option<i64>,
}

impl StateStore {
    /// Opens the store at `url`:
    ///
    /// - `s3://BUCKET/PREFIX`: Amazon S3 or an S3-compatible server, configured from the
    ///   environment like the AWS tools: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    ///   `AWS_SESSION_TOKEN`, `AWS_REGION` (or `AWS_DEFAULT_REGION`), `AWS_ENDPOINT_URL`
    ///   (or `AWS_ENDPOINT`) for a server other than AWS, and `AWS_ALLOW_HTTP=true` for a
    ///   plain-HTTP endpoint such as a loopback test server. Every other `AWS_*` variable
    ///   object_store knows is read too; unknown ones are ignored.
    /// - `file:///ABSOLUTE/DIR` or a plain directory path: a local directory (the embedded
    ///   default), created if missing.
    /// - `memory://` (optionally `memory://PREFIX`): an in-process store, for tests.
    ///
    /// Opening writes and removes a probe object under `PREFIX/.statebox-probe/` to check
    /// that the backend refuses a second create-only write of one key: the ownership fence,
    /// the plan log and the manifests rely on it, so a backend that silently overwrites is
    /// refused here instead of corrupting a task later.
    pub fn open(url: &str) -> Result<StateStore> {
        Self::open_with(url, std::iter::empty::<(&str, &str)>())
    }

    /// Like [`StateStore::open`], with `AWS_*` settings that take precedence over the
    /// environment (names as in the environment, e.g. `("AWS_ENDPOINT_URL", "http://…")`).
    /// For `s3://` URLs only: settings for another backend are a [`Error::Config`].
    pub fn open_with<K: AsRef<str>, V: Into<String>>(
        url: &str,
        settings: impl IntoIterator<Item = (K, V)>,
    ) -> Result<StateStore> {
        Self::open_mode(url, settings, true)
    }

    /// Opens the store for reading only (`statebox state`, `statebox sql`,
    /// `statebox group status`): no probe write, so read-only credentials suffice, and a
    /// local directory must already exist. Every write method returns [`Error::Config`].
    pub fn open_read_only(url: &str) -> Result<StateStore> {
        Self::open_read_only_with(url, std::iter::empty::<(&str, &str)>())
    }

    /// [`StateStore::open_read_only`] with `AWS_*` settings, as [`StateStore::open_with`].
    pub fn open_read_only_with<K: AsRef<str>, V: Into<String>>(
        url: &str,
        settings: impl IntoIterator<Item = (K, V)>,
    ) -> Result<StateStore> {
        Self::open_mode(url, settings, false)
    }

    fn open_mode<K: AsRef<str>, V: Into<String>>(
        url: &str,
        settings: impl IntoIterator<Item = (K, V)>,
        writable: bool,
    ) -> Result<StateStore> {
        let settings: Vec<(String, String)> = settings
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_owned(), v.into()))
            .collect();
        let (store, root) = backend(url, &settings, writable)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::Local {
                doing: "start the object store's I/O runtime".into(),
                source,
            })?;
        let state = StateStore {
            shared: Arc::new(Shared {
                store,
                root,
                url: url.to_owned(),
                writable,
                runtime,
            }),
        };
        if writable {
            state.check_create_only()?;
        }
        tracing::debug!(url, writable, "opened the state store");
        Ok(state)
    }

    /// The URL the store was opened with.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// The task `name` (`<topic>-<partition>`): its objects live under
    /// `PREFIX/tasks/<name>/`. Names are Kafka topic characters (ASCII letters, digits, `.`,
    /// `_`, `-`), so they map to object keys unchanged on every backend.
    pub fn task(&self, name: &str) -> Result<TaskStore> {
        keys::check_task_name(name)?;
        Ok(TaskStore::new(self.shared.clone(), name))
    }

    /// Every task that has anything stored, by name, with its newest owner generation,
    /// plan and snapshot.
    pub fn tasks(&self) -> Result<Vec<TaskSummary>> {
        let shared = &self.shared;
        let tasks_dir = shared.root.clone().join(keys::TASKS);
        let listed = shared
            .block_on(shared.store.list_with_delimiter(Some(&tasks_dir)))
            .map_err(|e| shared.err(format!("list {tasks_dir}/"), e))?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .filter(|name| keys::check_task_name(name).is_ok())
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let task = self.task(&name)?;
                let snapshot = task.latest_manifest_meta()?;
                Ok(TaskSummary {
                    owner_generation: task.owner_generation()?,
                    latest_plan: task.latest_plan()?,
                    snapshot_batch: snapshot.as_ref().map(|(batch, _)| *batch),
                    snapshot_at_ms: snapshot.map(|(_, meta)| meta.last_modified.timestamp_millis()),
                    name,
                })
            })
            .collect()
    }

    /// Writes one probe key create-only twice: the second write must be refused.
    fn check_create_only(&self) -> Result<()> {
        let shared = &self.shared;
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let probe = shared
            .root
            .clone()
            .join(".statebox-probe")
            .join(format!("{nonce:x}-{:x}", std::process::id()));
        let create = || PutOptions::from(PutMode::Create);
        let not_honoured = |how: String| {
            Error::Config(format!(
                "the object store at {} does not honour create-only writes \
                 (PutMode::Create, `If-None-Match: *` on S3): {how}. Statebox's task ownership \
                 fence, plan log and snapshot manifests rely on them, so it refuses this store \
                 rather than risk two workers overwriting each other",
                shared.url
            ))
        };
        shared.block_on(async {
            match shared.store.put_opts(&probe, b"1".to_vec().into(), create()).await {
                Ok(_) => {}
                Err(e @ object_store::Error::NotImplemented { .. }) => {
                    return Err(not_honoured(e.to_string()));
                }
                Err(e) => return Err(shared.err(format!("write the probe {probe}"), e)),
            }
            let second = shared
                .store
                .put_opts(&probe, b"2".to_vec().into(), create())
                .await;
            let cleanup = shared.store.delete(&probe).await;
            match second {
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Ok(_) => {
                    return Err(not_honoured(
                        "a second create-only write of one key succeeded".into(),
                    ));
                }
                Err(e @ object_store::Error::NotImplemented { .. }) => {
                    return Err(not_honoured(e.to_string()));
                }
                Err(e) => return Err(shared.err(format!("write the probe {probe} again"), e)),
            }
            if let Err(e) = cleanup {
                tracing::warn!(url = %shared.url, error = %e, "could not delete the create-only probe");
            }
            Ok(())
        })
    }
}

/// The backend and prefix a URL names.
fn backend(
    url: &str,
    settings: &[(String, String)],
    writable: bool,
) -> Result<(Arc<dyn ObjectStore>, Path)> {
    let bad = |why: &str| {
        Error::Config(format!(
            "state store URL {url:?}: {why}; accepted: {ACCEPTED}"
        ))
    };
    let prefix = |p: &str| {
        let p = p.trim_matches('/');
        Path::parse(p).map_err(|e| bad(&format!("bad prefix {p:?}: {e}")))
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        for (key, value) in settings {
            let config: AmazonS3ConfigKey = key.to_ascii_lowercase().parse().map_err(|_| {
                Error::Config(format!("state store {url:?}: unknown S3 setting {key:?}"))
            })?;
            builder = builder.with_config(config, value);
        }
        let s3 = builder.build().map_err(|e| {
            bad(&format!(
                "cannot configure S3 from the AWS_* environment: {e}"
            ))
        })?;
        return Ok((Arc::new(s3), prefix(path)?));
    }
    if !settings.is_empty() {
        return Err(Error::Config(format!(
            "state store {url:?}: settings such as {:?} apply to s3:// URLs only",
            settings[0].0
        )));
    }
    if let Some(rest) = url.strip_prefix("memory://") {
        return Ok((Arc::new(InMemory::new()), prefix(rest)?));
    }
    let dir = if let Some(rest) = url.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(bad("a file:// URL needs an absolute path (file:///dir)"));
        }
        std::path::PathBuf::from(rest)
    } else if url.contains("://") {
        return Err(bad("unknown scheme"));
    } else if url.is_empty() {
        return Err(bad("empty"));
    } else {
        std::path::absolute(url).map_err(|source| Error::Local {
            doing: format!("resolve the state store directory {url:?}"),
            source,
        })?
    };
    if !writable && !dir.is_dir() {
        return Err(bad(&format!("no directory at {}", dir.display())));
    }
    std::fs::create_dir_all(&dir).map_err(|source| Error::Local {
        doing: format!("create the state store directory {}", dir.display()),
        source,
    })?;
    let local = LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| bad(&format!("cannot use directory {}: {e}", dir.display())))?
        // Deleting a task's last object removes the directories it leaves empty.
        .with_automatic_cleanup(true);
    Ok((Arc::new(local), Path::default()))
}
