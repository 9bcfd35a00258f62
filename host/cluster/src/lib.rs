//! The task store: a Statebox query spread over several machines keeps each task's durable
//! truth in object storage (S3, or a local directory when embedded), so that whichever
//! worker owns a task next can rebuild its state exactly.
//!
//! A task is one Kafka input partition of the query, named `<topic>-<partition>`. Under
//! the store's prefix it owns these objects:
//!
//! ```text
//! PREFIX/tasks/<task>/
//!   owners/<generation, 20 digits>          one per claim, create-only
//!   plans/<batch, 20 digits>                each batch's plan (opaque bytes), create-only
//!   snapshots/<batch, 20 digits>.json       a manifest (create-only): a RocksDB checkpoint
//!                                           of the state after that batch
//!   snapshots/<batch>/<upload>/<file>       that checkpoint's MANIFEST-*, OPTIONS-*,
//!                                           CURRENT, *.log, per upload
//!   files/<blake3>.sst                      SST files, content-addressed, shared by
//!                                           every snapshot that holds them
//! ```
//!
//! Numbers are 20 zero-padded digits so that key order is numeric order.
//!
//! # Invariants
//!
//! - **Every write that decides something is create-only** (`PutMode::Create`,
//!   `If-None-Match: *` on S3): an owner generation, a plan, a manifest. Whoever writes
//!   one first wins; everyone else reads and adopts what is stored. [`StateStore::open`]
//!   refuses a backend that does not honour create-only writes.
//! - **A plan is written before its batch runs, and a batch is a function of its plan.**
//!   So two workers that both run batch N (a fenced owner and its successor) compute the
//!   same output and state; Kafka transactions let only one deliver.
//! - **A snapshot exists once its manifest does.** Files are uploaded first and the
//!   manifest last, so an upload that stops halfway leaves the previous snapshot the
//!   latest; restoring verifies each file's size and hash.
//! - **Owner generations only grow.** A worker claims g+1 and, before writing a plan or a
//!   manifest, checks that no newer generation exists ([`Error::Fenced`] if one does).
//!   The check is not a lock; it need not be, because of the first two invariants.
//! - **The plans after the newest snapshot are kept**, so a new owner can restore the
//!   snapshot of batch S and re-run plans S+1.. to the last batch delivered.
//!
//! The API is synchronous (the engine and the worker threads are): each store keeps a
//! small current-thread tokio runtime and blocks on it. Do not call it from inside an
//! async runtime; use `spawn_blocking` there.

mod error;
mod keys;
mod members;
mod snapshot;
mod store;
mod task;

pub use error::{Error, Result};
pub use members::MemberRecord;
pub use snapshot::{MANIFEST_FORMAT, Manifest, ManifestFile, Retention};
pub use store::{StateStore, TaskSummary};
pub use task::{PlanPut, TaskStore};

#[cfg(test)]
mod tests;
