//! Column types: Spark DDL types and inferred grouping-key types, and their Arrow types.
//!
//! | Spark (DDL) | Arrow |
//! |---|---|
//! | `boolean` | `Boolean` |
//! | `int` | `Int32` |
//! | `long` | `Int64` |
//! | `float` | `Float32` |
//! | `double` | `Float64` |
//! | `string` | `Utf8` |
//! | `binary` | `Binary` (the bytes, decoded from the stored base64) |
//! | `timestamp` | `Timestamp(Millisecond, "UTC")` |
//! | `date` | `Date32` |
//! | `struct<...>` | `Struct` with the same field names, in order |
//! | `array<T>` | `List<T>` |
//! | `map<K, V>` | `Map<K, V>` (keys sorted as stored) |
//!
//! Every field is nullable on the Arrow side, NOT NULL or not: values written with an older
//! schema read added fields as null, and a change feed's deletes have no value.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType as ArrowType, Field, Fields, TimeUnit};
use serde_json::Value;
use statebox_schema::DataType;

/// The time zone of timestamp columns: Spark's `timestamp` is an instant.
pub(crate) const UTC: &str = "UTC";

/// The type of one output column (or nested field) and how its JSON values become Arrow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// `boolean`.
    Boolean,
    /// `int`.
    Int,
    /// `long`.
    Long,
    /// `float`.
    Float,
    /// `double`.
    Double,
    /// `string`.
    String,
    /// `binary`: base64 in JSON, bytes in Arrow.
    Binary,
    /// `timestamp`: epoch milliseconds or an ISO-8601 string in JSON.
    Timestamp,
    /// `date`: `"YYYY-MM-DD"` in JSON.
    Date,
    /// Any JSON value, shown as its JSON text: a grouping-key column whose stored values are
    /// not all of one scalar type.
    Json,
    /// `struct<...>`: named fields in order.
    Struct(Vec<(String, ColumnType)>),
    /// `array<T>`.
    List(Box<ColumnType>),
    /// `map<K, V>`.
    Map(Box<ColumnType>, Box<ColumnType>),
}

impl ColumnType {
    /// The column type of a Spark type.
    pub fn from_spark(ty: &DataType) -> ColumnType {
        match ty {
            DataType::Boolean => ColumnType::Boolean,
            DataType::Int => ColumnType::Int,
            DataType::Long => ColumnType::Long,
            DataType::Float => ColumnType::Float,
            DataType::Double => ColumnType::Double,
            DataType::String => ColumnType::String,
            DataType::Binary => ColumnType::Binary,
            DataType::Timestamp => ColumnType::Timestamp,
            DataType::Date => ColumnType::Date,
            DataType::Struct(s) => ColumnType::Struct(
                s.fields
                    .iter()
                    .map(|f| (f.name.clone(), ColumnType::from_spark(&f.data_type)))
                    .collect(),
            ),
            DataType::Array { element, .. } => {
                ColumnType::List(Box::new(ColumnType::from_spark(element)))
            }
            DataType::Map { key, value, .. } => ColumnType::Map(
                Box::new(ColumnType::from_spark(key)),
                Box::new(ColumnType::from_spark(value)),
            ),
        }
    }

    /// The Arrow type of the column.
    pub fn arrow_type(&self) -> ArrowType {
        match self {
            ColumnType::Boolean => ArrowType::Boolean,
            ColumnType::Int => ArrowType::Int32,
            ColumnType::Long => ArrowType::Int64,
            ColumnType::Float => ArrowType::Float32,
            ColumnType::Double => ArrowType::Float64,
            ColumnType::String | ColumnType::Json => ArrowType::Utf8,
            ColumnType::Binary => ArrowType::Binary,
            ColumnType::Timestamp => ArrowType::Timestamp(TimeUnit::Millisecond, Some(UTC.into())),
            ColumnType::Date => ArrowType::Date32,
            ColumnType::Struct(fields) => ArrowType::Struct(struct_fields(fields)),
            ColumnType::List(element) => {
                ArrowType::List(Arc::new(Field::new_list_field(element.arrow_type(), true)))
            }
            ColumnType::Map(key, value) => ArrowType::Map(map_entries(key, value), false),
        }
    }
}

/// The Arrow fields of a struct column, all nullable.
pub(crate) fn struct_fields(fields: &[(String, ColumnType)]) -> Fields {
    fields
        .iter()
        .map(|(name, ty)| Field::new(name, ty.arrow_type(), true))
        .collect()
}

/// The entries field of a map column: a non-null `key` and a nullable `value`, the layout
/// Arrow's `MapArray` requires.
pub(crate) fn map_entries(key: &ColumnType, value: &ColumnType) -> Arc<Field> {
    let entries = map_entry_fields(key, value);
    Arc::new(Field::new("entries", ArrowType::Struct(entries), false))
}

/// The fields of a map column's entries struct.
pub(crate) fn map_entry_fields(key: &ColumnType, value: &ColumnType) -> Fields {
    Fields::from(vec![
        Field::new("key", key.arrow_type(), false),
        Field::new("value", value.arrow_type(), true),
    ])
}

/// Infers the type of one grouping-key column from its stored JSON values.
///
/// A checkpoint records the names of the key columns, not their types (the input schema is
/// optional and not stored), so the key struct's field types come from the keys themselves:
/// all strings give `string`, all booleans `boolean`, all integers `long`, numbers with a
/// fraction among integers `double`. Any other mix (strings and numbers, objects, arrays)
/// gives [`ColumnType::Json`], the JSON text of each value. Nulls fit every type; a column
/// with no value at all (no rows) is `string`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyTypeGuess {
    /// No non-null value seen yet.
    #[default]
    Unknown,
    /// Only booleans.
    Boolean,
    /// Only integers within `i64`.
    Long,
    /// Only numbers, some not integers within `i64`.
    Double,
    /// Only strings.
    String,
    /// Values of different JSON types, or objects or arrays.
    Json,
}

impl KeyTypeGuess {
    /// Widens the guess to admit `value`.
    pub fn observe(&mut self, value: &Value) {
        use KeyTypeGuess::*;
        let seen = match value {
            Value::Null => return,
            Value::Bool(_) => Boolean,
            Value::Number(n) if n.is_i64() => Long,
            Value::Number(_) => Double,
            Value::String(_) => String,
            Value::Array(_) | Value::Object(_) => Json,
        };
        *self = match (*self, seen) {
            (Unknown, t) => t,
            (a, b) if a == b => a,
            (Long, Double) | (Double, Long) => Double,
            _ => Json,
        };
    }

    /// The column type guessed.
    pub fn column_type(self) -> ColumnType {
        match self {
            KeyTypeGuess::Unknown | KeyTypeGuess::String => ColumnType::String,
            KeyTypeGuess::Boolean => ColumnType::Boolean,
            KeyTypeGuess::Long => ColumnType::Long,
            KeyTypeGuess::Double => ColumnType::Double,
            KeyTypeGuess::Json => ColumnType::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use statebox_schema::Schema;

    use super::*;

    fn arrow(ddl: &str) -> ArrowType {
        ColumnType::from_spark(Schema::parse_ddl(ddl).unwrap().root()).arrow_type()
    }

    fn list(element: ArrowType) -> ArrowType {
        ArrowType::List(Arc::new(Field::new_list_field(element, true)))
    }

    #[test]
    fn scalars_map_to_their_arrow_types() {
        let cases = [
            ("boolean", ArrowType::Boolean),
            ("int", ArrowType::Int32),
            ("smallint", ArrowType::Int32),
            ("long", ArrowType::Int64),
            ("bigint", ArrowType::Int64),
            ("float", ArrowType::Float32),
            ("double", ArrowType::Float64),
            ("string", ArrowType::Utf8),
            ("varchar(10)", ArrowType::Utf8),
            ("binary", ArrowType::Binary),
            (
                "timestamp",
                ArrowType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            ),
            ("date", ArrowType::Date32),
        ];
        for (ddl, want) in cases {
            assert_eq!(arrow(ddl), want, "{ddl}");
        }
    }

    #[test]
    fn field_lists_become_structs_with_nullable_fields_in_order() {
        assert_eq!(
            arrow("name string, visits int NOT NULL, `first seen` timestamp"),
            ArrowType::Struct(Fields::from(vec![
                Field::new("name", ArrowType::Utf8, true),
                Field::new("visits", ArrowType::Int32, true),
                Field::new(
                    "first seen",
                    ArrowType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                    true
                ),
            ]))
        );
    }

    #[test]
    fn nested_types_map_recursively() {
        let address = ArrowType::Struct(Fields::from(vec![
            Field::new("city", ArrowType::Utf8, true),
            Field::new("zip", ArrowType::Int32, true),
        ]));
        assert_eq!(
            arrow("array<struct<city: string, zip: int>>"),
            list(address.clone())
        );
        assert_eq!(arrow("array<long NOT NULL>"), list(ArrowType::Int64));
        let entries = |k: ArrowType, v: ArrowType| {
            Arc::new(Field::new(
                "entries",
                ArrowType::Struct(Fields::from(vec![
                    Field::new("key", k, false),
                    Field::new("value", v, true),
                ])),
                false,
            ))
        };
        assert_eq!(
            arrow("map<string, array<double>>"),
            ArrowType::Map(entries(ArrowType::Utf8, list(ArrowType::Float64)), false)
        );
        assert_eq!(
            arrow("tags map<int, struct<city: string, zip: int>>"),
            ArrowType::Struct(Fields::from(vec![Field::new(
                "tags",
                ArrowType::Map(entries(ArrowType::Int32, address), false),
                true
            )]))
        );
    }

    #[test]
    fn key_types_are_inferred_from_the_stored_keys() {
        let guess = |values: &[Value]| {
            let mut g = KeyTypeGuess::default();
            values.iter().for_each(|v| g.observe(v));
            g.column_type()
        };
        assert_eq!(guess(&[]), ColumnType::String);
        assert_eq!(guess(&[json!(null)]), ColumnType::String);
        assert_eq!(guess(&[json!("a"), json!(null)]), ColumnType::String);
        assert_eq!(guess(&[json!(1), json!(-7)]), ColumnType::Long);
        assert_eq!(guess(&[json!(1), json!(2.5)]), ColumnType::Double);
        assert_eq!(guess(&[json!(2.5), json!(1)]), ColumnType::Double);
        assert_eq!(guess(&[json!(true), json!(false)]), ColumnType::Boolean);
        assert_eq!(guess(&[json!("1"), json!(1)]), ColumnType::Json);
        assert_eq!(guess(&[json!({"a": 1})]), ColumnType::Json);
        assert_eq!(guess(&[json!(true), json!(1)]), ColumnType::Json);
    }
}
