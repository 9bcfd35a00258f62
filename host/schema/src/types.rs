//! The schema data model and its rendering back to DDL.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ddl::{self, SchemaError};

/// A Spark SQL data type, restricted to the types Statebox supports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `boolean`: JSON `true` / `false`.
    Boolean,
    /// `int`: a JSON integer within the 32-bit signed range.
    Int,
    /// `long`: a JSON integer within the 64-bit signed range.
    Long,
    /// `float`: any JSON number within the 32-bit float range.
    Float,
    /// `double`: any JSON number.
    Double,
    /// `string`: a JSON string.
    String,
    /// `binary`: a base64 JSON string (standard alphabet, padded).
    Binary,
    /// `timestamp`: integer milliseconds since the Unix epoch, or an ISO-8601 string.
    Timestamp,
    /// `date`: a `"YYYY-MM-DD"` JSON string.
    Date,
    /// `struct<...>`: a JSON object.
    Struct(StructType),
    /// `array<...>`: a JSON array.
    Array {
        /// The type of every element.
        element: Box<DataType>,
        /// Whether elements may be null. Spark's DDL always gives `true`; Statebox's DDL
        /// writes `array<T NOT NULL>` for `false`.
        contains_null: bool,
    },
    /// `map<K, V>`: a JSON object whose member names are the keys rendered as strings.
    Map {
        /// The key type; keys are never null.
        key: Box<DataType>,
        /// The value type.
        value: Box<DataType>,
        /// Whether values may be null. Statebox's DDL writes `map<K, V NOT NULL>` for `false`.
        value_contains_null: bool,
    },
}

impl DataType {
    /// An array type whose elements may be null, as Spark's `array<T>` DDL gives.
    pub fn array(element: DataType) -> DataType {
        DataType::Array {
            element: Box::new(element),
            contains_null: true,
        }
    }

    /// A map type whose values may be null, as Spark's `map<K, V>` DDL gives.
    pub fn map(key: DataType, value: DataType) -> DataType {
        DataType::Map {
            key: Box::new(key),
            value: Box::new(value),
            value_contains_null: true,
        }
    }

    /// The type in DDL syntax, e.g. `array<string>` or `struct<a: int, b: string>`.
    pub fn to_ddl(&self) -> String {
        let mut out = String::new();
        write_type(&mut out, self);
        out
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_ddl())
    }
}

/// One named member of a [`StructType`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    /// The field name, matched case-sensitively against JSON member names.
    pub name: String,
    /// The field's type.
    pub data_type: DataType,
    /// Whether the field may be null or absent.
    pub nullable: bool,
}

impl Field {
    /// A field with the given name, type and nullability.
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Field {
        Field {
            name: name.into(),
            data_type,
            nullable,
        }
    }
}

/// An ordered list of named fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct StructType {
    /// The fields in declaration order, which is also the canonical JSON order.
    pub fields: Vec<Field>,
}

impl StructType {
    /// A struct type with the given fields.
    pub fn new(fields: Vec<Field>) -> StructType {
        StructType { fields }
    }

    /// The field called `name` (case-sensitive), if any.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The position of the field called `name` (case-sensitive), if any.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }
}

/// A parsed schema: a root data type, usually a struct.
///
/// Serialised (with serde) as its DDL text, so it can be stored in checkpoint metadata.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema {
    root: DataType,
}

impl Schema {
    /// A schema whose root is `root`.
    pub fn new(root: DataType) -> Schema {
        Schema { root }
    }

    /// Parses Spark DDL: either a field list (`"name string, visits int"`, read as a struct)
    /// or a single type (`"long"`, `"array<string>"`, `"struct<a: int, b: string>"`,
    /// `"map<string, long>"`). See the crate documentation for the accepted syntax.
    pub fn parse_ddl(ddl: &str) -> Result<Schema, SchemaError> {
        ddl::parse(ddl).map(Schema::new)
    }

    /// The root data type.
    pub fn root(&self) -> &DataType {
        &self.root
    }

    /// The root struct, if the schema is a struct.
    pub fn as_struct(&self) -> Option<&StructType> {
        match &self.root {
            DataType::Struct(s) => Some(s),
            _ => None,
        }
    }

    /// Whether the root is a struct (values are JSON objects).
    pub fn is_struct(&self) -> bool {
        matches!(self.root, DataType::Struct(_))
    }

    /// The schema as DDL that [`Schema::parse_ddl`] reads back to an equal schema.
    ///
    /// A struct root is written as a field list (`name string, visits int NOT NULL`), any
    /// other root as its type (`array<string>`); the empty struct is written `struct<>`.
    pub fn to_ddl(&self) -> String {
        match &self.root {
            DataType::Struct(s) if !s.fields.is_empty() => {
                let mut out = String::new();
                for (i, f) in s.fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_name(&mut out, &f.name);
                    out.push(' ');
                    write_type(&mut out, &f.data_type);
                    if !f.nullable {
                        out.push_str(" NOT NULL");
                    }
                }
                out
            }
            other => other.to_ddl(),
        }
    }
}

impl From<DataType> for Schema {
    fn from(root: DataType) -> Schema {
        Schema::new(root)
    }
}

impl FromStr for Schema {
    type Err = SchemaError;

    fn from_str(ddl: &str) -> Result<Schema, SchemaError> {
        Schema::parse_ddl(ddl)
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_ddl())
    }
}

impl Serialize for Schema {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_ddl())
    }
}

impl<'de> Deserialize<'de> for Schema {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Schema, D::Error> {
        let ddl = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Schema::parse_ddl(&ddl).map_err(serde::de::Error::custom)
    }
}

fn write_type(out: &mut String, ty: &DataType) {
    match ty {
        DataType::Boolean => out.push_str("boolean"),
        DataType::Int => out.push_str("int"),
        DataType::Long => out.push_str("long"),
        DataType::Float => out.push_str("float"),
        DataType::Double => out.push_str("double"),
        DataType::String => out.push_str("string"),
        DataType::Binary => out.push_str("binary"),
        DataType::Timestamp => out.push_str("timestamp"),
        DataType::Date => out.push_str("date"),
        DataType::Array {
            element,
            contains_null,
        } => {
            out.push_str("array<");
            write_type(out, element);
            if !contains_null {
                out.push_str(" NOT NULL");
            }
            out.push('>');
        }
        DataType::Map {
            key,
            value,
            value_contains_null,
        } => {
            out.push_str("map<");
            write_type(out, key);
            out.push_str(", ");
            write_type(out, value);
            if !value_contains_null {
                out.push_str(" NOT NULL");
            }
            out.push('>');
        }
        DataType::Struct(s) => {
            out.push_str("struct<");
            for (i, f) in s.fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_name(out, &f.name);
                out.push_str(": ");
                write_type(out, &f.data_type);
                if !f.nullable {
                    out.push_str(" NOT NULL");
                }
            }
            out.push('>');
        }
    }
}

/// Writes a field name, backquoted unless it is a plain identifier.
fn write_name(out: &mut String, name: &str) {
    let plain = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if plain {
        out.push_str(name);
    } else {
        out.push('`');
        out.push_str(&name.replace('`', "``"));
        out.push('`');
    }
}
