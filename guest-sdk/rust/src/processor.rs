//! The processor trait.

use serde::de::{self, DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};

use crate::{Emitter, ExpiredTimerInfo, Handle, Key, Result, TimerValues};

/// A stateful stream processor. Mirrors Spark's `StatefulProcessor`.
///
/// Only [`init`](Self::init) and [`handle_input_rows`](Self::handle_input_rows) are required;
/// the other hooks do nothing by default.
///
/// Within one batch the host calls [`handle_initial_state`](Self::handle_initial_state)
/// (first batch of a new query only), then `handle_input_rows` once per key with input, then
/// [`handle_expired_timer`](Self::handle_expired_timer) per expired timer in ascending
/// timestamp order. State handles act on the key of the call in progress.
pub trait StatefulProcessor: Sized + 'static {
    /// One input row, decoded from its JSON object. Use `serde::de::IgnoredAny` to accept any
    /// row without decoding it.
    type Input: DeserializeOwned;
    /// One output row, encoded as a JSON object matching [`OUTPUT_SCHEMA`](Self::OUTPUT_SCHEMA).
    type Output: Serialize;
    /// One initial-state row; [`NoInitialState`] if the processor takes none.
    type InitialState: DeserializeOwned;

    /// A short name for logs and errors, e.g. `"counter"`.
    const NAME: &'static str;
    /// The schema of every output row, in Spark DDL, e.g. `"user string, count long"`.
    const OUTPUT_SCHEMA: &'static str;
    /// The schema input rows must match, if the host should check it before calling the
    /// processor (rows that do not match fail the batch naming the input file and line).
    const INPUT_SCHEMA: Option<&'static str> = None;
    /// The output column holding each row's event time (event-time mode only). The host
    /// rejects rows older than the watermark.
    const OUTPUT_EVENT_TIME_COLUMN: Option<&'static str> = None;
    /// Whether value updates, list appends (`append_value`), map updates and timer
    /// registrations and deletions are held back and sent to the host together: one
    /// crossing into the host for many writes instead of one each, when the host calls the
    /// processor for many keys at once (input rows and expired timers). Held writes go when
    /// the host's call ends, when many are held, and before any other operation on a
    /// variable the key wrote (or a listing of its timers), so reads always see earlier
    /// writes. The host checks every write as before, but when it arrives: a write it
    /// rejects (a value that does not fit the schema, the state-size limit) fails the batch
    /// naming the key it was made for, although the update itself returned `Ok`. Leave it
    /// off if the processor handles those errors of these operations itself. (Timers are
    /// not held in time mode `None`, so their error there comes back at once.)
    const HOLD_WRITES: bool = false;

    /// Declares the processor's state variables through `handle` and returns the processor
    /// holding them. Called once per instance, before any other method. State cannot be read
    /// or written here.
    fn init(handle: &mut Handle) -> Result<Self>;

    /// Handles all rows of one key in one batch, in arrival order.
    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Self::Input>,
        timer_values: TimerValues,
        out: &mut Emitter<Self::Output>,
    ) -> Result<()>;

    /// Handles one expired timer of `key`. The timer is deleted after this returns; it still
    /// shows in `Timers::list` while this runs.
    fn handle_expired_timer(
        &mut self,
        key: &Key,
        timer_values: TimerValues,
        info: ExpiredTimerInfo,
        out: &mut Emitter<Self::Output>,
    ) -> Result<()> {
        let _ = (key, timer_values, info, out);
        Ok(())
    }

    /// Applies one initial-state row of `key`, in the first batch of a new query only.
    fn handle_initial_state(
        &mut self,
        key: &Key,
        row: Self::InitialState,
        timer_values: TimerValues,
    ) -> Result<()> {
        let _ = (key, row, timer_values);
        Ok(())
    }

    /// Releases resources when the instance is torn down. State cannot be touched here.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The [`StatefulProcessor::InitialState`] of a processor that takes no initial state. It has
/// no values: a query that supplies initial state to such a processor fails with a clear error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoInitialState {}

impl<'de> Deserialize<'de> for NoInitialState {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(de::Error::custom(
            "this processor does not accept initial state",
        ))
    }
}
