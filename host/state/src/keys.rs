//! The byte layout of every stored key.
//!
//! Every key starts with a namespace byte; integers are big-endian and `i64` timestamps have
//! their sign bit flipped, so the store's byte order is the logical order everywhere (list
//! elements by sequence, timers by time, TTL entries by expiry). Grouping keys carry a `u32`
//! length prefix, which makes every per-key prefix unambiguous: no key's prefix is a prefix
//! of another key's.
//!
//! | namespace | layout |
//! |---|---|
//! | [`PLAN`] | `[0x00][batch u64]` |
//! | [`META`] | `[0x01][name]` |
//! | [`VALUE`] | `[0x02][var u32][keylen u32][key]` |
//! | [`LIST`] | `[0x03][var u32][keylen u32][key][seq u64]` |
//! | [`LIST_META`] | `[0x04][var u32][keylen u32][key]` → next sequence `u64` |
//! | [`MAP`] | `[0x05][var u32][keylen u32][key][user key]` |
//! | [`TIMER_BY_KEY`] | `[0x06][keylen u32][key][ts i64]` |
//! | [`TIMER_BY_TIME`] | `[0x07][partition u16][ts i64][key]` |
//! | [`TTL`] | `[0x08][partition u16][expiry i64][state key]` |
//! | [`CHANGELOG`] | `[0x09][batch u64]` (batch marker), `[0x09][batch u64][partition u16]` |
//!
//! The variable id comes right after the namespace so dropping a variable is one range
//! delete per namespace ([`var_range`]).
//!
//! Functions named `*_key` build one key; `*_prefix` build the prefix shared by a group of
//! keys, and `*_range` give a half-open `[start, end)` range for scans and range deletes.

use crate::{Partition, Result, StoreError, VarId};

/// Batch plans, logged before their batch runs. Below every other namespace, so that no
/// commit's key range covers a plan: a large commit is ingested as table files, and
/// RocksDB must flush the memtable first if it holds a key in a file's range.
pub const PLAN: u8 = 0x00;
/// Named metadata blobs (query config, catalog, commit log).
pub const META: u8 = 0x01;
/// Value state values.
pub const VALUE: u8 = 0x02;
/// List state elements.
pub const LIST: u8 = 0x03;
/// Per-list metadata: the next element sequence.
pub const LIST_META: u8 = 0x04;
/// Map state entries.
pub const MAP: u8 = 0x05;
/// Timers ordered by grouping key, then time.
pub const TIMER_BY_KEY: u8 = 0x06;
/// Timers ordered by partition, then time, then grouping key.
pub const TIMER_BY_TIME: u8 = 0x07;
/// TTL index: partition, expiry, then the full key of the expiring entry.
pub const TTL: u8 = 0x08;

/// Per-batch change logs: a marker per committed batch and one entry list per partition
/// that changed state (see [`crate::changelog`]).
pub const CHANGELOG: u8 = 0x09;

/// The per-variable namespaces, i.e. everything [`Commit::drop_vars`](crate::Commit) removes.
pub const VAR_NAMESPACES: [u8; 4] = [VALUE, LIST, LIST_META, MAP];

/// Length of a list element key's sequence suffix.
pub const SEQ_LEN: usize = 8;
/// Length of an encoded timestamp.
pub const TS_LEN: usize = 8;
/// Length of `[namespace][partition]`.
const PARTITION_PREFIX_LEN: usize = 3;

/// The hash of a grouping key (its canonical JSON text) that chooses its state partition:
/// the partition is this modulo the partition count. FNV-1a: stable across runs and
/// machines, as a checkpoint's partitioning must never change. The state cache chooses a
/// key's shard by it too (see [`crate::cache`]).
#[inline]
pub fn grouping_key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Encodes an `i64` so that byte order equals numeric order.
#[inline]
pub fn encode_i64(v: i64) -> [u8; 8] {
    ((v as u64) ^ (1 << 63)).to_be_bytes()
}

/// Inverse of [`encode_i64`].
#[inline]
pub fn decode_i64(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// Checks that a grouping key fits the layout's `u32` length prefix.
#[inline]
pub fn check_key(key: &[u8]) -> Result<()> {
    if u32::try_from(key.len()).is_err() {
        return Err(StoreError::KeyTooLarge { len: key.len() });
    }
    Ok(())
}

/// Appends `[keylen u32][key]`. Callers have passed the key through [`check_key`].
#[inline]
fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    // `check_key` guarantees the length fits; saturating keeps this total regardless.
    let len = u32::try_from(key.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(key);
}

/// Writes `[ns][var][keylen][key]` into `out` (cleared first).
#[inline]
pub fn var_key_prefix_into(out: &mut Vec<u8>, ns: u8, var: VarId, key: &[u8]) {
    out.clear();
    out.reserve(VAR_KEY_OVERHEAD + key.len() + SEQ_LEN);
    push_var_key(out, ns, var, key, &[]);
}

/// Bytes a `[ns][var][keylen][key][suffix]` key takes besides its grouping key and suffix.
pub(crate) const VAR_KEY_OVERHEAD: usize = 1 + 4 + 4;

/// Appends `[ns][var][keylen][key][suffix]`, the inverse of [`decode_var_key`].
#[inline]
pub(crate) fn push_var_key(out: &mut Vec<u8>, ns: u8, var: VarId, key: &[u8], suffix: &[u8]) {
    out.push(ns);
    out.extend_from_slice(&var.to_be_bytes());
    push_key(out, key);
    out.extend_from_slice(suffix);
}

/// `[ns][var][keylen][key]`: the prefix of one grouping key's entries of one variable.
pub fn var_key_prefix(ns: u8, var: VarId, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    var_key_prefix_into(&mut out, ns, var, key);
    out
}

/// The key of a value state's value.
pub fn value_key(var: VarId, key: &[u8]) -> Vec<u8> {
    var_key_prefix(VALUE, var, key)
}

/// The prefix of all elements of one list.
pub fn list_prefix(var: VarId, key: &[u8]) -> Vec<u8> {
    var_key_prefix(LIST, var, key)
}

/// The key of one list element.
pub fn list_element_key(var: VarId, key: &[u8], seq: u64) -> Vec<u8> {
    let mut out = list_prefix(var, key);
    out.extend_from_slice(&seq.to_be_bytes());
    out
}

/// The key of a list's metadata (its next element sequence).
pub fn list_meta_key(var: VarId, key: &[u8]) -> Vec<u8> {
    var_key_prefix(LIST_META, var, key)
}

/// The prefix of all entries of one map.
pub fn map_prefix(var: VarId, key: &[u8]) -> Vec<u8> {
    var_key_prefix(MAP, var, key)
}

/// The key of one map entry.
pub fn map_entry_key(var: VarId, key: &[u8], user_key: &[u8]) -> Vec<u8> {
    let mut out = map_prefix(var, key);
    out.extend_from_slice(user_key);
    out
}

/// The prefix of one grouping key's timers in the by-key index.
pub fn timer_key_prefix(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    timer_key_prefix_into(&mut out, key);
    out
}

/// Writes [`timer_key_prefix`] into `out` (cleared first).
#[inline]
pub fn timer_key_prefix_into(out: &mut Vec<u8>, key: &[u8]) {
    out.clear();
    out.reserve(1 + 4 + key.len() + TS_LEN);
    out.push(TIMER_BY_KEY);
    push_key(out, key);
}

/// A timer in the by-key index.
pub fn timer_by_key(key: &[u8], ts: i64) -> Vec<u8> {
    let mut out = timer_key_prefix(key);
    out.extend_from_slice(&encode_i64(ts));
    out
}

/// The prefix of one partition's timers in the by-time index.
pub fn timer_time_prefix(partition: Partition) -> Vec<u8> {
    partition_prefix(TIMER_BY_TIME, partition)
}

/// A timer in the by-time index.
pub fn timer_by_time(partition: Partition, ts: i64, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PARTITION_PREFIX_LEN + TS_LEN + key.len());
    out.push(TIMER_BY_TIME);
    out.extend_from_slice(&partition.to_be_bytes());
    out.extend_from_slice(&encode_i64(ts));
    out.extend_from_slice(key);
    out
}

/// The range of one partition's timers with `ts <= upto` in the by-time index.
pub fn timer_time_range_upto(partition: Partition, upto: i64) -> (Vec<u8>, Vec<u8>) {
    time_range_upto(TIMER_BY_TIME, partition, upto)
}

/// Splits a by-time timer key into `(ts, grouping key)`.
pub fn decode_timer_by_time(k: &[u8]) -> Result<(i64, &[u8])> {
    let (ts, key) = split_time_key(TIMER_BY_TIME, k, "timer")?;
    Ok((ts, key))
}

/// Decodes the timestamp of a by-key timer key whose prefix is `prefix_len` bytes long.
pub fn decode_timer_by_key(k: &[u8], prefix_len: usize) -> Result<i64> {
    match k
        .get(prefix_len..)
        .and_then(|ts| <[u8; 8]>::try_from(ts).ok())
    {
        Some(ts) => Ok(decode_i64(ts)),
        None => Err(StoreError::Corrupt("malformed timer key".into())),
    }
}

/// The prefix of one partition's TTL index.
pub fn ttl_prefix(partition: Partition) -> Vec<u8> {
    partition_prefix(TTL, partition)
}

/// A TTL index entry for the entry stored at `state_key`, expiring at `expiry`.
pub fn ttl_key(partition: Partition, expiry: i64, state_key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(PARTITION_PREFIX_LEN + TS_LEN + state_key.len());
    out.push(TTL);
    out.extend_from_slice(&partition.to_be_bytes());
    out.extend_from_slice(&encode_i64(expiry));
    out.extend_from_slice(state_key);
    out
}

/// The range of one partition's TTL entries with `expiry <= upto`.
pub fn ttl_range_upto(partition: Partition, upto: i64) -> (Vec<u8>, Vec<u8>) {
    time_range_upto(TTL, partition, upto)
}

/// Splits a TTL index key into `(expiry, state key)`.
pub fn decode_ttl_key(k: &[u8]) -> Result<(i64, &[u8])> {
    split_time_key(TTL, k, "TTL index")
}

/// Splits the key of a value, list element or map entry (as a TTL index entry names it)
/// into its namespace and the length of its `[ns][var][keylen][key]` prefix; the rest is the
/// element's sequence or the entry's user key.
pub fn split_state_key(k: &[u8]) -> Result<(u8, usize)> {
    const HEAD: usize = 1 + 4 + 4;
    let malformed = || StoreError::Corrupt("malformed state key in the TTL index".into());
    let (&ns, rest) = k.split_first().ok_or_else(malformed)?;
    let len = rest
        .get(4..8)
        .and_then(|l| <[u8; 4]>::try_from(l).ok())
        .map(u32::from_be_bytes)
        .ok_or_else(malformed)?;
    let prefix_len = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(HEAD))
        .filter(|&p| p <= k.len())
        .ok_or_else(malformed)?;
    let suffix_len = k.len() - prefix_len;
    match ns {
        VALUE if suffix_len == 0 => Ok((ns, prefix_len)),
        LIST if suffix_len == SEQ_LEN => Ok((ns, prefix_len)),
        MAP => Ok((ns, prefix_len)),
        _ => Err(malformed()),
    }
}

/// Decodes the sequence of a list element key.
pub fn decode_list_seq(k: &[u8]) -> Result<u64> {
    match k.last_chunk::<SEQ_LEN>() {
        Some(seq) if k.len() > SEQ_LEN => Ok(u64::from_be_bytes(*seq)),
        _ => Err(StoreError::Corrupt("malformed list element key".into())),
    }
}

/// Splits a key of namespace `ns` laid out as `[ns][var u32][keylen u32][key][suffix]` into
/// `(var, grouping key, suffix)`; the suffix is empty for a value, the sequence of a list
/// element, the user key of a map entry.
pub fn decode_var_key(ns: u8, k: &[u8]) -> Result<(VarId, &[u8], &[u8])> {
    let malformed = || StoreError::Corrupt(format!("malformed state key in namespace {ns:#04x}"));
    let (&found, rest) = k.split_first().ok_or_else(malformed)?;
    if found != ns {
        return Err(malformed());
    }
    let (var, rest) = rest.split_first_chunk::<4>().ok_or_else(malformed)?;
    let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(malformed)?;
    let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|_| malformed())?;
    if rest.len() < len {
        return Err(malformed());
    }
    let (key, suffix) = rest.split_at(len);
    Ok((VarId::from_be_bytes(*var), key, suffix))
}

/// Splits a by-key timer key (`[0x06][keylen u32][key][ts i64]`) into `(grouping key, ts)`.
pub fn decode_timer_key(k: &[u8]) -> Result<(&[u8], i64)> {
    let malformed = || StoreError::Corrupt("malformed timer key".into());
    let rest = match k.split_first() {
        Some((&TIMER_BY_KEY, rest)) => rest,
        _ => return Err(malformed()),
    };
    let (len, rest) = rest.split_first_chunk::<4>().ok_or_else(malformed)?;
    let len = usize::try_from(u32::from_be_bytes(*len)).map_err(|_| malformed())?;
    if rest.len() != len + TS_LEN {
        return Err(malformed());
    }
    let (key, ts) = rest.split_at(len);
    let ts = <[u8; 8]>::try_from(ts).map_err(|_| malformed())?;
    Ok((key, decode_i64(ts)))
}

/// The range of every grouping key's timers in the by-key index.
pub fn timers_by_key_range() -> (Vec<u8>, Vec<u8>) {
    prefix_range(vec![TIMER_BY_KEY])
}

/// The marker of a batch whose change log was recorded.
pub fn changelog_marker(batch: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + 2);
    out.push(CHANGELOG);
    out.extend_from_slice(&batch.to_be_bytes());
    out
}

/// The key of one partition's whole change log of one batch, as logs were stored before
/// they were stored in chunks ([`changelog_chunk_key`]); still read.
pub fn changelog_key(batch: u64, partition: Partition) -> Vec<u8> {
    let mut out = changelog_marker(batch);
    out.extend_from_slice(&partition.to_be_bytes());
    out
}

/// The key of chunk `chunk` of one partition's change log of one batch: chunks sort in
/// order after the partition's [`changelog_key`], before the next partition's.
pub fn changelog_chunk_key(batch: u64, partition: Partition, chunk: u32) -> Vec<u8> {
    let mut out = changelog_key(batch, partition);
    out.extend_from_slice(&chunk.to_be_bytes());
    out
}

/// The range of the change logs (markers included) of batches `from..to`.
pub fn changelog_range(from: u64, to: u64) -> (Vec<u8>, Vec<u8>) {
    (changelog_marker(from), changelog_marker(to))
}

/// The range of the change logs of batches `from..`.
pub fn changelog_range_from(from: u64) -> (Vec<u8>, Vec<u8>) {
    (changelog_marker(from), vec![CHANGELOG + 1])
}

/// Splits a change log key, whole or chunk, into `(batch, partition)`; a batch marker has
/// no partition.
pub fn decode_changelog_key(k: &[u8]) -> Result<(u64, Option<Partition>)> {
    let malformed = || StoreError::Corrupt("malformed change log key".into());
    let rest = match k.split_first() {
        Some((&CHANGELOG, rest)) => rest,
        _ => return Err(malformed()),
    };
    let (batch, rest) = rest.split_first_chunk::<8>().ok_or_else(malformed)?;
    let batch = u64::from_be_bytes(*batch);
    match rest.len() {
        0 => Ok((batch, None)),
        2 | 6 => Ok((batch, Some(Partition::from_be_bytes([rest[0], rest[1]])))),
        _ => Err(malformed()),
    }
}

/// The key of a batch's plan.
pub fn plan_key(batch: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8);
    out.push(PLAN);
    out.extend_from_slice(&batch.to_be_bytes());
    out
}

/// The key of a metadata blob.
pub fn meta_key(name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + name.len());
    out.push(META);
    out.extend_from_slice(name.as_bytes());
    out
}

/// The range of metadata whose name starts with `prefix`.
pub fn meta_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    prefix_range(meta_key(prefix))
}

/// Decodes a metadata key's name.
pub fn decode_meta_key(k: &[u8]) -> Result<&str> {
    match k.split_first() {
        Some((&META, name)) => std::str::from_utf8(name)
            .map_err(|_| StoreError::Corrupt("metadata name is not UTF-8".into())),
        _ => Err(StoreError::Corrupt("malformed metadata key".into())),
    }
}

/// The range of one variable's entries in namespace `ns` (for every grouping key).
pub fn var_range(ns: u8, var: VarId) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(5);
    start.push(ns);
    start.extend_from_slice(&var.to_be_bytes());
    prefix_range(start)
}

/// The half-open range of every key starting with `prefix`.
pub fn prefix_range(prefix: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let end = prefix_successor(&prefix);
    (prefix, end)
}

/// The smallest key greater than every key starting with `prefix`.
///
/// Every prefix this crate builds starts with a namespace byte below `0xff`, so a successor
/// exists. An empty or all-`0xff` prefix has none; it gets `[0xff]`, which lies past every key
/// this crate writes.
pub fn prefix_successor(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0xff]
}

/// The smallest key greater than `key` (for resuming a scan after `key`).
pub fn key_successor(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.extend_from_slice(key);
    out.push(0);
    out
}

/// `[ns][partition]`: how every key of a partition's timers-by-time or TTL index begins.
#[inline]
pub(crate) fn partition_head(ns: u8, partition: Partition) -> [u8; PARTITION_PREFIX_LEN] {
    let [hi, lo] = partition.to_be_bytes();
    [ns, hi, lo]
}

fn partition_prefix(ns: u8, partition: Partition) -> Vec<u8> {
    let mut out = Vec::with_capacity(PARTITION_PREFIX_LEN + TS_LEN);
    out.push(ns);
    out.extend_from_slice(&partition.to_be_bytes());
    out
}

/// The first by-time timer key of `partition` at or after `from`.
pub fn timer_time_range_from(partition: Partition, from: i64) -> Vec<u8> {
    time_key_from(TIMER_BY_TIME, partition, from)
}

/// The first TTL index key of `partition` at or after expiry `from`.
pub fn ttl_range_from(partition: Partition, from: i64) -> Vec<u8> {
    time_key_from(TTL, partition, from)
}

fn time_key_from(ns: u8, partition: Partition, from: i64) -> Vec<u8> {
    let mut key = partition_prefix(ns, partition);
    key.extend_from_slice(&encode_i64(from));
    key
}

fn time_range_upto(ns: u8, partition: Partition, upto: i64) -> (Vec<u8>, Vec<u8>) {
    let start = partition_prefix(ns, partition);
    let end = match upto.checked_add(1) {
        Some(next) => {
            let mut end = start.clone();
            end.extend_from_slice(&encode_i64(next));
            end
        }
        None => prefix_successor(&start),
    };
    (start, end)
}

fn split_time_key<'a>(ns: u8, k: &'a [u8], what: &str) -> Result<(i64, &'a [u8])> {
    if k.len() >= PARTITION_PREFIX_LEN + TS_LEN && k[0] == ns {
        let (ts, rest) = k[PARTITION_PREFIX_LEN..].split_at(TS_LEN);
        if let Ok(ts) = <[u8; 8]>::try_from(ts) {
            return Ok((decode_i64(ts), rest));
        }
    }
    Err(StoreError::Corrupt(format!("malformed {what} key")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMES: [i64; 9] = [
        i64::MIN,
        i64::MIN + 1,
        -1_000,
        -1,
        0,
        1,
        1_000,
        i64::MAX - 1,
        i64::MAX,
    ];

    #[test]
    fn i64_encoding_preserves_order_and_roundtrips() {
        for w in TIMES.windows(2) {
            assert!(encode_i64(w[0]) < encode_i64(w[1]), "{} vs {}", w[0], w[1]);
        }
        for t in TIMES {
            assert_eq!(decode_i64(encode_i64(t)), t);
        }
    }

    #[test]
    fn change_log_chunks_sort_in_order_within_their_batch_and_partition() {
        let keys = [
            changelog_marker(7),
            changelog_key(7, 0),
            changelog_chunk_key(7, 0, 0),
            changelog_chunk_key(7, 0, 1),
            changelog_chunk_key(7, 0, 256),
            changelog_chunk_key(7, 1, 0),
            changelog_chunk_key(8, 0, 0),
        ];
        for w in keys.windows(2) {
            assert!(w[0] < w[1], "{:?} vs {:?}", w[0], w[1]);
        }
        let (start, end) = changelog_range(7, 8);
        assert!(keys[..6].iter().all(|k| start <= *k && *k < end));
        assert!(keys[6] >= end);
        assert_eq!(decode_changelog_key(&keys[0]).unwrap(), (7, None));
        assert_eq!(decode_changelog_key(&keys[1]).unwrap(), (7, Some(0)));
        assert_eq!(decode_changelog_key(&keys[4]).unwrap(), (7, Some(0)));
        assert_eq!(decode_changelog_key(&keys[5]).unwrap(), (7, Some(1)));
        let mut odd = changelog_key(7, 0);
        odd.push(0);
        assert!(decode_changelog_key(&odd).is_err());
    }

    #[test]
    fn list_elements_order_by_sequence_and_stay_inside_their_prefix() {
        let seqs = [0u64, 1, 255, 256, 65_536, u64::MAX];
        let (start, end) = prefix_range(list_prefix(7, b"k"));
        for w in seqs.windows(2) {
            assert!(list_element_key(7, b"k", w[0]) < list_element_key(7, b"k", w[1]));
        }
        for s in seqs {
            let k = list_element_key(7, b"k", s);
            assert!(start <= k && k < end);
            assert_eq!(decode_list_seq(&k).unwrap(), s);
        }
        // A longer grouping key that extends "k" must not fall into "k"'s range.
        let other = list_element_key(7, b"k\0", 0);
        assert!(!(start <= other && other < end));
    }

    #[test]
    fn grouping_key_prefixes_are_unambiguous() {
        let keys: [&[u8]; 5] = [b"", b"a", b"a\0", b"a\xff", b"ab"];
        for a in keys {
            let (s, e) = prefix_range(map_prefix(1, a));
            for b in keys {
                let inside = |k: Vec<u8>| s <= k && k < e;
                assert_eq!(inside(map_entry_key(1, b, b"user")), a == b, "{a:?} {b:?}");
                assert_eq!(inside(map_entry_key(1, b, b"")), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn map_entries_order_by_user_key_bytes() {
        let uks: [&[u8]; 5] = [b"", b"\0", b"a", b"a\0", b"b"];
        for w in uks.windows(2) {
            assert!(map_entry_key(3, b"g", w[0]) < map_entry_key(3, b"g", w[1]));
        }
    }

    #[test]
    fn var_range_covers_all_keys_of_that_var_only() {
        for ns in VAR_NAMESPACES {
            let (s, e) = var_range(ns, 5);
            let inside = |k: &[u8]| s.as_slice() <= k && k < e.as_slice();
            let mine = var_key_prefix(ns, 5, b"anything");
            assert!(inside(&mine));
            assert!(!inside(&var_key_prefix(ns, 4, b"x")));
            assert!(!inside(&var_key_prefix(ns, 6, b"")));
        }
        let (s, e) = var_range(VALUE, u32::MAX);
        assert!(s < value_key(u32::MAX, b"\xff\xff") && value_key(u32::MAX, b"\xff") < e);
        assert!(e <= vec![LIST]);
    }

    #[test]
    fn timers_by_time_order_by_time_then_key_and_decode() {
        let mut keys = vec![];
        for t in TIMES {
            for k in [&b""[..], b"a", b"b"] {
                keys.push(timer_by_time(9, t, k));
            }
        }
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            decode_timer_by_time(&timer_by_time(9, -5, b"xy")).unwrap(),
            (-5, &b"xy"[..])
        );
    }

    #[test]
    fn upto_ranges_are_inclusive_of_upto() {
        for t in TIMES {
            let (s, e) = timer_time_range_upto(2, t);
            let k = timer_by_time(2, t, b"\xff\xff");
            assert!(s <= k && k < e, "{t}");
            if let Some(next) = t.checked_add(1) {
                assert!(timer_by_time(2, next, b"") >= e);
            }
            assert!(timer_by_time(3, i64::MIN, b"") >= e);
            let (s, e) = ttl_range_upto(2, t);
            let k = ttl_key(2, t, &value_key(1, b"k"));
            assert!(s <= k && k < e);
            assert_eq!(
                decode_ttl_key(&k).unwrap(),
                (t, value_key(1, b"k").as_slice())
            );
        }
    }

    #[test]
    fn timers_by_key_decode() {
        let prefix = timer_key_prefix(b"key");
        let k = timer_by_key(b"key", -42);
        assert!(k.starts_with(&prefix));
        assert_eq!(decode_timer_by_key(&k, prefix.len()).unwrap(), -42);
        assert!(decode_timer_by_key(&prefix, prefix.len()).is_err());
    }

    #[test]
    fn state_keys_split_into_prefix_and_suffix() {
        let value = value_key(3, b"key");
        assert_eq!(split_state_key(&value).unwrap(), (VALUE, value.len()));
        let prefix = list_prefix(3, b"key").len();
        assert_eq!(
            split_state_key(&list_element_key(3, b"key", 9)).unwrap(),
            (LIST, prefix)
        );
        assert_eq!(
            split_state_key(&map_entry_key(3, b"key", b"uk")).unwrap(),
            (MAP, prefix)
        );
        assert_eq!(
            split_state_key(&map_entry_key(3, b"key", b"")).unwrap(),
            (MAP, prefix)
        );
        for bad in [
            vec![],
            vec![VALUE, 0, 0],
            [value.as_slice(), b"x"].concat(),
            list_prefix(3, b"key"),
            list_meta_key(3, b"key"),
            timer_by_key(b"key", 1),
            var_key_prefix(MAP, 3, b"key")[..8].to_vec(),
        ] {
            assert!(split_state_key(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn var_keys_decode_into_var_key_and_suffix() {
        assert_eq!(
            decode_var_key(VALUE, &value_key(7, b"[\"u1\"]")).unwrap(),
            (7, &b"[\"u1\"]"[..], &b""[..])
        );
        let k = list_element_key(u32::MAX, b"", 258);
        let (var, key, seq) = decode_var_key(LIST, &k).unwrap();
        assert_eq!((var, key), (u32::MAX, &b""[..]));
        assert_eq!(seq, 258u64.to_be_bytes());
        assert_eq!(
            decode_var_key(MAP, &map_entry_key(2, b"k\0", b"\"uk\"")).unwrap(),
            (2, &b"k\0"[..], &b"\"uk\""[..])
        );
        for bad in [
            vec![],
            vec![VALUE],
            vec![VALUE, 0, 0, 0, 1, 0, 0, 0],
            vec![VALUE, 0, 0, 0, 1, 0, 0, 0, 5, b'a'],
            map_entry_key(2, b"k", b"u"),
        ] {
            assert!(decode_var_key(VALUE, &bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn timers_by_key_decode_into_key_and_time() {
        let (s, e) = timers_by_key_range();
        for t in TIMES {
            for key in [&b""[..], b"[\"a\"]", b"\xff"] {
                let k = timer_by_key(key, t);
                assert!(s <= k && k < e);
                assert_eq!(decode_timer_key(&k).unwrap(), (key, t));
            }
        }
        assert!(timer_by_time(0, 0, b"") >= e);
        for bad in [
            vec![],
            timer_key_prefix(b"k"),
            [timer_by_key(b"k", 1).as_slice(), b"x"].concat(),
            value_key(1, b"k"),
        ] {
            assert!(decode_timer_key(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn successors() {
        assert_eq!(prefix_successor(&[1, 2, 3]), [1, 2, 4]);
        assert_eq!(prefix_successor(&[1, 0xff, 0xff]), [2]);
        assert_eq!(key_successor(&[1, 0xff]), [1, 0xff, 0]);
        assert!(prefix_successor(&[0xff]) > ttl_key(u16::MAX, i64::MAX, b"\xff"));
        let (s, e) = meta_range("batch/");
        assert!(s.as_slice() <= meta_key("batch/1").as_slice() && meta_key("batch/1") < e);
        assert!(meta_key("batch0") >= e);
        assert_eq!(decode_meta_key(&meta_key("x/y")).unwrap(), "x/y");
        assert!(decode_meta_key(&[META, 0xff]).is_err());
    }

    #[test]
    fn namespaces_are_distinct_and_ordered() {
        let all = [
            PLAN,
            META,
            VALUE,
            LIST,
            LIST_META,
            MAP,
            TIMER_BY_KEY,
            TIMER_BY_TIME,
            TTL,
            CHANGELOG,
        ];
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert!(plan_key(u64::MAX) < meta_key(""));
    }
}
