//! Drops duplicate events: emits an event id the first time it is seen within a TTL window.
//!
//! Input rows are `{"id": string, ...}` (further fields are ignored). The query is usually
//! grouped by `id`, but any grouping works (e.g. by tenant): the processor keeps, per grouping
//! key, a map from event id to the batch time it was first seen, with a TTL of [`WINDOW_MS`] per
//! entry:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `seen` | map, TTL [`WINDOW_MS`] | key `string`, value `long` | event id → batch time of its first sighting |
//!
//! An id without a live entry is emitted as `{"id", "first_seen"}` (`first_seen` = the batch
//! time) and recorded; an id with a live entry is a duplicate and dropped. Duplicates do not
//! extend the window: the entry expires `WINDOW_MS` after the first sighting, and the next
//! sighting after that is emitted again (like Spark's `dropDuplicatesWithinWatermark`, the
//! window runs from the first event).
//!
//! Runs in time mode `processing-time` (the window is measured against batch timestamps) or
//! `event-time` (measured against the watermark, Statebox's event-time TTL extension). TTL
//! needs a time: in time mode `none` the host refuses the TTL'd variable.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;
use std::time::Duration;

/// How long an id is remembered after its first sighting, in milliseconds.
pub const WINDOW_MS: u64 = 60_000;

/// One input event.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// The event id.
    pub id: String,
}

/// The row emitted for the first sighting of an id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstSeen {
    /// The event id.
    pub id: String,
    /// The batch time (the watermark in event-time mode) of the sighting.
    pub first_seen: i64,
}

/// The deduplicator. See the [crate docs](crate).
pub struct DedupTtl {
    seen: MapState<String, i64>,
}

impl StatefulProcessor for DedupTtl {
    type Input = Event;
    type Output = FirstSeen;
    type InitialState = NoInitialState;

    const NAME: &'static str = "dedup-ttl";
    const OUTPUT_SCHEMA: &'static str = "id string, first_seen long";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(DedupTtl {
            seen: handle.map_state_with_ttl(
                "seen",
                "string",
                "long",
                Duration::from_millis(WINDOW_MS),
            )?,
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Event>,
        timer_values: TimerValues,
        out: &mut Emitter<FirstSeen>,
    ) -> Result<()> {
        let now = match timer_values.watermark_ms() {
            Some(watermark) => watermark,
            None => timer_values.current_processing_time_ms(),
        };
        for event in rows {
            if self.seen.contains_key(event.id.as_str())? {
                continue;
            }
            self.seen.update_value(event.id.as_str(), &now)?;
            out.emit(FirstSeen {
                id: event.id,
                first_seen: now,
            })?;
        }
        Ok(())
    }
}

statebox_sdk::export_processor!(DedupTtl);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn harness() -> TestHarness<DedupTtl> {
        TestHarness::new(TimeMode::ProcessingTime).unwrap()
    }

    fn ids(ids: &[&str]) -> Vec<Event> {
        ids.iter()
            .map(|id| Event {
                id: (*id).to_owned(),
            })
            .collect()
    }

    fn first(id: &str, at: i64) -> FirstSeen {
        FirstSeen {
            id: id.to_owned(),
            first_seen: at,
        }
    }

    #[test]
    fn duplicates_within_one_batch_are_dropped() {
        let mut h = harness();
        h.set_processing_time(1_000);
        assert_eq!(
            h.handle_input_rows("e1", ids(&["e1", "e1", "e1"])).unwrap(),
            vec![first("e1", 1_000)]
        );
    }

    #[test]
    fn duplicates_within_the_window_are_dropped_and_do_not_extend_it() {
        let mut h = harness();
        h.set_processing_time(1_000);
        h.handle_input_rows("e1", ids(&["e1"])).unwrap();
        h.set_processing_time(1_000 + WINDOW_MS as i64 - 1);
        assert_eq!(h.handle_input_rows("e1", ids(&["e1"])).unwrap(), vec![]);
        h.set_processing_time(1_000 + WINDOW_MS as i64);
        assert_eq!(
            h.handle_input_rows("e1", ids(&["e1"])).unwrap(),
            vec![first("e1", 1_000 + WINDOW_MS as i64)]
        );
    }

    #[test]
    fn ids_are_independent_under_any_grouping() {
        let mut h = harness();
        h.set_processing_time(1_000);
        assert_eq!(
            h.handle_input_rows("tenant", ids(&["a", "b", "a"]))
                .unwrap(),
            vec![first("a", 1_000), first("b", 1_000)]
        );
        h.set_processing_time(2_000);
        assert_eq!(
            h.handle_input_rows("tenant", ids(&["b", "c"])).unwrap(),
            vec![first("c", 2_000)]
        );
        assert_eq!(
            h.handle_input_rows("other", ids(&["a"])).unwrap(),
            vec![first("a", 2_000)]
        );
    }

    #[test]
    fn event_time_windows_follow_the_watermark() {
        let mut h = TestHarness::<DedupTtl>::new(TimeMode::EventTime).unwrap();
        h.set_processing_time(999_999);
        h.set_watermark(5_000);
        assert_eq!(
            h.handle_input_rows("e1", ids(&["e1"])).unwrap(),
            vec![first("e1", 5_000)]
        );
        h.set_watermark(5_000 + WINDOW_MS as i64);
        assert_eq!(
            h.handle_input_rows("e1", ids(&["e1"])).unwrap(),
            vec![first("e1", 5_000 + WINDOW_MS as i64)]
        );
    }

    #[test]
    fn ttl_needs_a_time_mode() {
        assert!(TestHarness::<DedupTtl>::new(TimeMode::None).is_err());
    }
}
