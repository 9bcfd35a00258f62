//! Building Arrow record batches from the state reader's JSON rows.
//!
//! Each column has a [`ColumnBuilder`] made from its [`ColumnType`]; a row's JSON value is
//! appended to every column, and [`RowBatcher`] cuts the columns into record batches.
//! Values were validated against their schema when they were written, so a mismatch means
//! a damaged checkpoint (or a key column whose type was inferred from other rows); it is
//! reported with the column path, never panics.

use std::sync::Arc;

use base64::Engine as _;
use datafusion::arrow::array::NullBufferBuilder;
use datafusion::arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder,
    Int32Builder, Int64Builder, ListArray, MapArray, RecordBatch, StringBuilder, StructArray,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::compute::kernels::cast_utils::Parser;
use datafusion::arrow::datatypes::{Date32Type, Field, Fields, SchemaRef};
use datafusion::arrow::error::ArrowError;
use serde_json::{Map, Value};

use crate::types::{ColumnType, UTC, map_entries, map_entry_fields, struct_fields};

/// Rows per record batch.
pub(crate) const BATCH_ROWS: usize = 8192;

/// A JSON value that does not fit its column, with the path of the offending value.
#[derive(Debug)]
pub struct ConvertError {
    path: Vec<String>,
    message: String,
}

impl ConvertError {
    fn new(message: impl Into<String>) -> ConvertError {
        ConvertError {
            path: Vec::new(),
            message: message.into(),
        }
    }

    /// Prefixes the path with `segment` (the error bubbles up from the innermost value).
    fn within(mut self, segment: impl Into<String>) -> ConvertError {
        self.path.push(segment.into());
        self
    }
}

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut path = String::new();
        for segment in self.path.iter().rev() {
            if !path.is_empty() && !segment.starts_with('[') {
                path.push('.');
            }
            path.push_str(segment);
        }
        write!(f, "column `{path}`: {}", self.message)
    }
}

impl std::error::Error for ConvertError {}

/// Appends JSON values of one [`ColumnType`] and finishes them into an Arrow array.
pub(crate) enum ColumnBuilder {
    Boolean(BooleanBuilder),
    Int(Int32Builder),
    Long(Int64Builder),
    Float(Float32Builder),
    Double(Float64Builder),
    String(StringBuilder),
    Json(StringBuilder),
    Binary(BinaryBuilder),
    Timestamp(TimestampMillisecondBuilder),
    Date(Date32Builder),
    Struct {
        fields: Fields,
        children: Vec<(String, ColumnBuilder)>,
        nulls: NullBufferBuilder,
    },
    List {
        field: Arc<Field>,
        offsets: Vec<i32>,
        element: Box<ColumnBuilder>,
        nulls: NullBufferBuilder,
    },
    Map {
        entries: Arc<Field>,
        entry_fields: Fields,
        offsets: Vec<i32>,
        key_type: ColumnType,
        keys: Box<ColumnBuilder>,
        values: Box<ColumnBuilder>,
        nulls: NullBufferBuilder,
    },
}

impl ColumnBuilder {
    /// An empty builder for values of type `ty`.
    pub(crate) fn new(ty: &ColumnType) -> ColumnBuilder {
        match ty {
            ColumnType::Boolean => ColumnBuilder::Boolean(BooleanBuilder::new()),
            ColumnType::Int => ColumnBuilder::Int(Int32Builder::new()),
            ColumnType::Long => ColumnBuilder::Long(Int64Builder::new()),
            ColumnType::Float => ColumnBuilder::Float(Float32Builder::new()),
            ColumnType::Double => ColumnBuilder::Double(Float64Builder::new()),
            ColumnType::String => ColumnBuilder::String(StringBuilder::new()),
            ColumnType::Json => ColumnBuilder::Json(StringBuilder::new()),
            ColumnType::Binary => ColumnBuilder::Binary(BinaryBuilder::new()),
            ColumnType::Timestamp => {
                ColumnBuilder::Timestamp(TimestampMillisecondBuilder::new().with_timezone(UTC))
            }
            ColumnType::Date => ColumnBuilder::Date(Date32Builder::new()),
            ColumnType::Struct(fields) => ColumnBuilder::Struct {
                fields: struct_fields(fields),
                children: fields
                    .iter()
                    .map(|(name, ty)| (name.clone(), ColumnBuilder::new(ty)))
                    .collect(),
                nulls: NullBufferBuilder::new(0),
            },
            ColumnType::List(element) => ColumnBuilder::List {
                field: Arc::new(Field::new_list_field(element.arrow_type(), true)),
                offsets: vec![0],
                element: Box::new(ColumnBuilder::new(element)),
                nulls: NullBufferBuilder::new(0),
            },
            ColumnType::Map(key, value) => {
                let entries = map_entries(key, value);
                let entry_fields = map_entry_fields(key, value);
                ColumnBuilder::Map {
                    entries,
                    entry_fields,
                    offsets: vec![0],
                    key_type: (**key).clone(),
                    keys: Box::new(ColumnBuilder::new(key)),
                    values: Box::new(ColumnBuilder::new(value)),
                    nulls: NullBufferBuilder::new(0),
                }
            }
        }
    }

    /// Appends a null.
    pub(crate) fn append_null(&mut self) {
        match self {
            ColumnBuilder::Boolean(b) => b.append_null(),
            ColumnBuilder::Int(b) => b.append_null(),
            ColumnBuilder::Long(b) => b.append_null(),
            ColumnBuilder::Float(b) => b.append_null(),
            ColumnBuilder::Double(b) => b.append_null(),
            ColumnBuilder::String(b) | ColumnBuilder::Json(b) => b.append_null(),
            ColumnBuilder::Binary(b) => b.append_null(),
            ColumnBuilder::Timestamp(b) => b.append_null(),
            ColumnBuilder::Date(b) => b.append_null(),
            ColumnBuilder::Struct {
                children, nulls, ..
            } => {
                // A struct array has a slot in every child even where it is null.
                children.iter_mut().for_each(|(_, c)| c.append_null());
                nulls.append_null();
            }
            ColumnBuilder::List { offsets, nulls, .. }
            | ColumnBuilder::Map { offsets, nulls, .. } => {
                offsets.push(*offsets.last().expect("offsets start with 0"));
                nulls.append_null();
            }
        }
    }

    /// Appends `value` (null appends a null).
    pub(crate) fn append(&mut self, value: &Value) -> Result<(), ConvertError> {
        if value.is_null() {
            self.append_null();
            return Ok(());
        }
        match self {
            ColumnBuilder::Boolean(b) => {
                b.append_value(value.as_bool().ok_or_else(|| mismatch("boolean", value))?)
            }
            ColumnBuilder::Int(b) => {
                let v = value
                    .as_i64()
                    .and_then(|v| i32::try_from(v).ok())
                    .ok_or_else(|| mismatch("int", value))?;
                b.append_value(v)
            }
            ColumnBuilder::Long(b) => {
                b.append_value(value.as_i64().ok_or_else(|| mismatch("long", value))?)
            }
            ColumnBuilder::Float(b) => {
                b.append_value(value.as_f64().ok_or_else(|| mismatch("float", value))? as f32)
            }
            ColumnBuilder::Double(b) => {
                b.append_value(value.as_f64().ok_or_else(|| mismatch("double", value))?)
            }
            ColumnBuilder::String(b) => {
                b.append_value(value.as_str().ok_or_else(|| mismatch("string", value))?)
            }
            ColumnBuilder::Json(b) => b.append_value(value.to_string()),
            ColumnBuilder::Binary(b) => {
                let text = value
                    .as_str()
                    .ok_or_else(|| mismatch("base64 binary", value))?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| ConvertError::new(format!("invalid base64: {e}")))?;
                b.append_value(bytes)
            }
            ColumnBuilder::Timestamp(b) => b.append_value(timestamp_millis(value)?),
            ColumnBuilder::Date(b) => {
                let days = value
                    .as_str()
                    .and_then(Date32Type::parse)
                    .ok_or_else(|| mismatch("date", value))?;
                b.append_value(days)
            }
            ColumnBuilder::Struct {
                children, nulls, ..
            } => {
                let object = value.as_object().ok_or_else(|| mismatch("struct", value))?;
                for (name, child) in children.iter_mut() {
                    child
                        .append(object.get(name.as_str()).unwrap_or(&Value::Null))
                        .map_err(|e| e.within(name.clone()))?;
                }
                nulls.append_non_null();
            }
            ColumnBuilder::List {
                offsets,
                element,
                nulls,
                ..
            } => {
                let items = value.as_array().ok_or_else(|| mismatch("array", value))?;
                for (i, item) in items.iter().enumerate() {
                    element
                        .append(item)
                        .map_err(|e| e.within(format!("[{i}]")))?;
                }
                push_offset(offsets, items.len())?;
                nulls.append_non_null();
            }
            ColumnBuilder::Map {
                offsets,
                key_type,
                keys,
                values,
                nulls,
                ..
            } => {
                let object = value.as_object().ok_or_else(|| mismatch("map", value))?;
                append_map(object, key_type, keys, values)?;
                push_offset(offsets, object.len())?;
                nulls.append_non_null();
            }
        }
        Ok(())
    }

    /// The values appended so far as an array; the builder starts over empty.
    pub(crate) fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            ColumnBuilder::Boolean(b) => Arc::new(b.finish()),
            ColumnBuilder::Int(b) => Arc::new(b.finish()),
            ColumnBuilder::Long(b) => Arc::new(b.finish()),
            ColumnBuilder::Float(b) => Arc::new(b.finish()),
            ColumnBuilder::Double(b) => Arc::new(b.finish()),
            ColumnBuilder::String(b) | ColumnBuilder::Json(b) => Arc::new(b.finish()),
            ColumnBuilder::Binary(b) => Arc::new(b.finish()),
            ColumnBuilder::Timestamp(b) => Arc::new(b.finish()),
            ColumnBuilder::Date(b) => Arc::new(b.finish()),
            ColumnBuilder::Struct {
                fields,
                children,
                nulls,
            } => {
                let len = nulls.len();
                let arrays = children
                    .iter_mut()
                    .map(|(_, c)| c.finish())
                    .collect::<Result<Vec<_>, _>>()?;
                Arc::new(StructArray::try_new_with_length(
                    fields.clone(),
                    arrays,
                    nulls.finish(),
                    len,
                )?)
            }
            ColumnBuilder::List {
                field,
                offsets,
                element,
                nulls,
            } => Arc::new(ListArray::try_new(
                field.clone(),
                take_offsets(offsets),
                element.finish()?,
                nulls.finish(),
            )?),
            ColumnBuilder::Map {
                entries,
                entry_fields,
                offsets,
                keys,
                values,
                nulls,
                ..
            } => {
                let entries_array = StructArray::try_new(
                    entry_fields.clone(),
                    vec![keys.finish()?, values.finish()?],
                    None,
                )?;
                Arc::new(MapArray::try_new(
                    entries.clone(),
                    take_offsets(offsets),
                    entries_array,
                    nulls.finish(),
                    false,
                )?)
            }
        })
    }
}

fn mismatch(expected: &str, found: &Value) -> ConvertError {
    let mut text = found.to_string();
    if text.len() > 60 {
        let cut = (0..=60)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    ConvertError::new(format!("expected {expected}, found {text}"))
}

/// Epoch milliseconds of a timestamp value: an integer, or a string in any form the
/// `timestamp` type accepts.
fn timestamp_millis(value: &Value) -> Result<i64, ConvertError> {
    match value {
        Value::Number(n) => n.as_i64().ok_or_else(|| mismatch("timestamp", value)),
        Value::String(_) => statebox_schema::timestamp_millis(&value.to_string())
            .map_err(|e| ConvertError::new(e.message)),
        _ => Err(mismatch("timestamp", value)),
    }
}

/// Appends a JSON object's members as map entries: each member name is the key's text
/// (strings as they are, other types as their JSON text), parsed back to the key type.
fn append_map(
    object: &Map<String, Value>,
    key_type: &ColumnType,
    keys: &mut ColumnBuilder,
    values: &mut ColumnBuilder,
) -> Result<(), ConvertError> {
    for (text, value) in object {
        let key = match key_type {
            ColumnType::String | ColumnType::Binary | ColumnType::Date => {
                Value::String(text.clone())
            }
            ColumnType::Timestamp => match text.parse::<i64>() {
                Ok(ms) => Value::from(ms),
                Err(_) => Value::String(text.clone()),
            },
            _ => serde_json::from_str(text)
                .map_err(|_| ConvertError::new(format!("map key {text:?} is not JSON")))?,
        };
        keys.append(&key)
            .map_err(|e| e.within(format!("[{text:?}]")))?;
        values
            .append(value)
            .map_err(|e| e.within(format!("[{text:?}]")))?;
    }
    Ok(())
}

fn push_offset(offsets: &mut Vec<i32>, len: usize) -> Result<(), ConvertError> {
    let last = *offsets.last().expect("offsets start with 0");
    let next = i32::try_from(len)
        .ok()
        .and_then(|len| last.checked_add(len))
        .ok_or_else(|| {
            ConvertError::new("more than 2^31 list elements or map entries in one batch")
        })?;
    offsets.push(next);
    Ok(())
}

fn take_offsets(offsets: &mut Vec<i32>) -> OffsetBuffer<i32> {
    let done = std::mem::replace(offsets, vec![0]);
    OffsetBuffer::new(ScalarBuffer::from(done))
}

/// Cuts JSON rows (objects) into record batches of a schema: each column takes the row's
/// member of its name (absent: null).
pub(crate) struct RowBatcher {
    schema: SchemaRef,
    columns: Vec<(String, ColumnBuilder)>,
    rows: usize,
}

impl RowBatcher {
    /// A batcher for `columns`, whose types give `schema`.
    pub(crate) fn new(schema: SchemaRef, columns: &[(String, ColumnType)]) -> RowBatcher {
        RowBatcher {
            schema,
            columns: columns
                .iter()
                .map(|(name, ty)| (name.clone(), ColumnBuilder::new(ty)))
                .collect(),
            rows: 0,
        }
    }

    /// Adds a row; returns a full batch when this row completes one.
    pub(crate) fn push(&mut self, row: &Value) -> Result<Option<RecordBatch>, ConvertError> {
        let Value::Object(row) = row else {
            return Err(ConvertError::new(format!("a row is not an object: {row}")));
        };
        for (name, column) in &mut self.columns {
            column
                .append(row.get(name.as_str()).unwrap_or(&Value::Null))
                .map_err(|e| e.within(name.clone()))?;
        }
        self.rows += 1;
        if self.rows == BATCH_ROWS {
            return self.finish().map(Some);
        }
        Ok(None)
    }

    /// The rows added since the last batch, as a batch (possibly empty).
    pub(crate) fn finish(&mut self) -> Result<RecordBatch, ConvertError> {
        self.rows = 0;
        let arrays = self
            .columns
            .iter_mut()
            .map(|(name, c)| {
                c.finish()
                    .map_err(|e| ConvertError::new(e.to_string()).within(name.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| ConvertError::new(format!("building a record batch: {e}")))
    }

    /// Whether rows were added since the last batch.
    pub(crate) fn has_rows(&self) -> bool {
        self.rows > 0
    }
}
