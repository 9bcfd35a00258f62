//! The per-batch change log: for each partition of a committed batch, every value, list
//! element and map entry the batch changed, with its new stored bytes or as a delete.
//!
//! A `(batch, partition)`'s log is stored in chunks of whole entries, each a RocksDB value of
//! about 32 KiB (`CHUNK_BYTES`; [`keys::changelog_chunk_key`]; logs written before chunks were are
//! one value, [`keys::changelog_key`], and read the same). The entries are back to back,
//! each `[keylen u32][state key][tag u8]` followed by `[len u32][stored value]` when the tag
//! is a put (`PUT`, `PUT_BEFORE`). Tags `DELETE_BEFORE` and
//! `PUT_BEFORE` add the key's before-image, its committed bytes before the batch:
//! `[present u8]`, then `[len u32][stored value]` when present. Undoing the batches after
//! `N`, newest first, with the before-images gives the state committed at batch `N` (see
//! [`crate::Checkpoint::undo_since`]). The state key is the full key of the value, element or entry
//! (`[ns][var][keylen][key][suffix]`). Entries of one log are concatenations, so logs built
//! in different places (a transaction's seal, a commit's range enumeration) simply append.
//!
//! A batch marker ([`keys::changelog_marker`]) is written for every batch whose log was
//! recorded, changed or not, so the retained batch range is known.

use crate::engine::{KvEngine, PREFETCH_AHEAD, WriteOp, prefetch};
use crate::{Result, StoreError, keys};

/// Tag of a delete entry without a before-image (logs written before before-images were).
const DELETE: u8 = 0;
/// Tag of a put entry without a before-image.
const PUT: u8 = 1;
/// Tag of a delete entry followed by its before-image.
const DELETE_BEFORE: u8 = 2;
/// Tag of a put entry followed by its before-image.
const PUT_BEFORE: u8 = 3;

/// Bytes a stored chunk of a change log reaches before the next entry starts another (see
/// [`chunks`]).
///
/// A batch's logs are several MiB per partition. Stored whole, each was one table-file block
/// of that size: RocksDB copied it into a block buffer that grew to it (twice, the second
/// time to append the block's trailer), on fresh memory, then compressed it in one piece. In
/// chunks the block buffer is reused, and stays in the CPU's caches.
pub(crate) const CHUNK_BYTES: usize = 32 << 10;

/// `log` cut at entry boundaries into runs of whole entries: each run the fewest entries
/// that reach `target` bytes, the last whatever is left. The runs concatenated are `log`;
/// an entry longer than `target` is a run of its own. A malformed tail (no log the seal
/// builds has one) is the last run, as it is.
pub(crate) fn chunks(log: &[u8], target: usize) -> impl Iterator<Item = &[u8]> {
    let mut rest = log;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut entries = decode(rest);
        let mut taken = 0;
        while taken < target {
            match entries.next() {
                Some(Ok(_)) => taken = rest.len() - entries.rest.len(),
                _ => {
                    taken = rest.len();
                    break;
                }
            }
        }
        let (chunk, after) = rest.split_at(taken);
        rest = after;
        Some(chunk)
    })
}

/// Whether writes to namespace `ns` belong in the change log: state values, list elements
/// and map entries, and timers (by key; the by-time index mirrors it), so that state and
/// timers at any retained batch can be reconstructed.
#[inline]
pub(crate) fn logged(ns: u8) -> bool {
    matches!(
        ns,
        keys::VALUE | keys::LIST | keys::MAP | keys::TIMER_BY_KEY
    )
}

/// What one batch's change logs did, counted from their entries and before-images.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeStats {
    /// Values, list elements and map entries written (new or overwritten).
    pub rows_updated: u64,
    /// Of those, the ones that did not exist before the batch.
    pub rows_added: u64,
    /// Values, list elements and map entries that existed before the batch and were removed
    /// (by the processor, a clear, TTL cleanup or a dropped variable).
    pub rows_removed: u64,
    /// Timers registered that were not registered before the batch.
    pub timers_added: u64,
    /// Timers registered before the batch and removed by it (fired or deleted).
    pub timers_removed: u64,
}

impl ChangeStats {
    /// Counts the entries of one change log.
    pub fn add_log(&mut self, log: &[u8]) -> Result<()> {
        for change in decode(log) {
            let change = change?;
            let existed = change.before.map(|before| before.is_some());
            self.count(change.key, change.value.is_some(), existed);
        }
        Ok(())
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &ChangeStats) {
        self.rows_updated += other.rows_updated;
        self.rows_added += other.rows_added;
        self.rows_removed += other.rows_removed;
        self.timers_added += other.timers_added;
        self.timers_removed += other.timers_removed;
    }

    /// Counts one entry: a put or a delete of `key`, which existed before the batch or not
    /// (`None`: unknown, counted neither as new nor as removed).
    #[inline]
    fn count(&mut self, key: &[u8], put: bool, existed: Option<bool>) {
        let timer = key.first() == Some(&keys::TIMER_BY_KEY);
        let existed_u = u64::from(existed == Some(true));
        let is_new = u64::from(existed == Some(false));
        match (put, timer) {
            (true, false) => {
                self.rows_updated += 1;
                self.rows_added += is_new;
            }
            (false, false) => self.rows_removed += existed_u,
            (true, true) => self.timers_added += is_new,
            (false, true) => self.timers_removed += existed_u,
        }
    }
}

/// Appends one entry: `value` is the new stored bytes, `None` a delete; `before` the
/// committed bytes before the batch, `None` if the key had none.
#[inline]
pub(crate) fn push(out: &mut Vec<u8>, key: &[u8], value: Option<&[u8]>, before: Option<&[u8]>) {
    out.extend_from_slice(&len32(key.len()).to_be_bytes());
    out.extend_from_slice(key);
    match value {
        Some(v) => {
            out.push(PUT_BEFORE);
            push_bytes(out, v);
        }
        None => out.push(DELETE_BEFORE),
    }
    match before {
        Some(b) => {
            out.push(1);
            push_bytes(out, b);
        }
        None => out.push(0),
    }
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&len32(bytes.len()).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// A change log being written: its entries, their counts, and the offsets where [`chunks`]
/// cuts it, noted as the entries are written so that the commit need not read them again.
#[derive(Debug)]
pub(crate) struct Log {
    pub bytes: Vec<u8>,
    pub stats: ChangeStats,
    /// The ends of its first chunks, each the end of the first entry that reaches
    /// [`CHUNK_BYTES`] since the last: all of them while every entry came through
    /// [`Log::push`], else the ones before the first that did not.
    chunk_ends: Vec<usize>,
    /// Whether every entry came through [`Log::push`].
    tracked: bool,
}

impl Default for Log {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl Log {
    /// An empty log, with room for `bytes` bytes.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            bytes: Vec::with_capacity(bytes),
            stats: ChangeStats::default(),
            chunk_ends: Vec::new(),
            tracked: true,
        }
    }

    /// Appends one entry and counts it (see [`push`]).
    #[inline]
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>, before: Option<&[u8]>) {
        push(&mut self.bytes, key, value, before);
        self.stats
            .count(key, value.is_some(), Some(before.is_some()));
        let start = self.chunk_ends.last().copied().unwrap_or(0);
        if self.tracked && self.bytes.len() - start >= CHUNK_BYTES {
            self.chunk_ends.push(self.bytes.len());
        }
    }

    /// Appends `other`'s entries and counts. Where its chunks end in this log is not noted:
    /// [`Log::chunks`] reads its entries to cut them.
    pub fn append(&mut self, other: Log) {
        if self.bytes.is_empty() {
            *self = other;
            return;
        }
        self.bytes.extend_from_slice(&other.bytes);
        self.stats.add(&other.stats);
        self.tracked = false;
    }

    /// The log cut into chunks, as [`chunks`] cuts it with [`CHUNK_BYTES`]: the noted ones,
    /// then the rest read entry by entry.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        let noted = self.chunk_ends.iter().map(move |&end| {
            let chunk = &self.bytes[start..end];
            start = end;
            chunk
        });
        let rest = self.chunk_ends.last().map_or(0, |&end| end);
        noted.chain(chunks(&self.bytes[rest..], CHUNK_BYTES))
    }
}

/// Appends the entries of the logged point writes among `ops`, reading each key's
/// before-image from `engine` (the committed state the batch ran on) in one batched read;
/// the operations at the indexes in `known` (ascending) have their before-image given
/// (`None`: the key had no committed value), and are not read.
pub(crate) fn push_ops(
    out: &mut Log,
    ops: &[WriteOp],
    known: &[(usize, Option<&[u8]>)],
    engine: &dyn KvEngine,
) -> Result<()> {
    // The logged writes whose before-image is not known, by op index (usually few: the
    // batch read most of what it wrote).
    let mut read: Vec<usize> = Vec::new();
    let mut keys: Vec<&[u8]> = Vec::new();
    let mut known_at = known.iter().map(|(at, _)| *at).peekable();
    for (i, op) in ops.iter().enumerate() {
        let is_known = known_at.next_if_eq(&i).is_some();
        if let Some((key, _)) = logged_write(op)
            && !is_known
        {
            read.push(i);
            keys.push(key);
        }
    }
    // Entries go out in op order: the known ones before each read one as it is answered
    // (`get_many` answers in order), the rest after.
    let mut next_known = 0;
    let mut push_known = |out: &mut Log, from: usize, to: usize| {
        for (i, op) in (from..to).zip(&ops[from..to]) {
            if let Some(ahead) = ops.get(i + PREFETCH_AHEAD) {
                ahead.prefetch();
            }
            if let Some((_, Some(ahead))) = known.get(next_known + PREFETCH_AHEAD) {
                prefetch(ahead);
            }
            let before = match known.get(next_known) {
                Some(&(at, before)) if at == i => {
                    next_known += 1;
                    Some(before)
                }
                _ => None,
            };
            if let Some((key, value)) = logged_write(op) {
                out.push(key, value, before.flatten());
            }
        }
    };
    let mut next = 0;
    if !keys.is_empty() {
        engine.get_many(&keys, &mut |j, before| {
            let at = read[j];
            push_known(out, next, at);
            if let Some((key, value)) = logged_write(&ops[at]) {
                out.push(key, value, before);
            }
            next = at + 1;
            Ok(())
        })?;
    }
    push_known(out, next, ops.len());
    Ok(())
}

/// The key and new value (`None`: deleted) of a point write the change log records.
#[inline]
fn logged_write(op: &WriteOp) -> Option<(&[u8], Option<&[u8]>)> {
    let (key, value) = match op {
        WriteOp::Put(k, v) => (k.as_slice(), Some(v.as_slice())),
        WriteOp::Delete(k) => (k.as_slice(), None),
        WriteOp::DeleteRange(..) => return None,
    };
    key.first()
        .is_some_and(|&ns| logged(ns))
        .then_some((key, value))
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
    /// The before-image: the committed bytes before the batch (`Some(None)` if the key had
    /// none); `None` when the log did not record it.
    pub before: Option<Option<&'a [u8]>>,
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
        let tag = self.take(1)?[0];
        let value = match tag {
            DELETE | DELETE_BEFORE => None,
            PUT | PUT_BEFORE => Some(self.bytes()?),
            _ => return Err(StoreError::Corrupt("malformed change log".into())),
        };
        let before = match tag {
            DELETE_BEFORE | PUT_BEFORE => Some(match self.take(1)?[0] {
                0 => None,
                1 => Some(self.bytes()?),
                _ => return Err(StoreError::Corrupt("malformed change log".into())),
            }),
            _ => None,
        };
        Ok(Change { key, value, before })
    }

    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
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
        push(&mut log, b"\x02k1", Some(b"v1"), None);
        push(&mut log, b"\x05k2", None, Some(b"old"));
        push(&mut log, b"", Some(b""), Some(b""));
        // An entry of a log written without before-images.
        log.extend_from_slice(b"\0\0\0\x02\x03k\x01\0\0\0\x01v");
        let got: Vec<Change<'_>> = decode(&log).collect::<Result<_>>().unwrap();
        assert_eq!(
            got,
            [
                Change {
                    key: b"\x02k1",
                    value: Some(b"v1"),
                    before: Some(None),
                },
                Change {
                    key: b"\x05k2",
                    value: None,
                    before: Some(Some(b"old")),
                },
                Change {
                    key: b"",
                    value: Some(b""),
                    before: Some(Some(b"")),
                },
                Change {
                    key: b"\x03k",
                    value: Some(b"v"),
                    before: None,
                },
            ]
        );
        let cut: Vec<Result<Change<'_>>> = decode(&log[..log.len() - 2]).collect();
        assert_eq!(cut.len(), 4);
        assert!(cut[3].is_err());
        assert_eq!(decode(&[]).count(), 0);
    }

    #[test]
    fn chunks_are_runs_of_whole_entries_reaching_the_target() {
        let mut log = Vec::new();
        let mut sizes = Vec::new();
        for i in 0..200usize {
            let before = log.len();
            // Entries of 20 to about 1,100 bytes, and one far longer than the target.
            let value = vec![b'v'; if i == 50 { 5_000 } else { (i * 37) % 1_080 }];
            push(
                &mut log,
                format!("\x02key{i}").as_bytes(),
                Some(&value),
                Some(b"old"),
            );
            sizes.push(log.len() - before);
        }
        for target in [1, 100, 2_048, 4_096, log.len(), log.len() + 1] {
            let got: Vec<&[u8]> = chunks(&log, target).collect();
            assert_eq!(got.concat(), log, "target {target}");
            let mut entry = 0;
            for (n, chunk) in got.iter().enumerate() {
                let count = decode(chunk).inspect(|c| assert!(c.is_ok())).count();
                assert!(count > 0, "target {target}: chunk {n} is empty");
                let without_last: usize = sizes[entry..entry + count - 1].iter().sum();
                assert!(
                    without_last < target,
                    "target {target}: chunk {n} is not the fewest"
                );
                if n + 1 < got.len() {
                    assert!(chunk.len() >= target, "target {target}: chunk {n} is short");
                }
                entry += count;
            }
            assert_eq!(entry, sizes.len());
        }
        assert_eq!(chunks(&[], 10).count(), 0);
        let mut bad = log[..100].to_vec();
        bad.extend_from_slice(b"\xff\xff");
        assert_eq!(chunks(&bad, 1).collect::<Vec<_>>().concat(), bad);
    }

    /// A log written entry by entry notes where its chunks end as [`chunks`] would cut it;
    /// after another log is appended to it, or it to an empty one, the rest is read to cut
    /// it, and the counts are those of all the entries.
    #[test]
    fn a_logs_noted_chunks_are_those_its_entries_give() {
        let mut rng = crate::xorshift(3);
        let mut entries = |log: &mut Log, n: usize| {
            for i in 0..n {
                // Entries of up to ~12 KiB, one in twenty longer than a chunk.
                let len = if rng().is_multiple_of(20) {
                    CHUNK_BYTES + 100
                } else {
                    (rng() % 12_000) as usize
                };
                let key = format!("\x02key{i}");
                let value = vec![b'v'; len];
                match rng() % 3 {
                    0 => log.push(key.as_bytes(), Some(&value), None),
                    1 => log.push(key.as_bytes(), None, Some(&value)),
                    _ => log.push(b"\x06timer", Some(b"t"), Some(&value)),
                }
            }
        };
        let check = |log: &Log, what: &str| {
            assert!(
                log.chunks().eq(chunks(&log.bytes, CHUNK_BYTES)),
                "{what}: the chunks differ"
            );
            let mut counted = ChangeStats::default();
            counted.add_log(&log.bytes).unwrap();
            assert_eq!(log.stats, counted, "{what}: the counts differ");
        };
        let mut log = Log::default();
        assert_eq!(log.chunks().count(), 0);
        // Two entries of exactly a chunk's bytes (a 2-byte key, 10 bytes of framing): each
        // reaches the target on its own.
        for _ in 0..2 {
            log.push(b"\x02k", Some(&vec![b'v'; CHUNK_BYTES - 12]), None);
        }
        assert_eq!(log.chunk_ends, [CHUNK_BYTES, 2 * CHUNK_BYTES]);
        entries(&mut log, 40);
        assert!(log.chunk_ends.len() > 2);
        check(&log, "written entry by entry");
        let mut other = Log::with_capacity(100);
        entries(&mut other, 30);
        log.append(other);
        check(&log, "with another appended");
        entries(&mut log, 30);
        check(&log, "with more entries after that");
        let mut other = Log::default();
        entries(&mut other, 30);
        let mut empty = Log::default();
        empty.append(other);
        entries(&mut empty, 30);
        check(&empty, "appended to an empty one, then written");
    }
}
