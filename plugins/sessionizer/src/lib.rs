//! Event-time sessions per user, closed by event-time timers.
//!
//! Grouped by `user`; input rows are `{"user": string, "ts": long}` with `ts` the event time in
//! epoch milliseconds, which is also the query's event-time column. The query runs in time mode
//! `event-time`; rows at or before the watermark are dropped by the host as late.
//!
//! Two events belong to the same session when they are less than [`GAP_MS`] apart (Spark's
//! `session_window` rule: every event opens a window `[ts, ts + gap)`, overlapping windows
//! merge). A session is final once the watermark reaches `session_end + GAP_MS`: any later
//! event that is not late has `ts > watermark`, too far away to join it. So each open session
//! has one event-time timer at `session_end + GAP_MS`; when it fires the processor emits
//! `{"user", "session_start", "session_end", "events"}` (`session_end` is the time of the
//! session's last event) and forgets the session.
//!
//! Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `sessions` | list | `start long, end long, events long` | the open sessions, ascending by start |
//!
//! Usually a user has one open session; events arriving out of order (within the watermark
//! delay) may open an earlier one, and an event between two sessions merges them.
//!
//! The processor declares no output event-time column: when a session's timer fires, the
//! watermark is at or past `session_end + GAP_MS`, so neither `session_end` nor the timer's
//! time is guaranteed to be at or after the watermark, and the host fails a batch that emits a
//! row older than the watermark in the declared column.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The inactivity gap that ends a session, in milliseconds.
pub const GAP_MS: i64 = 30_000;

/// One input event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// Event time, epoch milliseconds.
    pub ts: i64,
}

/// An open session, as stored in `sessions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Time of the first event.
    pub start: i64,
    /// Time of the last event.
    pub end: i64,
    /// Events in the session.
    pub events: i64,
}

impl Session {
    /// When the session is final: its timer's time.
    pub fn closes_at(&self) -> i64 {
        self.end + GAP_MS
    }

    /// Whether an event at `ts` joins the session.
    fn takes(&self, ts: i64) -> bool {
        ts > self.start - GAP_MS && ts < self.end + GAP_MS
    }
}

/// The row emitted per closed session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedSession {
    /// The user (the grouping key's only column, as a string).
    pub user: String,
    /// Time of the session's first event.
    pub session_start: i64,
    /// Time of the session's last event.
    pub session_end: i64,
    /// Events in the session.
    pub events: i64,
}

/// The sessionizer. See the [crate docs](crate).
pub struct Sessionizer {
    sessions: ListState<Session>,
    timers: Timers,
}

fn user(key: &Key) -> Result<String> {
    if let Some(name) = key.as_str() {
        return Ok(name.to_owned());
    }
    match key.raw_columns()?.as_slice() {
        [column] => Ok((*column).to_owned()),
        _ => Ok(key.json().to_owned()),
    }
}

/// Adds an event to the open sessions (ascending by start, disjoint), merging every session
/// it joins. Returns the sessions whose timers must be deleted, and the merged session.
fn add_event(sessions: &mut Vec<Session>, ts: i64) -> (Vec<Session>, Session) {
    let (joined, mut kept): (Vec<Session>, Vec<Session>) =
        sessions.drain(..).partition(|s| s.takes(ts));
    let merged = joined.iter().fold(
        Session {
            start: ts,
            end: ts,
            events: 1,
        },
        |acc, s| Session {
            start: acc.start.min(s.start),
            end: acc.end.max(s.end),
            events: acc.events + s.events,
        },
    );
    kept.push(merged);
    kept.sort_by_key(|s| s.start);
    *sessions = kept;
    (joined, merged)
}

impl Sessionizer {
    fn store(&self, sessions: &[Session]) -> Result<()> {
        if sessions.is_empty() {
            self.sessions.clear()
        } else {
            self.sessions.put(sessions)
        }
    }
}

impl StatefulProcessor for Sessionizer {
    type Input = Event;
    type Output = ClosedSession;
    type InitialState = NoInitialState;

    const NAME: &'static str = "sessionizer";
    const OUTPUT_SCHEMA: &'static str =
        "user string, session_start long, session_end long, events long";
    const INPUT_SCHEMA: Option<&'static str> = Some("user string, ts long");

    fn init(handle: &mut Handle) -> Result<Self> {
        if handle.time_mode() != TimeMode::EventTime {
            statebox_sdk::bail!(
                "sessionizer closes sessions in event time: run it with time mode event-time and event-time column `ts`"
            );
        }
        Ok(Sessionizer {
            sessions: handle.list_state("sessions", "start long, end long, events long")?,
            timers: handle.timers(),
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        mut rows: Vec<Event>,
        _timer_values: TimerValues,
        _out: &mut Emitter<ClosedSession>,
    ) -> Result<()> {
        rows.sort_by_key(|e| e.ts);
        let mut sessions = self.sessions.get()?.collect::<Result<Vec<_>>>()?;
        for event in rows {
            let (replaced, merged) = add_event(&mut sessions, event.ts);
            for old in replaced {
                if old.closes_at() != merged.closes_at() {
                    self.timers.delete(old.closes_at())?;
                }
            }
            self.timers.register(merged.closes_at())?;
        }
        self.store(&sessions)
    }

    fn handle_expired_timer(
        &mut self,
        key: &Key,
        _timer_values: TimerValues,
        info: ExpiredTimerInfo,
        out: &mut Emitter<ClosedSession>,
    ) -> Result<()> {
        let sessions = self.sessions.get()?.collect::<Result<Vec<_>>>()?;
        let (closed, open): (Vec<Session>, Vec<Session>) = sessions
            .into_iter()
            .partition(|s| s.closes_at() <= info.expiry_time_ms());
        for session in closed {
            if session.closes_at() != info.expiry_time_ms() {
                self.timers.delete(session.closes_at())?;
            }
            out.emit(ClosedSession {
                user: user(key)?,
                session_start: session.start,
                session_end: session.end,
                events: session.events,
            })?;
        }
        self.store(&open)
    }
}

statebox_sdk::export_processor!(Sessionizer);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn harness() -> TestHarness<Sessionizer> {
        TestHarness::new(TimeMode::EventTime).unwrap()
    }

    fn events(h: &mut TestHarness<Sessionizer>, user: &str, ts: &[i64]) {
        let rows = ts.iter().map(|&ts| Event { ts });
        assert_eq!(h.handle_input_rows(user, rows).unwrap(), vec![]);
    }

    fn closed(user: &str, start: i64, end: i64, events: i64) -> ClosedSession {
        ClosedSession {
            user: user.to_owned(),
            session_start: start,
            session_end: end,
            events,
        }
    }

    #[test]
    fn events_within_the_gap_form_one_session() {
        let mut h = harness();
        events(&mut h, "u1", &[1_000, 20_000]);
        events(&mut h, "u1", &[45_000]);
        assert_eq!(h.timers("u1"), vec![45_000 + GAP_MS]);
        h.set_watermark(45_000 + GAP_MS - 1);
        assert_eq!(h.fire_expired_timers().unwrap(), vec![]);
        h.set_watermark(45_000 + GAP_MS);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![closed("u1", 1_000, 45_000, 3)]
        );
        assert_eq!(h.list_state::<Session>("sessions", "u1"), vec![]);
        assert_eq!(h.timers("u1"), Vec::<i64>::new());
    }

    #[test]
    fn a_gap_splits_sessions() {
        let mut h = harness();
        events(&mut h, "u1", &[1_000, 1_000 + GAP_MS, 2_000 + GAP_MS]);
        assert_eq!(
            h.list_state::<Session>("sessions", "u1"),
            vec![
                Session {
                    start: 1_000,
                    end: 1_000,
                    events: 1
                },
                Session {
                    start: 1_000 + GAP_MS,
                    end: 2_000 + GAP_MS,
                    events: 2
                },
            ]
        );
        h.set_watermark(100_000);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![
                closed("u1", 1_000, 1_000, 1),
                closed("u1", 1_000 + GAP_MS, 2_000 + GAP_MS, 2)
            ]
        );
    }

    #[test]
    fn out_of_order_events_open_an_earlier_session_or_bridge_two() {
        let mut h = harness();
        events(&mut h, "u1", &[100_000]);
        events(&mut h, "u1", &[10_000]);
        assert_eq!(h.timers("u1"), vec![10_000 + GAP_MS, 100_000 + GAP_MS]);
        events(&mut h, "u1", &[35_000, 60_000, 85_000]);
        assert_eq!(h.timers("u1"), vec![100_000 + GAP_MS]);
        h.set_watermark(100_000 + GAP_MS);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![closed("u1", 10_000, 100_000, 5)]
        );
    }

    #[test]
    fn users_are_independent() {
        let mut h = harness();
        events(&mut h, "u1", &[1_000]);
        events(&mut h, "u2", &[5_000]);
        h.set_watermark(1_000 + GAP_MS);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![closed("u1", 1_000, 1_000, 1)]
        );
        h.set_watermark(5_000 + GAP_MS);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![closed("u2", 5_000, 5_000, 1)]
        );
    }

    #[test]
    fn sessions_survive_a_restart() {
        let mut h = harness();
        events(&mut h, "u1", &[1_000]);
        h.restart().unwrap();
        events(&mut h, "u1", &[2_000]);
        h.set_watermark(2_000 + GAP_MS);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![closed("u1", 1_000, 2_000, 2)]
        );
    }

    #[test]
    fn refuses_other_time_modes() {
        for mode in [TimeMode::None, TimeMode::ProcessingTime] {
            let err = TestHarness::<Sessionizer>::new(mode).err().unwrap();
            assert!(err.to_string().contains("event-time"), "{err}");
        }
    }
}
