//! The object layout of a task (see the crate docs): names, and parsing them back.

use crate::error::{Error, Result};

/// The directory of every task, under the store's prefix.
pub(crate) const TASKS: &str = "tasks";
/// A task's plan log: `plans/<batch>`.
pub(crate) const PLANS: &str = "plans";
/// A task's manifests (`snapshots/<batch>.json`) and per-snapshot files
/// (`snapshots/<batch>/<upload>/<file>`).
pub(crate) const SNAPSHOTS: &str = "snapshots";
/// A task's content-addressed SST files: `files/<blake3>.sst`.
pub(crate) const FILES: &str = "files";
/// A task's owner generations: `owners/<generation>`.
pub(crate) const OWNERS: &str = "owners";
/// Workers' member records, beside `tasks/`: `members/<member>.json`.
pub(crate) const MEMBERS: &str = "members";

/// A batch id or generation as a key: 20 digits, so that key order is numeric order.
pub(crate) fn number(n: u64) -> String {
    format!("{n:020}")
}

/// The number a 20-digit key names; `None` for anything else.
pub(crate) fn parse_number(s: &str) -> Option<u64> {
    if s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

/// The batch a manifest key (`<batch>.json`) names.
pub(crate) fn parse_manifest(s: &str) -> Option<u64> {
    s.strip_suffix(".json").and_then(parse_number)
}

/// Task names are Kafka topic characters plus the partition: the same text is an object
/// key segment and a local directory name on every backend, with no escaping.
pub(crate) fn check_task_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "bad task name {name:?}: expected 1 to 255 ASCII letters, digits, '.', '_' or '-' \
             (a Kafka topic and partition such as \"orders-3\")"
        )))
    }
}

/// Whether `name` is a plain file name (no separators, not `.` or `..`): what a manifest
/// may name as a file of the restored directory.
pub(crate) fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}
