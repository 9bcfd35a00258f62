//! Decoding input: JSON Lines → (grouping key, row) → partition, grouped by key in
//! arrival order.

use std::collections::HashMap;

use statebox_schema::RowScanner;

use crate::EngineError;
use crate::source::FileRange;

/// Where an input row came from, to name it in errors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Origin {
    /// Index of the file range in the batch plan.
    pub file: u32,
    /// 1-based line number in the file.
    pub line: u64,
}

/// All rows of one grouping key in one batch.
pub(crate) struct Group {
    /// The key: a JSON array of the key columns' values.
    pub key: String,
    /// The rows, in arrival order.
    pub rows: Vec<String>,
    /// Where each row came from.
    pub origins: Vec<Origin>,
}

/// One partition's input for a batch: groups in order of each key's first row.
#[derive(Default)]
pub(crate) struct PartitionInput {
    groups: Vec<Group>,
    index: HashMap<String, usize>,
}

impl PartitionInput {
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    pub fn groups(&self) -> &[Group] {
        &self.groups
    }

    fn push(&mut self, key: String, row: String, origin: Origin) {
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.groups.len();
                self.index.insert(key.clone(), i);
                self.groups.push(Group {
                    key,
                    rows: Vec::new(),
                    origins: Vec::new(),
                });
                i
            }
        };
        let g = &mut self.groups[i];
        g.rows.push(row);
        g.origins.push(origin);
    }
}

/// Decodes one file range into the partitions. Returns the number of rows read.
pub(crate) fn decode(
    text: &str,
    range: &FileRange,
    file_idx: usize,
    file_name: &str,
    scanner: &RowScanner,
    key_columns: &[String],
    partitions: &mut [PartitionInput],
) -> Result<u64, EngineError> {
    let mut rows = 0;
    let mut key = String::new();
    for (i, line) in text.split('\n').enumerate() {
        let line_no = range.first_line + i as u64;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| EngineError::Input {
            file: file_name.to_owned(),
            line: line_no,
            message,
        };
        let columns = scanner.scan(line).map_err(|e| bad(e.to_string()))?;
        key.clear();
        key.push('[');
        for (c, value) in key_columns.iter().zip(&columns) {
            let Some(value) = value else {
                return Err(bad(format!("the row has no key column `{c}`")));
            };
            if key.len() > 1 {
                key.push(',');
            }
            push_canonical(&mut key, value.get());
        }
        key.push(']');
        let p = partition_of(key.as_bytes(), partitions.len());
        partitions[p].push(
            key.clone(),
            line.to_owned(),
            Origin {
                file: file_idx as u32,
                line: line_no,
            },
        );
        rows += 1;
    }
    Ok(rows)
}

/// Appends a key column's JSON in canonical form, so that equal values make equal keys
/// however the input spelled them (whitespace, escapes, `1.0` vs `1e0`).
fn push_canonical(out: &mut String, raw: &str) {
    let raw = raw.trim();
    let simple_string =
        raw.len() >= 2 && raw.starts_with('"') && !raw[1..raw.len() - 1].contains(['\\', '"']);
    let simple_int = !raw.is_empty()
        && raw
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
        && raw != "-";
    if simple_string || simple_int {
        out.push_str(raw);
    } else {
        match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(v) => out.push_str(&v.to_string()),
            Err(_) => out.push_str(raw),
        }
    }
}

/// The state partition of a key: FNV-1a, stable across runs and machines (a checkpoint's
/// partitioning must never change).
pub(crate) fn partition_of(key: &[u8], partitions: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % partitions as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_keys_ignore_spelling() {
        let mut a = String::new();
        push_canonical(&mut a, " \"u1\" ");
        let mut b = String::new();
        push_canonical(&mut b, "\"\\u00751\"");
        assert_eq!(a, b);
        let mut n = String::new();
        push_canonical(&mut n, "-42");
        assert_eq!(n, "-42");
    }

    #[test]
    fn partitioning_is_stable() {
        // These values are part of the checkpoint format: changing them would move keys
        // between partitions of existing checkpoints.
        assert_eq!(partition_of(b"[\"u1\"]", 4), partition_of(b"[\"u1\"]", 4));
        assert_eq!(
            partition_of(b"", 7),
            (0xcbf2_9ce4_8422_2325u64 % 7) as usize
        );
    }
}
