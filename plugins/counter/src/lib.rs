//! Counts rows per grouping key: Spark's `SimpleCounterProcessor` example, in Rust.
//!
//! Input rows may be any JSON objects; the processor only counts them. Per key it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `count` | value | `long` | rows seen for the key, over all batches |
//! | `batchCounts` | list | `long` | rows of each call, one element appended per call |
//! | `stats` | map | key `name string`, value `count long` | `{"name":"calls"}` → calls made for the key |
//!
//! and emits one row per call, `{"key": ..., "count": <rows of the key in this call>}`.
//!
//! The work per call is constant (one value read and write, one list append, one map read and
//! write), whatever the number of rows, because the processor also serves as the benchmark
//! workload.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The row emitted per call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCount {
    /// The first key column as a string (its JSON text unless it is a string), or the key's
    /// JSON array text if the key has several columns.
    pub key: String,
    /// Rows of this key in this call.
    pub count: i64,
}

/// A user key of the `stats` map; schema `name string`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatName {
    /// Which statistic.
    pub name: Cow<'static, str>,
}

/// A value of the `stats` map; schema `count long`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatCount {
    /// The statistic's value.
    pub count: i64,
}

/// The `stats` entry counting calls, built once instead of per call.
pub const CALLS: StatName = StatName {
    name: Cow::Borrowed("calls"),
};

/// The counter processor. See the [crate docs](crate).
pub struct Counter {
    count: ValueState<i64>,
    batch_counts: ListState<i64>,
    stats: MapState<StatName, StatCount>,
}

/// The label of a key in the output: a single string column as is, any other single column as
/// its JSON text, several columns as the key's JSON array text.
fn key_label(key: &Key) -> Result<String> {
    if let Some(column) = key.as_str() {
        return Ok(column.to_owned());
    }
    match key.raw_columns()?.as_slice() {
        [column] => Ok((*column).to_owned()),
        _ => Ok(key.json().to_owned()),
    }
}

impl StatefulProcessor for Counter {
    type Input = IgnoredAny;
    type Output = KeyCount;
    type InitialState = NoInitialState;

    const NAME: &'static str = "counter";
    const OUTPUT_SCHEMA: &'static str = "key string, count long";
    // Its writes cannot fail, and the host takes them three to a key: sent together.
    const HOLD_WRITES: bool = true;

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(Counter {
            count: handle.value_state("count", "long")?,
            batch_counts: handle.list_state("batchCounts", "long")?,
            stats: handle.map_state("stats", "name string", "count long")?,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<IgnoredAny>,
        _timer_values: TimerValues,
        out: &mut Emitter<KeyCount>,
    ) -> Result<()> {
        let batch = i64::try_from(rows.len())?;
        let total = self.count.get()?.unwrap_or(0) + batch;
        self.count.update(&total)?;
        self.batch_counts.append_value(&batch)?;
        let calls = self.stats.get_value(&CALLS)?.map_or(0, |stat| stat.count) + 1;
        self.stats
            .update_value(&CALLS, &StatCount { count: calls })?;
        out.emit(KeyCount {
            key: key_label(key)?,
            count: batch,
        })
    }
}

statebox_sdk::export_processor!(Counter);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;
    use statebox_sdk::ErrorKind;

    fn rows(n: usize) -> Vec<IgnoredAny> {
        vec![IgnoredAny; n]
    }

    fn harness() -> TestHarness<Counter> {
        TestHarness::new(TimeMode::None).unwrap()
    }

    fn out(key: &str, count: i64) -> Vec<KeyCount> {
        vec![KeyCount {
            key: key.to_owned(),
            count,
        }]
    }

    #[test]
    fn counts_rows_of_one_batch() {
        let mut h = harness();
        assert_eq!(h.handle_input_rows("u1", rows(3)).unwrap(), out("u1", 3));
        assert_eq!(h.value_state::<i64>("count", "u1"), Some(3));
        assert_eq!(h.list_state::<i64>("batchCounts", "u1"), vec![3]);
        assert_eq!(
            h.map_state::<StatName, StatCount>("stats", "u1"),
            vec![(CALLS, StatCount { count: 1 })]
        );
    }

    #[test]
    fn accumulates_over_batches() {
        let mut h = harness();
        h.handle_input_rows("u1", rows(3)).unwrap();
        assert_eq!(h.handle_input_rows("u1", rows(2)).unwrap(), out("u1", 2));
        h.handle_input_rows("u1", rows(5)).unwrap();
        assert_eq!(h.value_state::<i64>("count", "u1"), Some(10));
        assert_eq!(h.list_state::<i64>("batchCounts", "u1"), vec![3, 2, 5]);
        assert_eq!(
            h.map_state::<StatName, StatCount>("stats", "u1")[0].1.count,
            3
        );
    }

    #[test]
    fn keys_are_isolated() {
        let mut h = harness();
        h.handle_input_rows("u1", rows(3)).unwrap();
        h.handle_input_rows("u2", rows(1)).unwrap();
        h.handle_input_rows("u1", rows(1)).unwrap();
        assert_eq!(h.value_state::<i64>("count", "u1"), Some(4));
        assert_eq!(h.value_state::<i64>("count", "u2"), Some(1));
        assert_eq!(h.list_state::<i64>("batchCounts", "u2"), vec![1]);
        assert_eq!(h.value_state::<i64>("count", "u3"), None);
    }

    #[test]
    fn labels_keys_of_any_shape() {
        let mut h = harness();
        assert_eq!(h.handle_input_rows(7, rows(1)).unwrap(), out("7", 1));
        assert_eq!(
            h.handle_input_rows(("u1", 7), rows(2)).unwrap(),
            out(r#"["u1",7]"#, 2)
        );
        assert_eq!(h.value_state::<i64>("count", ("u1", 7)), Some(2));
    }

    #[test]
    fn accepts_any_json_object() {
        let mut h = harness();
        let emitted = h
            .handle_input_json(
                "u1",
                &[r#"{"a":1,"b":[true,null]}"#, r#"{"user":"u1"}"#, "{}"],
            )
            .unwrap();
        assert_eq!(emitted, out("u1", 3));
        let err = h.handle_input_json("u1", &["{}", "{not json"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
    }

    #[test]
    fn state_survives_a_restart() {
        let mut h = harness();
        h.handle_input_rows("u1", rows(2)).unwrap();
        h.restart().unwrap();
        h.handle_input_rows("u1", rows(2)).unwrap();
        assert_eq!(h.value_state::<i64>("count", "u1"), Some(4));
    }
}
