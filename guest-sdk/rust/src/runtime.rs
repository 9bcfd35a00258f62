//! Running a processor: decoding a call's arguments, and the glue between the `processor`
//! export and [`StatefulProcessor`].

use serde::de::DeserializeOwned;

use crate::{Error, ErrorKind, Result};

/// Decodes every input row, naming the first row that does not fit so the host can point at
/// its input file and line.
pub(crate) fn decode_rows<I: DeserializeOwned>(rows: &[impl AsRef<str>]) -> Result<Vec<I>> {
    let mut decoded = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        match serde_json::from_str(row.as_ref()) {
            Ok(row) => decoded.push(row),
            Err(err) => {
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                return Err(Error::new(
                    ErrorKind::BadInputRow { index },
                    describe_row_error::<I>(row.as_ref(), err),
                ));
            }
        }
    }
    Ok(decoded)
}

/// Explains why a row did not decode, naming the column when the error is inside one. The
/// row is decoded a second time, tracking the path, only on this error path, so decoding
/// good rows pays nothing for it.
fn describe_row_error<I: DeserializeOwned>(row: &str, err: serde_json::Error) -> String {
    let mut de = serde_json::Deserializer::from_str(row);
    match serde_path_to_error::deserialize::<_, I>(&mut de) {
        Err(e) if !e.path().to_string().is_empty() && e.path().to_string() != "." => {
            format!("column `{}`: {}", e.path(), e.inner())
        }
        _ => err.to_string(),
    }
}

/// Decodes one initial-state row.
pub(crate) fn decode_initial_state<T: DeserializeOwned>(json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|err| Error::json("initial state row", err))
}

/// What [`export_processor!`](crate::export_processor) expands to calls; one function per
/// export of the `processor` interface.
pub mod wit_glue {
    use std::cell::RefCell;

    pub use crate::__private::bindings::exports::statebox::processor::batch_processor::Guest as BatchGuest;
    pub use crate::__private::bindings::exports::statebox::processor::processor::Guest;
    use crate::__private::bindings::statebox::processor::keys::use_key;
    pub use crate::__private::bindings::statebox::processor::types::{
        BatchError, ExpiredTimerInfo as WitExpiredTimerInfo, KeyRows as WitKeyRows,
        KeyTimer as WitKeyTimer, ProcessorError, ProcessorInfo, TimeMode as WitTimeMode,
        TimerValues as WitTimerValues,
    };

    use super::{decode_initial_state, decode_rows};
    use crate::{Emitter, ExpiredTimerInfo, Handle, Key, StatefulProcessor, TimeMode, TimerValues};

    /// The processor's self-description.
    pub fn describe<P: StatefulProcessor>() -> ProcessorInfo {
        ProcessorInfo {
            name: P::NAME.to_owned(),
            output_schema: P::OUTPUT_SCHEMA.to_owned(),
            input_schema: P::INPUT_SCHEMA.map(str::to_owned),
            output_event_time_column: P::OUTPUT_EVENT_TIME_COLUMN.map(str::to_owned),
        }
    }

    /// Creates the processor and keeps it in `slot`.
    pub fn init<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        time_mode: WitTimeMode,
    ) -> Result<(), ProcessorError> {
        let time_mode = match time_mode {
            WitTimeMode::None => TimeMode::None,
            WitTimeMode::ProcessingTime => TimeMode::ProcessingTime,
            WitTimeMode::EventTime => TimeMode::EventTime,
        };
        let processor = P::init(&mut Handle::host(time_mode)).map_err(crate::Error::into_host)?;
        *slot.borrow_mut() = Some(processor);
        Ok(())
    }

    fn with_processor<P: StatefulProcessor, T>(
        slot: &RefCell<Option<P>>,
        call: impl FnOnce(&mut P) -> crate::Result<T>,
    ) -> Result<T, ProcessorError> {
        let mut slot = slot.borrow_mut();
        let processor = slot.as_mut().ok_or_else(|| {
            ProcessorError::Failed(format!("processor `{}` was called before init", P::NAME))
        })?;
        call(processor).map_err(crate::Error::into_host)
    }

    fn timer_values(values: WitTimerValues) -> TimerValues {
        TimerValues::new(
            values.current_processing_time_ms,
            values.current_watermark_ms,
        )
    }

    /// Runs `handle_input_rows` for one key.
    pub fn handle_input_rows<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        key: String,
        rows: Vec<String>,
        values: WitTimerValues,
    ) -> Result<Vec<String>, ProcessorError> {
        with_processor(slot, |processor| {
            let rows = decode_rows(&rows)?;
            let mut out = Emitter::json();
            processor.handle_input_rows(
                &Key::from_json(key),
                rows,
                timer_values(values),
                &mut out,
            )?;
            Ok(out.into_json())
        })
    }

    /// Runs `handle_expired_timer` for one timer.
    pub fn handle_expired_timer<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        key: String,
        values: WitTimerValues,
        info: WitExpiredTimerInfo,
    ) -> Result<Vec<String>, ProcessorError> {
        with_processor(slot, |processor| {
            let mut out = Emitter::json();
            processor.handle_expired_timer(
                &Key::from_json(key),
                timer_values(values),
                ExpiredTimerInfo::new(info.expiry_time_ms),
                &mut out,
            )?;
            Ok(out.into_json())
        })
    }

    /// Runs one entry of a batched call: selects its key, then calls `handler`. A failure
    /// is reported with the entry's index.
    fn entry<T>(
        index: usize,
        handler: impl FnOnce() -> Result<T, ProcessorError>,
    ) -> Result<T, BatchError> {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let at = |error| BatchError { index, error };
        use_key(index)
            .map_err(|e| at(ProcessorError::Failed(format!("use-key: {}", e.message))))?;
        handler().map_err(at)
    }

    /// Runs `handle_input_rows` for each key of a batched call, in order.
    pub fn handle_input_batch<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        groups: Vec<WitKeyRows>,
        values: WitTimerValues,
    ) -> Result<Vec<Vec<String>>, BatchError> {
        groups
            .into_iter()
            .enumerate()
            .map(|(i, g)| entry(i, || handle_input_rows(slot, g.key, g.rows, values)))
            .collect()
    }

    /// Runs `handle_expired_timer` for each timer of a batched call, in order.
    pub fn handle_expired_timers<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        timers: Vec<WitKeyTimer>,
        values: WitTimerValues,
    ) -> Result<Vec<Vec<String>>, BatchError> {
        timers
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                entry(i, || {
                    handle_expired_timer(slot, t.key, values, t.expired_timer_info)
                })
            })
            .collect()
    }

    /// Runs `handle_initial_state` for one initial-state row.
    pub fn handle_initial_state<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        key: String,
        row: String,
        values: WitTimerValues,
    ) -> Result<(), ProcessorError> {
        with_processor(slot, |processor| {
            let row = decode_initial_state(&row)?;
            processor.handle_initial_state(&Key::from_json(key), row, timer_values(values))
        })
    }

    /// Runs `close` and drops the processor.
    pub fn close<P: StatefulProcessor>(slot: &RefCell<Option<P>>) -> Result<(), ProcessorError> {
        match slot.borrow_mut().take() {
            Some(mut processor) => processor.close().map_err(crate::Error::into_host),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_rows_are_named_by_index() {
        #[derive(serde::Deserialize, Debug)]
        struct Row {
            n: i64,
        }
        let rows = [r#"{"n":1}"#, r#"{"n":"x"}"#];
        assert_eq!(decode_rows::<Row>(&rows[..1]).unwrap()[0].n, 1);
        let err = decode_rows::<Row>(&rows).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
        assert!(err.message().contains("invalid type"), "{err}");
        assert!(err.message().contains("column `n`"), "{err}");
    }

    #[test]
    fn a_null_where_a_string_belongs_names_the_column() {
        #[derive(serde::Deserialize, Debug)]
        struct Row {
            #[allow(dead_code)]
            session_id: String,
        }
        let err = decode_rows::<Row>(&[r#"{"session_id":null}"#]).unwrap_err();
        assert!(err.message().contains("column `session_id`"), "{err}");
        assert!(err.message().contains("null"), "{err}");
    }
}
