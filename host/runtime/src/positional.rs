//! Rows by position: for a processor that asks for them (`positional-rows`), the rows of a
//! batched call are sent as JSON arrays of their values, all of a key's rows in one text,
//! with the column names once per call, when every row is an object with the same columns
//! in the same order. A guest then builds each row from a short array instead of a map, and
//! takes in one string per key instead of one per row (for a Python guest, the biggest
//! costs of reading its input).

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A call's rows by position: the column names, and per group one JSON text holding an
/// array of its rows, each an array of values.
pub(crate) struct Positional {
    pub columns: Vec<String>,
    pub rows: Vec<String>,
}

/// The rows of `groups` by position, or `None` if they do not all have the same columns in
/// the same order, or a value holds an object (a guest decodes nested objects as rows,
/// which needs the names), or a column name has escapes.
pub(crate) fn transcode(groups: &[&[&str]]) -> Option<Positional> {
    let mut columns: Option<Vec<&str>> = None;
    let mut out = Vec::with_capacity(groups.len());
    let mut fields = Vec::new();
    for rows in groups {
        let mut array = String::with_capacity(rows.iter().map(|r| r.len()).sum::<usize>() + 2);
        array.push('[');
        for (n, row) in rows.iter().enumerate() {
            fields.clear();
            let mut de = serde_json::Deserializer::from_str(row);
            de.deserialize_map(FieldsVisitor(&mut fields)).ok()?;
            match &columns {
                None => columns = Some(fields.iter().map(|(name, _)| *name).collect()),
                Some(names) => {
                    if names.len() != fields.len()
                        || names.iter().zip(&fields).any(|(a, (b, _))| a != b)
                    {
                        return None;
                    }
                }
            }
            if n > 0 {
                array.push(',');
            }
            array.push('[');
            for (i, (_, value)) in fields.iter().enumerate() {
                let value = value.get();
                if value.contains('{') {
                    return None;
                }
                if i > 0 {
                    array.push(',');
                }
                array.push_str(value);
            }
            array.push(']');
        }
        array.push(']');
        out.push(array);
    }
    Some(Positional {
        columns: columns?.into_iter().map(str::to_owned).collect(),
        rows: out,
    })
}

/// Collects an object's fields in order, borrowing names and raw values from the text.
struct FieldsVisitor<'v, 'de>(&'v mut Vec<(&'de str, &'de RawValue)>);

impl<'de> Visitor<'de> for FieldsVisitor<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some((name, value)) = map.next_entry::<&'de str, &'de RawValue>()? {
            self.0.push((name, value));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_columns_in_the_same_order_go_by_position() {
        let a: &[&str] = &[r#"{"user":"u1","n":1}"#, r#"{"user":"u\"2","n":[1,null]}"#];
        let b: &[&str] = &[r#"{"user":"u3","n":-2.5e3}"#];
        let p = transcode(&[a, b]).expect("uniform rows");
        assert_eq!(p.columns, ["user", "n"]);
        assert_eq!(
            p.rows,
            [r#"[["u1",1],["u\"2",[1,null]]]"#, r#"[["u3",-2.5e3]]"#]
        );
    }

    #[test]
    fn anything_else_stays_an_object() {
        let cases: &[&[&str]] = &[
            &[r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#],
            &[r#"{"a":1,"b":2}"#, r#"{"a":1}"#],
            &[r#"{"a":{"x":1}}"#],
            &[r#"{"a":[{"x":1}]}"#],
            &[r#"{"a\u0062":1}"#],
        ];
        for rows in cases {
            assert!(transcode(&[rows]).is_none(), "{rows:?}");
        }
    }
}
