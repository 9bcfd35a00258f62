//! The grouping key of a call.

use std::cell::OnceCell;
use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::{Error, ErrorKind, Result};

/// The grouping key of the call in progress: a JSON array holding the values of the query's key
/// columns, in order, e.g. `["u1"]` or `["u1",7]`.
///
/// The key is decoded only as far as it is asked for, so a processor that ignores it pays
/// nothing.
pub struct Key {
    json: String,
    /// The decoded single string column, for keys whose JSON text has escapes.
    unescaped: OnceCell<Option<String>>,
}

impl Key {
    /// A key from its JSON text. The text is not checked until a column is read.
    pub fn from_json(json: impl Into<String>) -> Self {
        Key {
            json: json.into(),
            unescaped: OnceCell::new(),
        }
    }

    /// The key's JSON text, e.g. `["u1",7]`.
    pub fn json(&self) -> &str {
        &self.json
    }

    /// The key's only column, if the key is exactly one string column.
    pub fn as_str(&self) -> Option<&str> {
        // Most keys are a short string without escapes: borrow it from the JSON text instead of
        // decoding, which keeps this free of allocation on the hot path.
        if let Some(inner) = self
            .json
            .strip_prefix("[\"")
            .and_then(|s| s.strip_suffix("\"]"))
            && !inner.contains(['"', '\\'])
        {
            return Some(inner);
        }
        self.unescaped
            .get_or_init(|| {
                serde_json::from_str::<(String,)>(&self.json)
                    .ok()
                    .map(|(s,)| s)
            })
            .as_deref()
    }

    /// The JSON texts of the key's columns, in order.
    pub fn raw_columns(&self) -> Result<Vec<&str>> {
        let columns: Vec<&RawValue> = serde_json::from_str(&self.json)
            .map_err(|err| Error::json("the grouping key is not a JSON array", err))?;
        Ok(columns.into_iter().map(RawValue::get).collect())
    }

    /// Column `index` (from 0) decoded as `T`.
    pub fn get<T: DeserializeOwned>(&self, index: usize) -> Result<T> {
        let columns = self.raw_columns()?;
        let column = columns.get(index).ok_or_else(|| {
            Error::new(
                ErrorKind::Json,
                format!(
                    "the grouping key has {} column(s), no column {index}",
                    columns.len()
                ),
            )
        })?;
        serde_json::from_str(column)
            .map_err(|err| Error::json(&format!("grouping key column {index}"), err))
    }

    /// The whole key decoded as `T`, usually a tuple such as `(String, i64)`.
    pub fn to<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_str(&self.json).map_err(|err| Error::json("grouping key", err))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.json)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.json)
    }
}

impl serde::Serialize for Key {
    /// Serializes as the key's JSON array, so a `Key` can be passed wherever the test harness
    /// takes a key.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let raw: &RawValue = serde_json::from_str(&self.json).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_string_column() {
        assert_eq!(Key::from_json(r#"["u1"]"#).as_str(), Some("u1"));
        assert_eq!(Key::from_json(r#"["a\"b"]"#).as_str(), Some("a\"b"));
        assert_eq!(Key::from_json(r#"[ "u1" ]"#).as_str(), Some("u1"));
        assert_eq!(Key::from_json("[7]").as_str(), None);
        assert_eq!(Key::from_json(r#"["a","b"]"#).as_str(), None);
    }

    #[test]
    fn columns_and_tuples() {
        let key = Key::from_json(r#"["u1",7]"#);
        assert_eq!(key.get::<String>(0).unwrap(), "u1");
        assert_eq!(key.get::<i64>(1).unwrap(), 7);
        assert_eq!(key.get::<i64>(2).unwrap_err().kind(), ErrorKind::Json);
        assert_eq!(key.to::<(String, i64)>().unwrap(), ("u1".to_owned(), 7));
        assert_eq!(key.raw_columns().unwrap(), vec![r#""u1""#, "7"]);
        assert_eq!(serde_json::to_string(&key).unwrap(), r#"["u1",7]"#);
    }
}
