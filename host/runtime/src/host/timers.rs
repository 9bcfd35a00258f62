//! Timers, and the one clock timers and TTL run against in the runtime: the contract's
//! [`TimeMode::clock`] over the batch's times (the batch timestamp, or the watermark in
//! event-time mode), the clock the engine fires timers and cleans up TTL with.

use statebox_state::catalog::VarHandle;

use super::HostView;
use super::state::{StateCtx, err};
use crate::TimeMode;
use crate::bindings::statebox::processor::types::{self, ErrorKind, StateError};

/// Most timers `list-timers` returns; a key with more gets `limit-exceeded`.
pub(crate) const MAX_LIST_TIMERS: usize = 100_000;

impl StateCtx {
    /// Now, for timers and TTL; `None` in time mode `none` or outside a batch.
    pub(super) fn timer_clock(&self) -> Option<i64> {
        let t = self.times?;
        self.config
            .time_mode
            .clock(t.batch_timestamp_ms, t.watermark_ms)
    }

    /// The times a handler is called with: the processing time (except in time mode
    /// `none`) and, in event-time mode, the watermark; -1 for what the mode does not have.
    pub(super) fn timer_values(&self) -> types::TimerValues {
        let (ts, wm) = match (self.config.time_mode, self.times) {
            (TimeMode::None, _) | (_, None) => (-1, -1),
            (TimeMode::ProcessingTime, Some(t)) => (t.batch_timestamp_ms, -1),
            (TimeMode::EventTime, Some(t)) => (t.batch_timestamp_ms, t.watermark_ms),
        };
        types::TimerValues {
            current_processing_time_ms: ts,
            current_watermark_ms: wm,
        }
    }

    /// When a value of `var` written now expires, if the variable has a TTL.
    pub(super) fn expiry(&self, var: &VarHandle) -> Option<i64> {
        let ttl = var.ttl_ms?;
        Some(self.timer_clock()?.saturating_add(ttl as i64))
    }

    fn timers_allowed(&self, what: &str) -> Result<(), StateError> {
        if self.config.time_mode == TimeMode::None {
            return Err(err(
                ErrorKind::UnsupportedInTimeMode,
                format!(
                    "{what}: timers are not allowed in time mode none; run the query with time mode processing-time or event-time"
                ),
            ));
        }
        Ok(())
    }
}

/// The timer functions of the `handle` interface (see `handle.rs`).
impl HostView<'_> {
    pub(super) fn register_timer(
        &mut self,
        expiry_ms: i64,
    ) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.state.timers_allowed("register-timer") {
            return Ok(Err(e));
        }
        op!(self, "register-timer", |txn, key| txn
            .timer_register(key, expiry_ms));
        Ok(Ok(()))
    }

    pub(super) fn delete_timer(
        &mut self,
        expiry_ms: i64,
    ) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.state.timers_allowed("delete-timer") {
            return Ok(Err(e));
        }
        op!(self, "delete-timer", |txn, key| txn
            .timer_delete(key, expiry_ms));
        Ok(Ok(()))
    }

    pub(super) fn list_timers(&mut self) -> wasmtime::Result<Result<Vec<i64>, StateError>> {
        if let Err(e) = self.state.timers_allowed("list-timers") {
            return Ok(Err(e));
        }
        let timers = op!(self, "list-timers", |txn, key| txn
            .timer_list_upto(key, MAX_LIST_TIMERS + 1));
        if timers.len() > MAX_LIST_TIMERS {
            return Ok(Err(err(
                ErrorKind::LimitExceeded,
                format!(
                    "the key has more than {MAX_LIST_TIMERS} timers, more than list-timers \
                     returns"
                ),
            )));
        }
        Ok(Ok(timers))
    }
}
