//! Printing query results: a table, JSON Lines or CSV.

use std::io::Write;

use base64::Engine as _;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::arrow::util::pretty::pretty_format_batches_with_schema;

/// How `statebox sql` prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    /// A table with borders (DataFusion's pretty printer); the whole result is gathered
    /// first to size the columns.
    #[default]
    Table,
    /// One JSON object per row, streamed: structs as objects, lists as arrays, maps as
    /// objects keyed by the key's text (strings as they are, other keys as their JSON
    /// text), binary as base64, timestamps and dates as ISO-8601 strings.
    Jsonl,
    /// A header line, then one line per row, streamed: nested values as their JSON text (as
    /// in JSON Lines), null as an empty field; quoted per RFC 4180.
    Csv,
}

/// Writes a result, a batch at a time.
pub(crate) struct Printer {
    format: OutputFormat,
    schema: SchemaRef,
    table: Vec<RecordBatch>,
    header_done: bool,
}

impl Printer {
    pub(crate) fn new(format: OutputFormat, schema: SchemaRef) -> Printer {
        Printer {
            format,
            schema,
            table: Vec::new(),
            header_done: false,
        }
    }

    /// Prints (or, for a table, keeps) one batch.
    pub(crate) fn batch(
        &mut self,
        out: &mut dyn Write,
        batch: RecordBatch,
    ) -> Result<(), PrintError> {
        match self.format {
            OutputFormat::Table => self.table.push(batch),
            OutputFormat::Jsonl => {
                let names: Vec<&str> = self
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect();
                let mut line = Vec::new();
                for row in 0..batch.num_rows() {
                    line.clear();
                    write_object(&mut line, names.iter().copied().zip(batch.columns()), row)?;
                    line.push(b'\n');
                    out.write_all(&line)?;
                }
            }
            OutputFormat::Csv => {
                self.csv_header(out)?;
                let mut line = Vec::with_capacity(batch.num_columns());
                for row in 0..batch.num_rows() {
                    line.clear();
                    for column in batch.columns() {
                        line.push(match cell_text(column.as_ref(), row)? {
                            Cell::Null => String::new(),
                            Cell::Text(text) | Cell::Json(text) => csv_text(&text),
                        });
                    }
                    writeln!(out, "{}", line.join(","))?;
                }
            }
        }
        Ok(())
    }

    /// Prints what is left: the table, or a CSV header for an empty result.
    pub(crate) fn finish(mut self, out: &mut dyn Write) -> Result<(), PrintError> {
        match self.format {
            OutputFormat::Table => {
                let table = pretty_format_batches_with_schema(self.schema.clone(), &self.table)?;
                writeln!(out, "{table}")?;
            }
            OutputFormat::Csv => self.csv_header(out)?,
            OutputFormat::Jsonl => {}
        }
        out.flush()?;
        Ok(())
    }

    fn csv_header(&mut self, out: &mut dyn Write) -> Result<(), PrintError> {
        if !self.header_done {
            self.header_done = true;
            let names: Vec<String> = self
                .schema
                .fields()
                .iter()
                .map(|f| csv_text(f.name()))
                .collect();
            writeln!(out, "{}", names.join(","))?;
        }
        Ok(())
    }
}

/// Printing failed: the output could not be written, or a value could not be formatted.
#[derive(Debug, thiserror::Error)]
pub enum PrintError {
    /// Writing to the output failed.
    #[error("writing the result: {0}")]
    Io(#[from] std::io::Error),
    /// A value could not be formatted.
    #[error("formatting the result: {0}")]
    Format(#[from] ArrowError),
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_text(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Writes the value at `row` of `array` as JSON text; struct fields and columns keep their
/// order.
pub(crate) fn write_json(
    out: &mut Vec<u8>,
    array: &dyn Array,
    row: usize,
) -> Result<(), ArrowError> {
    if array.is_null(row) {
        out.extend_from_slice(b"null");
        return Ok(());
    }
    match array.data_type() {
        DataType::Null => out.extend_from_slice(b"null"),
        DataType::Boolean => {
            let text: &[u8] = if array.as_boolean().value(row) {
                b"true"
            } else {
                b"false"
            };
            out.extend_from_slice(text)
        }
        DataType::Utf8 => write_string(out, array.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => write_string(out, array.as_string::<i64>().value(row)),
        DataType::Utf8View => write_string(out, array.as_string_view().value(row)),
        DataType::Binary => write_base64(out, array.as_binary::<i32>().value(row)),
        DataType::LargeBinary => write_base64(out, array.as_binary::<i64>().value(row)),
        DataType::BinaryView => write_base64(out, array.as_binary_view().value(row)),
        DataType::FixedSizeBinary(_) => write_base64(out, array.as_fixed_size_binary().value(row)),
        DataType::Struct(fields) => {
            let columns = array.as_struct().columns();
            write_object(
                out,
                fields.iter().map(|f| f.name().as_str()).zip(columns),
                row,
            )?
        }
        DataType::List(_) => write_list(out, &array.as_list::<i32>().value(row))?,
        DataType::LargeList(_) => write_list(out, &array.as_list::<i64>().value(row))?,
        DataType::FixedSizeList(..) => write_list(out, &array.as_fixed_size_list().value(row))?,
        DataType::Map(..) => {
            let entries = array.as_map().value(row);
            let (keys, values) = (entries.column(0), entries.column(1));
            out.push(b'{');
            for i in 0..entries.len() {
                if i > 0 {
                    out.push(b',');
                }
                // A key is named by its text: strings as they are, others as JSON text.
                match cell_text(keys.as_ref(), i)? {
                    Cell::Text(text) => write_string(out, &text),
                    Cell::Null => write_string(out, "null"),
                    Cell::Json(text) => write_string(out, &text),
                }
                out.push(b':');
                write_json(out, values.as_ref(), i)?;
            }
            out.push(b'}');
        }
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => {
            // Numbers as numbers; NaN and infinities, which JSON cannot hold, as text.
            let text = formatted(array, row)?;
            if serde_json::from_str::<serde_json::Number>(&text).is_ok() {
                out.extend_from_slice(text.as_bytes());
            } else {
                write_string(out, &text);
            }
        }
        // Timestamps, dates, times, durations, intervals, dictionaries: Arrow's text.
        _ => write_string(out, &formatted(array, row)?),
    }
    Ok(())
}

/// Writes a JSON object of named columns at `row`, in the columns' order.
fn write_object<'a>(
    out: &mut Vec<u8>,
    columns: impl Iterator<Item = (&'a str, &'a ArrayRef)>,
    row: usize,
) -> Result<(), ArrowError> {
    out.push(b'{');
    for (i, (name, column)) in columns.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(out, name);
        out.push(b':');
        write_json(out, column.as_ref(), row)?;
    }
    out.push(b'}');
    Ok(())
}

fn write_list(out: &mut Vec<u8>, items: &dyn Array) -> Result<(), ArrowError> {
    out.push(b'[');
    for i in 0..items.len() {
        if i > 0 {
            out.push(b',');
        }
        write_json(out, items, i)?;
    }
    out.push(b']');
    Ok(())
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing a string to memory cannot fail");
}

fn write_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    write_string(
        out,
        &base64::engine::general_purpose::STANDARD.encode(bytes),
    );
}

/// One value as a CSV cell or map key: a string's text, JSON text for everything else.
enum Cell {
    Null,
    Text(String),
    Json(String),
}

fn cell_text(array: &dyn Array, row: usize) -> Result<Cell, ArrowError> {
    if array.is_null(row) {
        return Ok(Cell::Null);
    }
    Ok(match array.data_type() {
        DataType::Utf8 => Cell::Text(array.as_string::<i32>().value(row).to_owned()),
        DataType::LargeUtf8 => Cell::Text(array.as_string::<i64>().value(row).to_owned()),
        DataType::Utf8View => Cell::Text(array.as_string_view().value(row).to_owned()),
        _ => {
            let mut text = Vec::new();
            write_json(&mut text, array, row)?;
            match serde_json::from_slice::<serde_json::Value>(&text) {
                // Timestamps, dates and binary are JSON strings: their text, unquoted.
                Ok(serde_json::Value::String(s)) => Cell::Text(s),
                _ => Cell::Json(String::from_utf8(text).expect("JSON text is UTF-8")),
            }
        }
    })
}

fn formatted(array: &dyn Array, row: usize) -> Result<String, ArrowError> {
    Ok(ArrayFormatter::try_new(array, &FormatOptions::default())?
        .value(row)
        .to_string())
}
