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
    /// Registers a timer at `expiry_ms` for the selected key, or for `entry`'s key (a held
    /// write, see `keys.rs`).
    pub(super) fn timer_register(
        &mut self,
        expiry_ms: i64,
        entry: Option<u32>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.state.timers_allowed("register-timer") {
            return Ok(Err(e));
        }
        op!(self, "register-timer", entry, |txn, key| txn
            .timer_register(key, expiry_ms));
        Ok(Ok(()))
    }

    /// Deletes the timer at `expiry_ms` of the selected key, or of `entry`'s key.
    pub(super) fn timer_delete(
        &mut self,
        expiry_ms: i64,
        entry: Option<u32>,
    ) -> wasmtime::Result<Result<(), StateError>> {
        if let Err(e) = self.state.timers_allowed("delete-timer") {
            return Ok(Err(e));
        }
        op!(self, "delete-timer", entry, |txn, key| txn
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

#[cfg(test)]
mod tests {
    use super::MAX_LIST_TIMERS;
    use crate::TimeMode;
    use crate::bindings::statebox::processor::handle::Host as _;
    use crate::bindings::statebox::processor::state::HostValueState;
    use crate::bindings::statebox::processor::types::ErrorKind;
    use crate::host::tests::{KEY, OTHER, TIMES, again, declare, host, kind, lend, take_back};

    #[test]
    fn timers_register_list_delete() {
        let mut h = host(TimeMode::ProcessingTime);
        let _d = declare(&mut h);
        let _cp = lend(&mut h);
        h.begin_call(KEY);
        let mut v = h.view();
        v.register_timer(30).unwrap().unwrap();
        v.register_timer(20).unwrap().unwrap();
        v.register_timer(30).unwrap().unwrap();
        assert_eq!(v.list_timers().unwrap().unwrap(), [20, 30]);
        v.delete_timer(30).unwrap().unwrap();
        v.delete_timer(99).unwrap().unwrap();
        assert_eq!(v.list_timers().unwrap().unwrap(), [20]);
        h.end_call();
        // Timers are the key's own.
        h.begin_call(OTHER);
        assert!(h.view().list_timers().unwrap().unwrap().is_empty());
    }

    #[test]
    fn list_timers_refuses_a_key_with_too_many() {
        let mut h = host(TimeMode::EventTime);
        let _d = declare(&mut h);
        let _cp = lend(&mut h);
        h.begin_call(KEY);
        let mut v = h.view();
        for ts in 0..MAX_LIST_TIMERS as i64 {
            v.register_timer(ts).unwrap().unwrap();
        }
        assert_eq!(v.list_timers().unwrap().unwrap().len(), MAX_LIST_TIMERS);
        v.register_timer(-1).unwrap().unwrap();
        let (k, m) = kind(v.list_timers().unwrap());
        assert_eq!(k, ErrorKind::LimitExceeded, "{m}");
        assert!(m.contains(&MAX_LIST_TIMERS.to_string()), "{m}");
    }

    #[test]
    fn timers_need_a_time_mode() {
        let mut h = host(TimeMode::None);
        let _d = declare(&mut h);
        let _cp = lend(&mut h);
        h.begin_call(KEY);
        let mut v = h.view();
        let (k, m) = kind(v.register_timer(1).unwrap());
        assert_eq!(k, ErrorKind::UnsupportedInTimeMode);
        assert!(m.starts_with("register-timer"), "{m}");
        assert_eq!(
            kind(v.list_timers().unwrap()).0,
            ErrorKind::UnsupportedInTimeMode
        );
        assert_eq!(
            kind(v.delete_timer(1).unwrap()).0,
            ErrorKind::UnsupportedInTimeMode
        );
    }

    /// The TTL of a value written now counts from the one timer and TTL clock: the batch
    /// timestamp in processing time, the watermark in event time.
    #[test]
    fn ttl_expiry_follows_the_timer_clock() {
        for (mode, now) in [
            (TimeMode::ProcessingTime, TIMES.batch_timestamp_ms),
            (TimeMode::EventTime, TIMES.watermark_ms),
        ] {
            let mut h = host(mode);
            h.begin_init();
            let ttl = h
                .view()
                .get_value_state("ttl".into(), "long".into(), Some(500))
                .unwrap()
                .unwrap();
            h.end_call();
            let _cp = lend(&mut h);
            h.begin_call(KEY);
            h.view().update(again(&ttl), "1".into()).unwrap().unwrap();
            let tv = h.timer_values();
            let txn = take_back(&mut h);
            let id = h.view().sandbox.table.get(&ttl).unwrap().0.id;
            let stored = txn.value_get(id, KEY.as_bytes()).unwrap().unwrap();
            assert_eq!(stored.expires_at_ms, Some(now + 500), "{mode}");
            assert_eq!(tv.current_processing_time_ms, TIMES.batch_timestamp_ms);
            let watermark = if mode == TimeMode::EventTime {
                TIMES.watermark_ms
            } else {
                -1
            };
            assert_eq!(tv.current_watermark_ms, watermark);
        }
    }
}
