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

/// Decodes the rows the host hands a component. The host has validated every row against
/// the query's input schema already, so an input type that ignores its rows (`IgnoredAny`,
/// as a processor that only counts them declares) is made without parsing them: parsing
/// only to skip was about a quarter of a counting processor's own time in wasm.
pub(crate) fn decode_host_rows<I: DeserializeOwned>(rows: &[impl AsRef<str>]) -> Result<Vec<I>> {
    // A type that reads its input fails at once (no allocation), on the first row.
    match rows
        .iter()
        .map(|_| I::deserialize(OnlyIgnoredAny))
        .collect()
    {
        Ok(ignored) => Ok(ignored),
        Err(WantsData) => decode_rows(rows),
    }
}

/// A deserializer that answers only `deserialize_ignored_any` (with `visit_unit`, as
/// serde_json does after skipping a value): a type it makes ignores what it is decoded from.
struct OnlyIgnoredAny;

/// The type asked [`OnlyIgnoredAny`] for data.
#[derive(Debug)]
struct WantsData;

impl std::fmt::Display for WantsData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the type reads its input")
    }
}

impl std::error::Error for WantsData {}

impl serde::de::Error for WantsData {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        WantsData
    }
}

impl<'de> serde::Deserializer<'de> for OnlyIgnoredAny {
    type Error = WantsData;

    fn deserialize_any<V: serde::de::Visitor<'de>>(
        self,
        _: V,
    ) -> std::result::Result<V::Value, WantsData> {
        Err(WantsData)
    }

    fn deserialize_ignored_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> std::result::Result<V::Value, WantsData> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier
    }
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

    use super::{decode_host_rows, decode_initial_state};
    use crate::held;
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
            let rows = decode_host_rows(&rows)?;
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
        held::select(index);
        use_key(index)
            .map_err(|e| at(ProcessorError::Failed(format!("use-key: {}", e.message))))?;
        handler().map_err(at)
    }

    /// Runs a batched call's entries (with writes held if `P` asks for it), then sends the
    /// writes still held. A held write the host rejected fails the call, named by its entry.
    fn batch<P: StatefulProcessor>(
        run: impl FnOnce() -> Result<Vec<Vec<String>>, BatchError>,
    ) -> Result<Vec<Vec<String>>, BatchError> {
        let _held = held::Batch::start(P::HOLD_WRITES);
        let results = run();
        let failed = match &results {
            Ok(_) => held::finish(),
            // The call fails anyway; a held write rejected earlier may be why.
            Err(_) => held::failure(),
        };
        match failed {
            Some((index, error)) => Err(BatchError {
                index,
                error: error.into_host(),
            }),
            None => results,
        }
    }

    /// Runs `handle_input_rows` for each key of a batched call, in order.
    pub fn handle_input_batch<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        groups: Vec<WitKeyRows>,
        values: WitTimerValues,
    ) -> Result<Vec<Vec<String>>, BatchError> {
        batch::<P>(|| {
            groups
                .into_iter()
                .enumerate()
                .map(|(i, g)| entry(i, || handle_input_rows(slot, g.key, g.rows, values)))
                .collect()
        })
    }

    /// Runs `handle_expired_timer` for each timer of a batched call, in order.
    pub fn handle_expired_timers<P: StatefulProcessor>(
        slot: &RefCell<Option<P>>,
        timers: Vec<WitKeyTimer>,
        values: WitTimerValues,
    ) -> Result<Vec<Vec<String>>, BatchError> {
        batch::<P>(|| {
            timers
                .into_iter()
                .enumerate()
                .map(|(i, t)| {
                    entry(i, || {
                        handle_expired_timer(slot, t.key, values, t.expired_timer_info)
                    })
                })
                .collect()
        })
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
    fn ignored_rows_are_counted_without_parsing_and_other_types_still_parse() {
        use serde::de::IgnoredAny;
        // Not JSON: nothing reads these rows (the host validated real ones against the
        // input schema), so nothing can fail on them.
        let unread = ["not json", "", "{"];
        assert_eq!(decode_host_rows::<IgnoredAny>(&unread).unwrap().len(), 3);
        assert!(
            decode_host_rows::<IgnoredAny>(&[] as &[&str])
                .unwrap()
                .is_empty()
        );

        // Types that read their input are parsed as before, errors named as before.
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Row {
            n: i64,
        }
        let rows = [r#"{"n":1}"#, r#"{"n":2}"#];
        assert_eq!(
            decode_host_rows::<Row>(&rows).unwrap(),
            [Row { n: 1 }, Row { n: 2 }]
        );
        let err = decode_host_rows::<Row>(&[r#"{"n":1}"#, "{"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
        let values = decode_host_rows::<serde_json::Value>(&[r#"{"a":[1]}"#]).unwrap();
        assert_eq!(values, [serde_json::json!({"a": [1]})]);
        // Optional or wrapped ignoring still parses: it sees whether a row is there.
        assert!(decode_host_rows::<Option<IgnoredAny>>(&["{"]).is_err());
        assert_eq!(decode_host_rows::<()>(&["null"]).unwrap(), [()]);
        assert!(decode_host_rows::<()>(&["{}"]).is_err());
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
