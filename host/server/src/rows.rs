//! Checking ingested rows before they are acknowledged, and turning an ingest body (a
//! JSON array of objects, or JSON Lines) into the compact JSON Lines the input log stores.

use serde_json::Value;
use statebox_schema::RowScanner;

use crate::app::AppError;

/// How a pipeline's input rows are checked before they are acknowledged: the same
/// checks the engine makes when it decodes a batch, so an acknowledged row never fails one.
pub(crate) struct IngestCheck {
    pub scanner: RowScanner,
    pub key: Vec<String>,
    pub event_time: Option<String>,
    pub has_schema: bool,
}

impl IngestCheck {
    pub fn new(
        schema: Option<statebox_schema::Schema>,
        key: Vec<String>,
        event_time: Option<String>,
    ) -> IngestCheck {
        let mut columns = key.clone();
        columns.extend(event_time.clone());
        IngestCheck {
            has_schema: schema.is_some(),
            scanner: RowScanner::new(schema, columns),
            key,
            event_time,
        }
    }

    /// Checks one row (a JSON object on one line).
    pub fn check(&self, line: &str) -> Result<(), String> {
        if !line.trim_start().starts_with('{') {
            return Err("a row must be a JSON object".into());
        }
        if !self.has_schema {
            serde_json::from_str::<serde::de::IgnoredAny>(line)
                .map_err(|e| format!("invalid JSON: {e}"))?;
        }
        let columns = self.scanner.scan(line).map_err(|e| e.to_string())?;
        for (column, value) in self.key.iter().zip(&columns) {
            if value.is_none() {
                return Err(format!("the row has no key column `{column}`"));
            }
        }
        if let Some(column) = &self.event_time {
            let Some(raw) = columns[self.key.len()] else {
                return Err(format!("the row has no event-time column `{column}`"));
            };
            statebox_schema::timestamp_millis(raw.get())
                .map_err(|e| format!("event-time column `{column}`: {e}"))?;
        }
        Ok(())
    }
}

/// `raw` (one JSON value) on one line: re-encoded when it spans several.
pub(crate) fn compact_line(raw: &str) -> Result<String, AppError> {
    if raw.contains(['\n', '\r']) {
        let value: Value = serde_json::from_str(raw)
            .map_err(|e| AppError::bad_input(format!("invalid JSON: {e}")))?;
        Ok(value.to_string())
    } else {
        Ok(raw.to_owned())
    }
}

/// Splits an ingest body (a JSON array of objects, or JSON Lines) into checked, compact
/// JSON Lines; returns them and how many rows they hold. One bad row refuses the whole
/// body, naming the row.
pub(crate) fn ingest_lines(body: &[u8], check: &IngestCheck) -> Result<(Vec<u8>, u64), AppError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| AppError::bad_input(format!("the body is not UTF-8: {e}")))?;
    let mut out = Vec::with_capacity(body.len() + 16);
    let mut rows = 0u64;
    let mut push = |i: usize, line: &str| -> Result<(), AppError> {
        check.check(line).map_err(|e| {
            AppError::bad_input(format!("row {i}: {e}; no row of this request was accepted"))
        })?;
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        rows += 1;
        Ok(())
    };
    if text.trim_start().starts_with('[') {
        let array: Vec<&serde_json::value::RawValue> = serde_json::from_str(text).map_err(|e| {
            AppError::bad_input(format!("the body is not a JSON array of rows: {e}"))
        })?;
        for (i, raw) in array.iter().enumerate() {
            push(i, &compact_line(raw.get())?)?;
        }
    } else {
        for (i, line) in text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l))
            .filter(|l| !l.trim().is_empty())
            .enumerate()
        {
            push(i, line)?;
        }
    }
    Ok((out, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_checked_compacted_and_a_bad_one_is_named() {
        let check = IngestCheck::new(None, vec!["k".into()], None);
        let (lines, rows) = ingest_lines(b"[{\"k\": 1,\n \"v\": 2}, {\"k\": 2}]", &check).unwrap();
        assert_eq!(rows, 2);
        assert_eq!(lines, b"{\"k\":1,\"v\":2}\n{\"k\": 2}\n");
        let (lines, rows) = ingest_lines(b"{\"k\":1}\r\n\n{\"k\":2}\n", &check).unwrap();
        assert_eq!(
            (lines.as_slice(), rows),
            (&b"{\"k\":1}\n{\"k\":2}\n"[..], 2)
        );
        let e = ingest_lines(b"{\"k\":1}\n{\"v\":2}\n", &check).unwrap_err();
        assert!(matches!(e, AppError::BadInput(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "row 1: the row has no key column `k`; no row of this request was accepted"
        );
        let e = ingest_lines(b"[1]", &check).unwrap_err().to_string();
        assert!(e.starts_with("row 0: a row must be a JSON object"), "{e}");
    }
}
