//! Test guest: `plugins/counter` redeployed with a reset. Its `init` calls
//! `delete-if-exists("count")` and declares `count` again (a new variable with the same name
//! and schema), so the first run on a counter checkpoint drops every key's count and counts
//! from zero. `batchCounts` is declared as the counter declares it; `stats` is not declared
//! (its data stays in the checkpoint).
//!
//! Emits `{"key", "count"}` with `count` the key's total since the reset.

use serde::Serialize;
use serde::de::IgnoredAny;
use statebox_sdk::prelude::*;

/// The row emitted per call.
#[derive(Serialize)]
pub struct Total {
    /// The grouping key (one string column).
    pub key: String,
    /// Rows of the key since the reset.
    pub count: i64,
}

/// See the [crate docs](crate).
pub struct CounterReset {
    count: ValueState<i64>,
    batch_counts: ListState<i64>,
}

impl StatefulProcessor for CounterReset {
    type Input = IgnoredAny;
    type Output = Total;
    type InitialState = NoInitialState;

    const NAME: &'static str = "counter";
    const OUTPUT_SCHEMA: &'static str = "key string, count long";

    fn init(handle: &mut Handle) -> Result<Self> {
        handle.delete_if_exists("count")?;
        let count = handle.value_state("count", "long")?;
        let batch_counts = handle.list_state("batchCounts", "long")?;
        Ok(CounterReset {
            count,
            batch_counts,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<IgnoredAny>,
        _timer_values: TimerValues,
        out: &mut Emitter<Total>,
    ) -> Result<()> {
        let batch = i64::try_from(rows.len())?;
        let total = self.count.get()?.unwrap_or(0) + batch;
        self.count.update(&total)?;
        self.batch_counts.append_value(&batch)?;
        out.emit(Total {
            key: key.as_str().unwrap_or_default().to_owned(),
            count: total,
        })
    }
}

statebox_sdk::export_processor!(CounterReset);
