//! Spark-style schemas for Statebox.
//!
//! Rows, grouping keys and state values cross the WebAssembly boundary as compact JSON
//! text. This crate parses the schemas processors declare (Spark's DDL syntax), validates
//! JSON against them in a single streaming pass, re-encodes values canonically (so equal
//! keys have equal bytes), scans input rows, and decides which schema changes existing
//! state can survive.
//!
//! # Schemas in DDL
//!
//! A schema is either a list of fields, read as a struct (`"name string, visits int"`), or
//! a single type (`"long"`, `"array<string>"`, `"map<string, long>"`,
//! `"struct<city: string, zip: int>"`). Type names are case-insensitive; field names keep
//! their case and may be backquoted (`` `first name` string``). Inside `struct<...>` a `:`
//! may separate name and type. A field may end in `NOT NULL` and `COMMENT '...'` (the
//! comment is ignored). Aliases: `bool`; `integer`, and the narrower `smallint`, `short`,
//! `tinyint`, `byte`, all read as `int`; `bigint` for `long`; `real` for `float`;
//! `varchar(n)` / `char(n)` for `string`; `timestamp_ltz` / `timestamp_ntz` for
//! `timestamp`. As a Statebox extension, `array<T NOT NULL>` and `map<K, V NOT NULL>`
//! forbid null elements and values (Spark's DDL cannot say this). `decimal` and intervals
//! are not supported.
//!
//! # Values as JSON
//!
//! | type | JSON |
//! |---|---|
//! | `boolean` | `true` or `false` |
//! | `int` | an integer within the 32-bit range (`-2147483648` … `2147483647`) |
//! | `long` | an integer within the 64-bit range; `1.5`, `1.0` and `1e3` are rejected |
//! | `float` | any number within the 32-bit float range (integers too) |
//! | `double` | any number (integers too) |
//! | `string` | a string |
//! | `binary` | a base64 string, standard alphabet, padded (`"aGk="`) |
//! | `timestamp` | integer milliseconds since the Unix epoch, or an ISO-8601 / RFC 3339 string: `"2024-01-01T00:00:00Z"`, `"2024-01-01T00:00:00.123+02:00"`; `T` may be a space, seconds and offset may be left out (no offset means UTC), and a bare date means midnight UTC. Precision is milliseconds: finer fractions are truncated |
//! | `date` | a `"YYYY-MM-DD"` string (years 0000–9999) |
//! | `array<T>` | an array; null elements only if the element type allows them |
//! | `map<K, V>` | an object whose member names are the keys as text; for non-string key types the text must parse as that type (`{"1": "a"}` for `map<int, string>`; complex keys are their JSON text) |
//! | `struct<...>` | an object; member names match field names exactly (case-sensitive); a missing nullable field reads as null; a missing `NOT NULL` field is an error |
//!
//! Null is allowed wherever the field, element or value is nullable. A whole value (a
//! schema's root) may never be null, and a struct schema requires a JSON object. Members
//! a struct does not name are an error for state values and output rows
//! ([`Strictness::Strict`]) and skipped for input rows
//! ([`Strictness::IgnoreUnknownFields`]). A member appearing twice is an error.
//!
//! Errors name the offending value's path (`address.zip`, `tags[3]`,
//! `attributes['color']`), what was expected and what was found:
//! ``column `visits`: expected int, found string "x"``.
//!
//! # Canonical encoding
//!
//! [`Schema::canonicalize`] documents the canonical form. In short: no whitespace, struct
//! fields in schema order with absent nullable fields written as `null`, floats in
//! shortest form with a `.0` for whole numbers, timestamps as integer milliseconds, map
//! entries sorted by key text.

mod ddl;
mod evolution;
mod scalar;
mod scanner;
mod types;
mod value;

pub use ddl::SchemaError;
pub use evolution::{EvolutionError, check_evolution, evolve_json};
pub use scanner::RowScanner;
pub use serde_json::value::RawValue;
pub use types::{DataType, Field, Schema, StructType};
pub use value::{Strictness, ValueError};

/// Reads the timestamp JSON of an event-time column (as captured by [`RowScanner`]) into
/// milliseconds since the Unix epoch. Accepts the same forms as the `timestamp` type.
pub fn timestamp_millis(json: &str) -> Result<i64, ValueError> {
    let out = value::canonicalize_with(&DataType::Timestamp, json, Strictness::Strict)?;
    out.parse::<i64>().map_err(|_| ValueError {
        path: String::new(),
        message: format!("expected a timestamp, found {out}"),
    })
}

#[cfg(test)]
mod tests;
