//! The crate's typed errors, each saying whose fault it is and what to do about it.

use std::fmt::Write as _;

/// What went wrong in the task store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Talking to the object store failed (network, permissions, a missing bucket): an
    /// infrastructure fault; retrying later may help. `doing` says what was being done.
    #[error("object store {url}: {doing}")]
    Store {
        /// The store's URL as given to [`crate::StateStore::open`].
        url: String,
        /// What was being done, with the object key involved.
        doing: String,
        /// The object store's own error.
        #[source]
        source: object_store::Error,
    },
    /// Another worker claimed the task after this one: this worker must stop writing for it
    /// (not a failure of anyone; it is how ownership moves).
    #[error("task {task}: owner generation {generation} is fenced: {}", fenced_reason(*.generation, *.newest))]
    Fenced {
        /// The task.
        task: String,
        /// The generation this worker holds.
        generation: u64,
        /// The newest generation claimed in the store, if any.
        newest: Option<u64>,
    },
    /// Something stored is damaged or missing (a snapshot file with the wrong size or hash,
    /// an unreadable manifest, a plan missing inside the log): the store's content is at
    /// fault, not this process.
    #[error("task {task}: {what} is corrupt: {reason}")]
    Corrupt {
        /// The task.
        task: String,
        /// What is damaged, naming the object or file.
        what: String,
        /// How it is damaged.
        reason: String,
    },
    /// The caller's input is wrong: a bad URL, task name, setting or argument.
    #[error("{0}")]
    Config(String),
    /// Reading or writing a local file or directory failed.
    #[error("{doing}")]
    Local {
        /// What was being done, naming the path.
        doing: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

fn fenced_reason(generation: u64, newest: Option<u64>) -> String {
    let mut s = String::new();
    match newest {
        Some(n) if n > generation => {
            let _ = write!(s, "generation {n} has claimed the task since");
        }
        Some(n) => {
            let _ = write!(
                s,
                "generation {generation} was never claimed (the newest claim is {n})"
            );
        }
        None => s.push_str("no generation was ever claimed"),
    }
    s
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
