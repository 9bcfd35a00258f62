//! The per-batch change log: for each partition of a committed batch, every value, list
//! element and map entry the batch changed, with its new stored bytes or as a delete.
//!
//! One RocksDB value per `(batch, partition)` ([`keys::changelog_key`]) holds the entries
//! back to back, each `[keylen u32][state key][tag u8]` followed by `[len u32][stored value]`
//! when the tag is [`PUT`]. The state key is the full key of the value, element or entry
//! (`[ns][var][keylen][key][suffix]`). Entries of one log are concatenations, so logs built
//! in different places (a transaction's seal, a commit's range enumeration) simply append.
//!
//! A batch marker ([`keys::changelog_marker`]) is written for every batch whose log was
//! recorded, changed or not, so the retained batch range is known.

use crate::engine::WriteOp;
use crate::{Result, StoreError, keys};

/// Tag of a delete entry.
const DELETE: u8 = 0;
/// Tag of a put entry.
const PUT: u8 = 1;

/// Whether writes to namespace `ns` belong in the change log.
#[inline]
pub(crate) fn logged(ns: u8) -> bool {
    matches!(ns, keys::VALUE | keys::LIST | keys::MAP)
}

/// Appends one entry: `value` is the new stored bytes, `None` a delete.
#[inline]
pub(crate) fn push(out: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>) {
    out.extend_from_slice(&len32(key.len()).to_be_bytes());
    out.extend_from_slice(key);
    match value {
        Some(v) => {
            out.push(PUT);
            out.extend_from_slice(&len32(v.len()).to_be_bytes());
            out.extend_from_slice(v);
        }
        None => out.push(DELETE),
    }
}

/// Appends the entries of the logged point writes among `ops`.
pub(crate) fn push_ops(out: &mut Vec<u8>, ops: &[WriteOp]) {
    // One allocation of the exact size.
    let size: usize = ops
        .iter()
        .map(|op| match op {
            WriteOp::Put(k, v) if k.first().is_some_and(|&ns| logged(ns)) => {
                4 + k.len() + 1 + 4 + v.len()
            }
            WriteOp::Delete(k) if k.first().is_some_and(|&ns| logged(ns)) => 4 + k.len() + 1,
            _ => 0,
        })
        .sum();
    out.reserve_exact(size);
    for op in ops {
        match op {
            WriteOp::Put(k, v) if k.first().is_some_and(|&ns| logged(ns)) => push(out, k, Some(v)),
            WriteOp::Delete(k) if k.first().is_some_and(|&ns| logged(ns)) => push(out, k, None),
            _ => {}
        }
    }
}

fn len32(len: usize) -> u32 {
    // Keys and values come from a wasm32 guest, far below 4 GiB.
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// One change of a change log, borrowed from its stored bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change<'a> {
    /// The full state key (`[ns][var][keylen][key][suffix]`); split it with
    /// [`keys::decode_var_key`] after reading the namespace byte.
    pub key: &'a [u8],
    /// The new stored value bytes (decode with [`crate::StoredValue::decode`]); `None` for a
    /// delete.
    pub value: Option<&'a [u8]>,
}

/// The changes of one stored change log, in the order they were logged.
pub fn decode(bytes: &[u8]) -> Changes<'_> {
    Changes { rest: bytes }
}

/// Iterator of [`decode`]; stops after the first error.
#[derive(Debug)]
pub struct Changes<'a> {
    rest: &'a [u8],
}

impl<'a> Changes<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.rest.len() < n {
            return Err(StoreError::Corrupt("malformed change log".into()));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn len(&mut self) -> Result<usize> {
        let b = self.take(4)?;
        let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        usize::try_from(n).map_err(|_| StoreError::Corrupt("malformed change log".into()))
    }

    fn entry(&mut self) -> Result<Change<'a>> {
        let n = self.len()?;
        let key = self.take(n)?;
        let value = match self.take(1)?[0] {
            DELETE => None,
            PUT => {
                let n = self.len()?;
                Some(self.take(n)?)
            }
            _ => return Err(StoreError::Corrupt("malformed change log".into())),
        };
        Ok(Change { key, value })
    }
}

impl<'a> Iterator for Changes<'a> {
    type Item = Result<Change<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let entry = self.entry();
        if entry.is_err() {
            self.rest = &[];
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_roundtrip_and_truncation_is_corrupt() {
        let mut log = Vec::new();
        push(&mut log, b"\x02k1", Some(b"v1"));
        push(&mut log, b"\x05k2", None);
        push(&mut log, b"", Some(b""));
        let got: Vec<Change<'_>> = decode(&log).collect::<Result<_>>().unwrap();
        assert_eq!(
            got,
            [
                Change {
                    key: b"\x02k1",
                    value: Some(b"v1")
                },
                Change {
                    key: b"\x05k2",
                    value: None
                },
                Change {
                    key: b"",
                    value: Some(b"")
                },
            ]
        );
        let cut: Vec<Result<Change<'_>>> = decode(&log[..log.len() - 2]).collect();
        assert_eq!(cut.len(), 3);
        assert!(cut[2].is_err());
        assert_eq!(decode(&[]).count(), 0);
    }
}
