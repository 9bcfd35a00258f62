//! Tracks each user's sessions: how many distinct sessions and how many events a user has had.
//!
//! Grouped by `user_id`; input rows are `{"user_id": string, "session_id": string, ...}`
//! (further fields are ignored). Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `sessions` | map | key `string`, value `long` | session id → events of that session |
//! | `totals` | value | `distinct_sessions long, total_events long` | the map's size and sum |
//!
//! and emits one row per call with the user's totals over all batches so far:
//! `{"user_id", "distinct_sessions", "total_events"}`.
//!
//! `totals` duplicates what the map holds so that a call costs one map read and write per
//! session in the batch, instead of a walk over every session the user ever had.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// One input event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// The user, also the grouping key.
    pub user_id: String,
    /// The session the event belongs to.
    pub session_id: String,
}

/// The row emitted per call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The user.
    pub user_id: String,
    /// Sessions seen for the user, over all batches.
    pub distinct_sessions: i64,
    /// Events seen for the user, over all batches.
    pub total_events: i64,
}

/// The `totals` value state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Entries of the `sessions` map.
    pub distinct_sessions: i64,
    /// Sum of the `sessions` map's values.
    pub total_events: i64,
}

/// The session tracker processor. See the [crate docs](crate).
pub struct SessionTracker {
    sessions: MapState<String, i64>,
    totals: ValueState<Totals>,
}

impl StatefulProcessor for SessionTracker {
    type Input = Event;
    type Output = SessionSummary;
    type InitialState = NoInitialState;

    const NAME: &'static str = "session-tracker";
    const OUTPUT_SCHEMA: &'static str = "user_id string, distinct_sessions long, total_events long";
    const INPUT_SCHEMA: Option<&'static str> = Some("user_id string, session_id string");

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(SessionTracker {
            sessions: handle.map_state("sessions", "string", "long")?,
            totals: handle.value_state("totals", "distinct_sessions long, total_events long")?,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Event>,
        _timer_values: TimerValues,
        out: &mut Emitter<SessionSummary>,
    ) -> Result<()> {
        // Count the batch per session first, so that each session costs one state read and one
        // write however many events it has.
        let mut batch: BTreeMap<String, i64> = BTreeMap::new();
        for event in rows {
            *batch.entry(event.session_id).or_default() += 1;
        }
        let mut totals = self.totals.get()?.unwrap_or_default();
        for (session, events) in &batch {
            let before = self.sessions.get_value(session.as_str())?;
            if before.is_none() {
                totals.distinct_sessions += 1;
            }
            self.sessions
                .update_value(session.as_str(), &(before.unwrap_or(0) + events))?;
            totals.total_events += events;
        }
        self.totals.update(&totals)?;
        let user_id = match key.as_str() {
            Some(user_id) => user_id.to_owned(),
            None => key.get(0)?,
        };
        out.emit(SessionSummary {
            user_id,
            distinct_sessions: totals.distinct_sessions,
            total_events: totals.total_events,
        })
    }
}

statebox_sdk::export_processor!(SessionTracker);

#[cfg(test)]
mod tests {
    use statebox_sdk::ErrorKind;
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn events(user: &str, sessions: &[&str]) -> Vec<Event> {
        sessions
            .iter()
            .map(|s| Event {
                user_id: user.to_owned(),
                session_id: (*s).to_owned(),
            })
            .collect()
    }

    fn summary(user: &str, distinct_sessions: i64, total_events: i64) -> Vec<SessionSummary> {
        vec![SessionSummary {
            user_id: user.to_owned(),
            distinct_sessions,
            total_events,
        }]
    }

    fn harness() -> TestHarness<SessionTracker> {
        TestHarness::new(TimeMode::None).unwrap()
    }

    #[test]
    fn counts_sessions_and_events_of_one_batch() {
        let mut h = harness();
        let out = h
            .handle_input_rows("u1", events("u1", &["s1", "s2", "s1"]))
            .unwrap();
        assert_eq!(out, summary("u1", 2, 3));
        assert_eq!(
            h.map_state::<String, i64>("sessions", "u1"),
            vec![("s1".to_owned(), 2), ("s2".to_owned(), 1)]
        );
    }

    #[test]
    fn totals_cover_all_batches() {
        let mut h = harness();
        h.handle_input_rows("u1", events("u1", &["s1", "s2"]))
            .unwrap();
        let out = h
            .handle_input_rows("u1", events("u1", &["s2", "s3", "s3"]))
            .unwrap();
        assert_eq!(out, summary("u1", 3, 5));
        assert_eq!(
            h.map_state::<String, i64>("sessions", "u1"),
            vec![
                ("s1".to_owned(), 1),
                ("s2".to_owned(), 2),
                ("s3".to_owned(), 2)
            ]
        );
        assert_eq!(
            h.value_state::<Totals>("totals", "u1"),
            Some(Totals {
                distinct_sessions: 3,
                total_events: 5
            })
        );
    }

    #[test]
    fn users_are_isolated() {
        let mut h = harness();
        h.handle_input_rows("u1", events("u1", &["s1", "s2"]))
            .unwrap();
        // u2 reuses a session id of u1; it is still u2's first session.
        let out = h.handle_input_rows("u2", events("u2", &["s1"])).unwrap();
        assert_eq!(out, summary("u2", 1, 1));
        let out = h.handle_input_rows("u1", events("u1", &["s1"])).unwrap();
        assert_eq!(out, summary("u1", 2, 3));
        assert_eq!(
            h.map_state::<String, i64>("sessions", "u2"),
            vec![("s1".to_owned(), 1)]
        );
    }

    #[test]
    fn decodes_json_rows_and_names_bad_ones() {
        let mut h = harness();
        let out = h
            .handle_input_json(
                "u1",
                &[
                    r#"{"user_id":"u1","session_id":"s1","page":"/home"}"#,
                    r#"{"user_id":"u1","session_id":"s1"}"#,
                ],
            )
            .unwrap();
        assert_eq!(out, summary("u1", 1, 2));
        let err = h
            .handle_input_json(
                "u1",
                &[
                    r#"{"user_id":"u1","session_id":"s1"}"#,
                    r#"{"user_id":"u1"}"#,
                ],
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
        assert!(err.message().contains("session_id"), "{err}");
    }

    #[test]
    fn describes_its_schemas() {
        assert_eq!(
            SessionTracker::INPUT_SCHEMA,
            Some("user_id string, session_id string")
        );
        assert_eq!(
            SessionTracker::OUTPUT_SCHEMA,
            "user_id string, distinct_sessions long, total_events long"
        );
    }
}
