//! One task's owner generations and plan log.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use object_store::path::Path;
use object_store::{ObjectStoreExt as _, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::keys;
use crate::store::Shared;

/// How many times [`TaskStore::claim`] retries when other workers keep claiming first.
const CLAIM_ATTEMPTS: usize = 100;
/// How many plan reads [`TaskStore::plans_after`] keeps in flight.
const PLAN_READS_IN_FLIGHT: usize = 16;

/// One task's durable truth: `PREFIX/tasks/<name>/` (see the crate docs for the layout).
/// Every method blocks until the store has answered.
#[derive(Clone)]
pub struct TaskStore {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: String,
    /// `PREFIX/tasks/<name>`.
    pub(crate) dir: Path,
}

impl std::fmt::Debug for TaskStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStore")
            .field("url", &self.shared.url)
            .field("task", &self.name)
            .finish_non_exhaustive()
    }
}

/// What [`TaskStore::put_plan`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanPut {
    /// This call wrote the plan: run it.
    Written,
    /// Another writer stored plan N first; these are its bytes, to run instead of one's own
    /// (a batch's output is a function of its plan, so adopting it keeps every worker's
    /// batch N identical).
    Exists(Vec<u8>),
}

/// The body of `owners/<generation>`: for people reading the bucket; only the key matters.
#[derive(Serialize, Deserialize)]
struct OwnerRecord {
    generation: u64,
    claimed_at_ms: u64,
    pid: u32,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl TaskStore {
    pub(crate) fn new(shared: Arc<Shared>, name: &str) -> TaskStore {
        let dir = shared.root.clone().join(keys::TASKS).join(name);
        TaskStore {
            shared,
            name: name.to_owned(),
            dir,
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The object at `rel` (a `/`-separated key relative to the task's directory).
    pub(crate) fn path(&self, rel: &str) -> Path {
        rel.split('/')
            .fold(self.dir.clone(), |p, part| p.join(part))
    }

    /// `location` relative to the task's directory.
    pub(crate) fn rel(&self, location: &Path) -> Option<String> {
        location
            .as_ref()
            .strip_prefix(self.dir.as_ref())
            .and_then(|r| r.strip_prefix('/'))
            .map(str::to_owned)
    }

    /// Writes `body` at `path` only if nothing is there: `Ok(false)` when something was.
    pub(crate) fn put_create(&self, path: &Path, body: Vec<u8>, doing: &str) -> Result<bool> {
        let shared = &self.shared;
        shared.check_writable(doing)?;
        match shared.block_on(shared.store.put_opts(
            path,
            PutPayload::from(body),
            PutOptions::from(PutMode::Create),
        )) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(shared.err(format!("{doing} ({path})"), e)),
        }
    }

    /// The object at `path`, or `None` if there is none.
    pub(crate) fn get(&self, path: &Path, doing: &str) -> Result<Option<Vec<u8>>> {
        let shared = &self.shared;
        let got = shared.block_on(async {
            match shared.store.get(path).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        got.map(|b| b.map(|b| b.to_vec()))
            .map_err(|e| shared.err(format!("{doing} ({path})"), e))
    }

    /// The numbered objects (`<20 digits>`) directly in `dir`, ascending.
    fn numbered(&self, dir: &str) -> Result<Vec<u64>> {
        let listed = self.shared.list(&self.path(dir))?;
        Ok(listed
            .iter()
            .filter_map(|m| m.location.filename().and_then(keys::parse_number))
            .collect())
    }

    /// The newest owner generation claimed, if any.
    pub fn owner_generation(&self) -> Result<Option<u64>> {
        Ok(self.numbered(keys::OWNERS)?.last().copied())
    }

    /// Claims the task: writes `owners/<g+1>` create-only, where g is the newest generation
    /// claimed (generations start at 1). Losing a race to another claimant re-reads and
    /// tries the next number, so two claimants never hold the same generation; after
    /// `CLAIM_ATTEMPTS` lost races this gives up with [`Error::Fenced`].
    ///
    /// Claiming does not stop the previous owner by itself: it stops at its next
    /// [`TaskStore::check_owner`] (done before every plan and manifest it writes), and Kafka
    /// fences its producer when the new owner initialises transactions.
    pub fn claim(&self) -> Result<u64> {
        let mut tried = 0;
        for _ in 0..CLAIM_ATTEMPTS {
            let next = self.owner_generation()?.map_or(1, |g| g + 1);
            tried = next;
            let record = OwnerRecord {
                generation: next,
                claimed_at_ms: now_ms(),
                pid: std::process::id(),
            };
            let body = serde_json::to_vec(&record).expect("an owner record serialises");
            let path = self.path(&format!("{}/{}", keys::OWNERS, keys::number(next)));
            if self.put_create(&path, body, "claim an owner generation")? {
                tracing::info!(task = %self.name, generation = next, "claimed the task");
                return Ok(next);
            }
            tracing::debug!(task = %self.name, generation = next, "lost a claim race; retrying");
        }
        Err(Error::Fenced {
            task: self.name.clone(),
            generation: tried,
            newest: self.owner_generation()?,
        })
    }

    /// `Ok` if `generation` is the newest claimed, else [`Error::Fenced`]. A check, not a
    /// lock: a claim may land right after it. The design does not need more, because what
    /// an owner writes after its check is create-only (plans, manifests) and determined by
    /// the stored plans, so a late write by a fenced owner is either refused or identical
    /// to what the new owner would write; the check bounds how long a fenced owner keeps
    /// spending work.
    pub fn check_owner(&self, generation: u64) -> Result<()> {
        let newest = self.owner_generation()?;
        if newest == Some(generation) {
            Ok(())
        } else {
            Err(Error::Fenced {
                task: self.name.clone(),
                generation,
                newest,
            })
        }
    }

    fn plan_path(&self, batch: u64) -> Path {
        self.path(&format!("{}/{}", keys::PLANS, keys::number(batch)))
    }

    /// Stores batch `batch`'s plan create-only, after checking that `generation` still owns
    /// the task. If a plan for `batch` is already stored (another owner got there first,
    /// or this worker's earlier attempt did), returns the stored bytes, which the caller
    /// runs instead of its own.
    pub fn put_plan(&self, generation: u64, batch: u64, plan: &[u8]) -> Result<PlanPut> {
        self.check_owner(generation)?;
        let path = self.plan_path(batch);
        if self.put_create(&path, plan.to_vec(), "write a plan")? {
            return Ok(PlanPut::Written);
        }
        match self.get(&path, "read a plan that already exists")? {
            Some(stored) => {
                if stored != plan {
                    tracing::info!(task = %self.name, batch, "adopting the plan another writer stored first");
                }
                Ok(PlanPut::Exists(stored))
            }
            None => Err(Error::Corrupt {
                task: self.name.clone(),
                what: format!("plan {batch} ({path})"),
                reason: "a create-only write found it, but reading it found nothing \
                         (deleted in between?)"
                    .into(),
            }),
        }
    }

    /// Batch `batch`'s stored plan, if any.
    pub fn get_plan(&self, batch: u64) -> Result<Option<Vec<u8>>> {
        self.get(&self.plan_path(batch), "read a plan")
    }

    /// The newest batch with a stored plan, if any.
    pub fn latest_plan(&self) -> Result<Option<u64>> {
        Ok(self.numbered(keys::PLANS)?.last().copied())
    }

    /// The stored plans of batches `batch + 1, batch + 2, …` up to the newest, in order:
    /// what a new owner re-runs after restoring the snapshot of `batch`. The log must be
    /// contiguous from `batch + 1`: a plan missing before a later one (deleted by retention
    /// while still needed, or lost) is [`Error::Corrupt`], because re-running past it would
    /// re-plan a batch that may already have been delivered differently. An empty result
    /// means no plans were stored after `batch`.
    pub fn plans_after(&self, batch: u64) -> Result<Vec<(u64, Vec<u8>)>> {
        let dir = self.path(keys::PLANS);
        let offset = self.plan_path(batch);
        let shared = &self.shared;
        let listed: Vec<object_store::ObjectMeta> = {
            use futures::TryStreamExt as _;
            shared
                .block_on(
                    shared
                        .store
                        .list_with_offset(Some(&dir), &offset)
                        .try_collect(),
                )
                .map_err(|e| shared.err(format!("list {dir}/ after {offset}"), e))?
        };
        let mut batches: Vec<u64> = listed
            .iter()
            .filter_map(|m| m.location.filename().and_then(keys::parse_number))
            .filter(|&b| b > batch)
            .collect();
        batches.sort_unstable();
        for (expected, &found) in (batch + 1..).zip(&batches) {
            if found != expected {
                return Err(Error::Corrupt {
                    task: self.name.clone(),
                    what: format!("the plan log ({dir}/)"),
                    reason: format!("plan {expected} is missing but plan {found} exists"),
                });
            }
        }
        // A new owner replays every plan since the snapshot before it can plan anew, so
        // the reads go out several at a time (one round trip each on S3).
        let fetched: Vec<(u64, Option<Vec<u8>>)> = {
            use futures::{StreamExt as _, TryStreamExt as _};
            shared
                .block_on(
                    futures::stream::iter(batches)
                        .map(|b| {
                            let path = self.plan_path(b);
                            async move {
                                match shared.store.get(&path).await {
                                    Ok(r) => Ok((b, Some(r.bytes().await?.to_vec()))),
                                    Err(object_store::Error::NotFound { .. }) => Ok((b, None)),
                                    Err(e) => Err(e),
                                }
                            }
                        })
                        .buffered(PLAN_READS_IN_FLIGHT)
                        .try_collect::<Vec<_>>(),
                )
                .map_err(|e| shared.err(format!("read the plans after {batch}"), e))?
        };
        fetched
            .into_iter()
            .map(|(b, plan)| {
                plan.map(|p| (b, p)).ok_or_else(|| Error::Corrupt {
                    task: self.name.clone(),
                    what: format!("plan {b}"),
                    reason: "listed but gone when read (deleted concurrently?)".into(),
                })
            })
            .collect()
    }

    /// Deletes the plans of batches before `batch` (retention), after checking that
    /// `generation` owns the task. `batch` may be at most one past the newest snapshot's
    /// batch: later plans are what a new owner needs to rebuild state after restoring it.
    /// Passing the *oldest retained* snapshot's batch keeps every retained snapshot
    /// restorable. Returns how many plans were deleted.
    pub fn delete_plans_before(&self, generation: u64, batch: u64) -> Result<usize> {
        self.shared.check_writable("delete plans")?;
        self.check_owner(generation)?;
        let newest_snapshot = self.snapshot_batches()?.last().copied();
        if newest_snapshot.is_none_or(|s| batch > s + 1) {
            return Err(Error::Config(format!(
                "task {}: refusing to delete plans before batch {batch}: the newest snapshot is \
                 {newest_snapshot:?}, and plans after it are needed to rebuild the state",
                self.name
            )));
        }
        let mut deleted = 0;
        for b in self.numbered(keys::PLANS)? {
            if b >= batch {
                break;
            }
            let path = self.plan_path(b);
            self.delete(&path, "delete an old plan")?;
            deleted += 1;
        }
        tracing::debug!(task = %self.name, before = batch, deleted, "deleted old plans");
        Ok(deleted)
    }

    /// Deletes `path`; already gone is fine.
    pub(crate) fn delete(&self, path: &Path, doing: &str) -> Result<()> {
        let shared = &self.shared;
        shared.check_writable(doing)?;
        match shared.block_on(shared.store.delete(path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(shared.err(format!("{doing} ({path})"), e)),
        }
    }
}
