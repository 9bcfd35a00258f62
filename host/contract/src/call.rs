//! What a processor call is and how it fails: the errors say whose fault it is.

use std::fmt;

use statebox_state::StoreError;

/// Which export of the processor was being called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Function {
    /// `init`.
    Init,
    /// `handle-input-rows`.
    HandleInputRows,
    /// `handle-expired-timer`.
    HandleExpiredTimer,
    /// `handle-initial-state`.
    HandleInitialState,
    /// `close`.
    Close,
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Function::Init => "init",
            Function::HandleInputRows => "handle-input-rows",
            Function::HandleExpiredTimer => "handle-expired-timer",
            Function::HandleInitialState => "handle-initial-state",
            Function::Close => "close",
        })
    }
}

/// Why a processor call failed. Everything but [`CallErrorKind::Internal`] is the
/// processor's (tenant's) fault; the batch fails and commits nothing either way.
#[derive(Debug, thiserror::Error)]
#[error("processor `{processor}` failed in {function}{}: {kind}", key.as_ref().map(|k| format!(" for key {k}")).unwrap_or_default())]
pub struct CallError {
    /// The processor's name.
    pub processor: String,
    /// The export being called.
    pub function: Function,
    /// The grouping key of the call (JSON), if the call had one.
    pub key: Option<String>,
    /// What went wrong.
    pub kind: CallErrorKind,
}

/// The cause of a [`CallError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// The guest trapped or hit a sandbox limit (CPU deadline, memory). The instance is
    /// poisoned and must be replaced.
    #[error("trapped: {0}")]
    Trap(String),
    /// The guest returned an error.
    #[error("{0}")]
    Failed(String),
    /// The guest rejected input row `index` of the call.
    #[error("input row {index} rejected: {message}")]
    BadInputRow {
        /// Index within the rows passed to the call.
        index: u32,
        /// The guest's message.
        message: String,
    },
    /// The guest emitted a row that does not match its output schema, or too much output.
    #[error("bad output: {0}")]
    BadOutput(String),
    /// The host's state store failed; not the processor's fault.
    #[error("internal state store error: {0}")]
    Internal(#[from] StoreError),
}

impl CallError {
    /// Whether the instance can no longer be used (it trapped).
    pub fn poisons_instance(&self) -> bool {
        matches!(
            self.kind,
            CallErrorKind::Trap(_) | CallErrorKind::Internal(_)
        )
    }
}

/// The rows of one key, as passed to [`PartitionProcessor::handle_input_batch`](crate::PartitionProcessor::handle_input_batch).
#[derive(Clone, Copy, Debug)]
pub struct KeyRows<'a> {
    /// The key, a JSON array of the key columns' values.
    pub key: &'a str,
    /// The key's rows in arrival order, each a JSON object.
    pub rows: &'a [&'a str],
}

/// A failed call over several keys, and the entry it is attributed to (`None` when the
/// failure belongs to no single entry).
#[derive(Debug)]
pub struct BatchFailure {
    /// Index of the entry whose handler failed.
    pub entry: Option<usize>,
    /// The failure.
    pub error: CallError,
}

impl From<CallError> for BatchFailure {
    fn from(error: CallError) -> BatchFailure {
        BatchFailure { entry: None, error }
    }
}

/// One call per entry, stopping at the first failure: the batched methods' fallback for
/// components without the `batch-processor` export.
pub fn each_entry<E>(
    entries: &[E],
    mut call: impl FnMut(&E) -> Result<Vec<String>, CallError>,
) -> Result<Vec<Vec<String>>, BatchFailure> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            call(e).map_err(|error| BatchFailure {
                entry: Some(i),
                error,
            })
        })
        .collect()
}
