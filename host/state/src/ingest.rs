//! Large writes as table files: a batch's commit of hundreds of thousands of operations is
//! written as sorted table files, on several threads, and added to the database in one
//! ingestion, instead of going through the write-ahead log and the memtable.
//!
//! A memtable write inserts every operation into a skiplist on the committing thread, and
//! RocksDB then flushes the memtable into a table file on a thread of its own: the batch is
//! sorted and encoded twice. A commit's operations come sorted from the partitions
//! (`bench/HISTORY.md`, "A commit's writes as table files"), so writing them straight into
//! table files does that work once, split across the cores, and the write-ahead log is not
//! written.
//!
//! The change log's keys only grow (they start with the batch), so a commit's change log is
//! a file of its own ([`split`]'s `apart`): its key range overlaps nothing stored, and
//! RocksDB adds it to the last level, below the compactions of the state.
//!
//! RocksDB flushes the memtable before an ingestion if it holds a key inside a file's key
//! range. Between commits the memtable holds the next batch's plan, logged before the batch
//! runs. Plans are in a namespace below every key a commit writes ([`crate::keys::PLAN`]):
//! no commit's files cover one, and an ingestion flushes nothing.
//!
//! One ingestion is atomic (one entry in RocksDB's manifest), and durable when it returns:
//! each file is synced when finished and the database's directory after the files are
//! linked in. A table file's entries all carry the one sequence number the ingestion gives
//! the file, and a range delete covers only entries older than itself, so what is written
//! keeps the meaning of the batch's operations in order:
//! - a key written several times is written once, with its last operation;
//! - a point write followed in the batch by a range delete covering it is left out (the
//!   range delete would not cover it), and one preceded by it is kept (as it would be);
//! - the files hold disjoint key intervals, and each range delete is clipped to the
//!   interval of the file it is written to: RocksDB may give files that do not overlap
//!   different levels and sequence numbers, and a file's range delete must not reach the
//!   keys of another file of the same batch.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use rocksdb::{Options, SstFileWriter};

use crate::engine::{PREFETCH_AHEAD, WriteOp};
use crate::{Result, StoreError};

/// Writes of at least this many operations are ingested; smaller ones (a few keys, metadata)
/// go through the write-ahead log, where a table file and a manifest entry per write would
/// cost more than the memtable insert.
pub(crate) const MIN_OPS: usize = 16_384;

/// Prefix of the table files written for ingestion, in the database's directory. RocksDB
/// ignores files not named like its own; ones left by a crash before their ingestion are
/// removed when the database is next opened ([`remove_leftovers`]).
const FILE_PREFIX: &str = "statebox-ingest-";

/// One table file's share of a write.
#[derive(Debug)]
pub(crate) struct Part<'a> {
    /// Point writes, ascending by key, one per key: the key and the index of its operation.
    pub points: &'a [(&'a [u8], usize)],
    /// Range deletes, clipped to the part's key interval.
    pub ranges: Vec<(&'a [u8], &'a [u8])>,
}

/// The point writes of `ops` that take effect, ascending by key: a key's last operation,
/// unless a range delete after it covers it.
pub(crate) fn effective_points(ops: &[WriteOp]) -> Vec<(&[u8], usize)> {
    let mut all = ops.iter().enumerate().filter_map(|(i, op)| match op {
        WriteOp::Put(k, _) | WriteOp::Delete(k) => Some((k.as_slice(), i)),
        WriteOp::DeleteRange(..) => None,
    });
    // A commit's operations are mostly one ascending run (the partitions' merged writes)
    // followed by a few metadata and change-log keys. The run is taken as it comes, each
    // key once with its last operation: one comparison per operation.
    let mut points: Vec<(&[u8], usize)> = Vec::with_capacity(ops.len());
    let mut rest = Vec::new();
    for (key, i) in all.by_ref() {
        if let Some(last) = points.last_mut() {
            match last.0.cmp(key) {
                Ordering::Less => {}
                Ordering::Equal => {
                    last.1 = i;
                    continue;
                }
                Ordering::Greater => {
                    rest.push((key, i));
                    break;
                }
            }
        }
        points.push((key, i));
    }
    rest.extend(all);
    if rest.len() <= points.len() / SEARCHED_MERGE {
        sort_keeping_last(&mut rest);
        merge_later(&mut points, &rest);
    } else {
        points.append(&mut rest);
        sort_keeping_last(&mut points);
    }
    // A key's last operation is covered by a range delete after it if the latest of the
    // range deletes over the key comes later. One sweep in key order: the range deletes
    // starting at or before the key join a heap by position, and those ending at or
    // before it leave (for good: keys only grow) when they reach its top.
    let mut ranges: Vec<(usize, &[u8], &[u8])> = ranges(ops).collect();
    if ranges.is_empty() {
        return points;
    }
    ranges.sort_unstable_by(|a, b| a.1.cmp(b.1));
    let mut ranges = ranges.into_iter().peekable();
    let mut over: BinaryHeap<(usize, &[u8])> = BinaryHeap::new();
    points.retain(|&(key, i)| {
        while let Some((j, _, end)) = ranges.next_if(|&(_, start, _)| start <= key) {
            over.push((j, end));
        }
        while over.peek().is_some_and(|&(_, end)| end <= key) {
            over.pop();
        }
        over.peek().is_none_or(|&(j, _)| j <= i)
    });
    points
}

/// [`effective_points`] merges the points after the first run into it by searching the
/// run for each when they are at most a this-many'th of the run: a search costs about 20
/// comparisons in a run of a million, a linear merge one per entry of both.
const SEARCHED_MERGE: usize = 64;

/// Sorts `points` by key, keeping each key's last entry (the sort is stable, so that is
/// its last operation).
fn sort_keeping_last(points: &mut Vec<(&[u8], usize)>) {
    points.sort_by(|a, b| a.0.cmp(b.0));
    points.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            *earlier = *later;
        }
        same
    });
}

/// Merges `later` into `run`, both ascending with each key once; where both hold a key,
/// `later`'s entry (a later operation) takes its place. Each of `later`'s places is found
/// by a search, then the run's entries are moved up to make room, back to front, each once.
fn merge_later<'a>(run: &mut Vec<(&'a [u8], usize)>, later: &[(&'a [u8], usize)]) {
    let mut inserts = Vec::with_capacity(later.len());
    let mut from = 0;
    for &(key, i) in later {
        let at = from + run[from..].partition_point(|&(k, _)| k < key);
        match run.get_mut(at) {
            Some(same) if same.0 == key => same.1 = i,
            _ => inserts.push((at, (key, i))),
        }
        from = at;
    }
    let mut end = run.len();
    run.resize(end + inserts.len(), (&[], 0));
    for (n, &(at, point)) in inserts.iter().enumerate().rev() {
        // The `n` inserts before this one go below `at`: the entries from `at` to `end`
        // move up past them and this one.
        run.copy_within(at..end, at + n + 1);
        run[at + n] = point;
        end = at;
    }
}

/// The non-empty range deletes of `ops`, with their positions.
fn ranges(ops: &[WriteOp]) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
    ops.iter().enumerate().filter_map(|(i, op)| match op {
        WriteOp::DeleteRange(start, end) if start < end => {
            Some((i, start.as_slice(), end.as_slice()))
        }
        _ => None,
    })
}

/// The cost of writing one entry into a table file beyond its bytes, counted in bytes:
/// encoding an entry and adding it to the filter and the index cost about what compressing
/// a few hundred bytes does.
const ENTRY_COST: usize = 256;

/// Splits the write into files over disjoint key intervals that together cover every key:
/// the keys from `apart` on in a file of their own, the keys before it in at most `parts`
/// files of about equal cost. `points` is [`effective_points`] of `ops`.
pub(crate) fn split<'a>(
    ops: &'a [WriteOp],
    points: &'a [(&'a [u8], usize)],
    parts: usize,
    apart: &[u8],
) -> Vec<Part<'a>> {
    let apart_at = points.partition_point(|&(k, _)| k < apart);
    // The index where each part starts.
    let mut starts = balanced_starts(ops, &points[..apart_at], parts);
    if apart_at > 0 && apart_at < points.len() {
        starts.push(apart_at);
    }
    // The write's range deletes, found once: each part clips them all to its interval.
    let all_ranges: Vec<(&[u8], &[u8])> = ranges(ops).map(|(_, s, e)| (s, e)).collect();
    let mut out = Vec::with_capacity(starts.len());
    for (n, &start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(points.len());
        // The part's key interval: from its first key (or the start of the key space) to
        // the next part's first key (or the end).
        let low: &[u8] = if n == 0 { &[] } else { points[start].0 };
        let high: Option<&[u8]> = starts.get(n + 1).map(|&next| points[next].0);
        let clipped = all_ranges
            .iter()
            .map(|&(s, e)| {
                (
                    s.max(low),
                    match high {
                        Some(h) => e.min(h),
                        None => e,
                    },
                )
            })
            .filter(|(s, e)| s < e)
            .collect();
        out.push(Part {
            points: &points[start..end],
            ranges: clipped,
        });
    }
    out.retain(|p| !p.points.is_empty() || !p.ranges.is_empty());
    out
}

/// Where each of at most `parts` runs of `points` of about equal cost starts; the first
/// at 0.
fn balanced_starts(ops: &[WriteOp], points: &[(&[u8], usize)], parts: usize) -> Vec<usize> {
    let size = |&(k, i): &(&[u8], usize)| {
        ENTRY_COST
            + k.len()
            + match &ops[i] {
                WriteOp::Put(_, v) => v.len(),
                _ => 0,
            }
    };
    let total: usize = points.iter().map(size).sum();
    let mut starts = vec![0];
    let mut bytes = 0;
    for (j, p) in points.iter().enumerate() {
        if starts.len() < parts
            && bytes * parts >= total * starts.len()
            && j > *starts.last().unwrap_or(&0)
        {
            starts.push(j);
        }
        bytes += size(p);
    }
    starts
}

/// Writes each part as a table file in `dir` (one thread per part) and returns the files.
/// On an error no file is left behind.
pub(crate) fn write_files(
    opts: &Options,
    dir: &Path,
    first_number: u64,
    ops: &[WriteOp],
    parts: &[Part<'_>],
) -> Result<Vec<PathBuf>> {
    let files: Vec<PathBuf> = (0..parts.len() as u64)
        .map(|n| dir.join(format!("{FILE_PREFIX}{}.sst", first_number + n)))
        .collect();
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .iter()
            .zip(&files)
            .skip(1)
            .map(|(part, file)| scope.spawn(move || write_file(opts, file, ops, part)))
            .collect();
        let mut results = Vec::with_capacity(parts.len());
        if let (Some(part), Some(file)) = (parts.first(), files.first()) {
            results.push(write_file(opts, file, ops, part));
        }
        for handle in handles {
            results.push(handle.join().unwrap_or_else(|_| {
                Err(StoreError::Storage(
                    "writing a table file for ingestion panicked".into(),
                ))
            }));
        }
        results
    });
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        remove_files(&files);
        return Err(e);
    }
    Ok(files)
}

/// Writes one part as the table file `file`, synced.
fn write_file(opts: &Options, file: &Path, ops: &[WriteOp], part: &Part<'_>) -> Result<()> {
    let failed = |e: rocksdb::Error| {
        StoreError::Storage(format!("writing {}: {}", file.display(), e.into_string()))
    };
    let mut writer = SstFileWriter::create(opts);
    writer.open(file).map_err(failed)?;
    for (n, &(key, i)) in part.points.iter().enumerate() {
        if let Some(&(_, ahead)) = part.points.get(n + PREFETCH_AHEAD) {
            ops[ahead].prefetch();
        }
        match &ops[i] {
            WriteOp::Put(_, value) => writer.put(key, value),
            _ => writer.delete(key),
        }
        .map_err(failed)?;
    }
    for &(start, end) in &part.ranges {
        delete_range(&writer, start, end)
            .map_err(|e| StoreError::Storage(format!("writing {}: {e}", file.display())))?;
    }
    writer.finish().map_err(failed)
}

/// Adds a range delete to `writer`, through RocksDB's C API: the Rust wrapper (0.20) has
/// no method for it.
fn delete_range(
    writer: &SstFileWriter<'_>,
    start: &[u8],
    end: &[u8],
) -> std::result::Result<(), String> {
    // The wrapper is its C pointer and a zero-sized marker; its field is private.
    const _: () = assert!(
        std::mem::size_of::<SstFileWriter<'static>>()
            == std::mem::size_of::<*mut librocksdb_sys::rocksdb_sstfilewriter_t>()
    );
    // SAFETY: the size check above leaves the pointer as the wrapper's only content; the
    // writer is open, and outlives the call; the key slices are valid for their lengths.
    unsafe {
        let raw: *mut librocksdb_sys::rocksdb_sstfilewriter_t = std::mem::transmute_copy(writer);
        let mut err: *mut std::ffi::c_char = std::ptr::null_mut();
        librocksdb_sys::rocksdb_sstfilewriter_delete_range(
            raw,
            start.as_ptr().cast(),
            start.len(),
            end.as_ptr().cast(),
            end.len(),
            &mut err,
        );
        if err.is_null() {
            return Ok(());
        }
        let text = std::ffi::CStr::from_ptr(err).to_string_lossy().into_owned();
        librocksdb_sys::rocksdb_free(err.cast());
        Err(text)
    }
}

/// Removes `files`, ignoring ones already gone.
pub(crate) fn remove_files(files: &[PathBuf]) {
    for file in files {
        let _ = std::fs::remove_file(file);
    }
}

/// Removes the table files a crash left in `dir` before their ingestion.
pub(crate) fn remove_leftovers(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(FILE_PREFIX) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// No key is at or past it.
    const NOTHING_APART: &[u8] = &[0xff];

    fn put(k: &str) -> WriteOp {
        WriteOp::Put(k.as_bytes().to_vec(), b"v".to_vec())
    }

    fn range(s: &str, e: &str) -> WriteOp {
        WriteOp::DeleteRange(s.as_bytes().to_vec(), e.as_bytes().to_vec())
    }

    fn keys_and_ops<'a>(points: &[(&'a [u8], usize)]) -> Vec<(&'a str, usize)> {
        points
            .iter()
            .map(|&(k, i)| (std::str::from_utf8(k).unwrap(), i))
            .collect()
    }

    /// A key's last operation counts; a range delete removes the point writes before it,
    /// not those after it.
    #[test]
    fn the_effective_points_are_each_keys_last_write_not_deleted_after() {
        let ops = vec![
            put("b"),                       // 0: removed by 3
            put("a"),                       // 1: replaced by 5
            WriteOp::Delete(b"c".to_vec()), // 2
            range("b", "c"),                // 3
            put("b"),                       // 4: after the range delete, kept
            WriteOp::Delete(b"a".to_vec()), // 5
            range("z", "a"),                // 6: reversed, deletes nothing
        ];
        let points = effective_points(&ops);
        assert_eq!(keys_and_ops(&points), [("a", 5), ("b", 4), ("c", 2)]);
    }

    /// The sweep agrees with checking every point against every range delete, on random
    /// batches with many overlapping range deletes.
    #[test]
    fn the_effective_points_match_a_direct_check() {
        let mut seed: u64 = 7;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for _ in 0..200 {
            let ops: Vec<WriteOp> = (0..next(80))
                .map(|_| {
                    let k = format!("{:02}", next(40));
                    match next(3) {
                        0 => range(&k, &format!("{:02}", next(42))),
                        1 => WriteOp::Delete(k.into_bytes()),
                        _ => put(&k),
                    }
                })
                .collect();
            assert_eq!(effective_points(&ops), checked_points(&ops), "{ops:?}");
        }
    }

    /// [`effective_points`] by checking every point write against every range delete.
    fn checked_points(ops: &[WriteOp]) -> Vec<(&[u8], usize)> {
        let mut expected: BTreeMap<&[u8], usize> = BTreeMap::new();
        for (i, op) in ops.iter().enumerate() {
            if let WriteOp::Put(k, _) | WriteOp::Delete(k) = op {
                expected.insert(k, i);
            }
        }
        expected.retain(|&k, &mut i| {
            !ops[i + 1..].iter().any(
                |op| matches!(op, WriteOp::DeleteRange(s, e) if s.as_slice() <= k && k < e.as_slice()),
            )
        });
        expected.into_iter().collect()
    }

    /// A commit's shape: one long ascending run, some keys written twice in a row, then a
    /// few more writes anywhere in the key space (before, between and after the run's keys,
    /// on its keys, twice). Up to a sixty-fourth of the run they are merged in by search,
    /// past it by sorting everything; both agree with the direct check, with range deletes
    /// before, inside and after the run or none.
    #[test]
    fn the_effective_points_of_a_run_and_a_few_later_writes_match_a_direct_check() {
        let mut rng = crate::xorshift(11);
        let mut next = |n: u64| rng() % n;
        let run = 640;
        for later in [
            0,
            1,
            run / SEARCHED_MERGE - 1,
            run / SEARCHED_MERGE,
            run / SEARCHED_MERGE + 1,
            50,
        ] {
            for ranges in 0..4 {
                let mut ops = Vec::new();
                if ranges == 1 {
                    ops.push(range("0010", "0300"));
                }
                let mut at = 0;
                for n in 0..run {
                    // Even keys in the run, so odd ones fall between them.
                    at += 2 * (1 + next(3));
                    ops.push(put(&format!("{at:04}")));
                    if next(4) == 0 {
                        ops.push(WriteOp::Delete(format!("{at:04}").into_bytes()));
                    }
                    if ranges == 2 && n == run / 2 {
                        ops.push(range("0100", "0900"));
                    }
                }
                let mut k = String::new();
                for n in 0..later {
                    // Every third writes the one before again; half land on an even key,
                    // which the run may hold.
                    if n % 3 != 2 {
                        let odd = next(2);
                        k = format!("{:04}", next(at / 2 + 10) * 2 + odd);
                    }
                    ops.push(if next(2) == 0 {
                        put(&k)
                    } else {
                        WriteOp::Delete(k.clone().into_bytes())
                    });
                }
                if ranges == 3 {
                    ops.push(range("0200", "0250"));
                }
                let points = effective_points(&ops);
                assert_eq!(
                    points,
                    checked_points(&ops),
                    "{later} later writes, ranges {ranges}"
                );
            }
        }
    }

    /// Parts hold consecutive runs of the points, at most as many parts as asked, none
    /// empty; each part's range deletes lie within its key interval, and together they
    /// cover what the batch's range deletes did.
    #[test]
    fn parts_split_the_key_space_and_clip_the_range_deletes() {
        // The range deletes come first: the puts after them stay.
        let mut ops = vec![range("k010", "k090"), range("a", "b")];
        ops.extend((0..100).map(|i| put(&format!("k{i:03}"))));
        let points = effective_points(&ops);
        assert_eq!(points.len(), 100);
        for parts in [1, 2, 3, 7] {
            let parts_made = split(&ops, &points, parts, NOTHING_APART);
            assert!(
                !parts_made.is_empty() && parts_made.len() <= parts,
                "{parts}: {}",
                parts_made.len()
            );
            let joined: Vec<_> = parts_made
                .iter()
                .flat_map(|p| p.points.iter().copied())
                .collect();
            assert_eq!(joined, points);
            let mut clipped: Vec<(&[u8], &[u8])> = Vec::new();
            for (n, part) in parts_made.iter().enumerate() {
                assert!(!part.points.is_empty());
                let low = if n == 0 { &b""[..] } else { part.points[0].0 };
                let high = parts_made.get(n + 1).map(|next| next.points[0].0);
                for &(s, e) in &part.ranges {
                    assert!(s >= low && high.is_none_or(|h| e <= h) && s < e);
                }
                clipped.extend(&part.ranges);
            }
            // The clipped pieces, in order, join up into the original ranges.
            let mut merged: Vec<(&[u8], &[u8])> = Vec::new();
            clipped.sort();
            for (s, e) in clipped {
                match merged.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    _ => merged.push((s, e)),
                }
            }
            assert_eq!(
                merged,
                [(&b"a"[..], &b"b"[..]), (&b"k010"[..], &b"k090"[..])]
            );
        }
    }

    /// The keys from `apart` on get a file of their own, whatever their cost; a range delete
    /// reaching past `apart` is clipped at the first of them.
    #[test]
    fn keys_from_apart_on_get_a_file_of_their_own() {
        let mut ops = vec![range("a", "x1")];
        ops.extend((0..50).map(|i| put(&format!("k{i:03}"))));
        ops.push(put("x2"));
        ops.push(put("x3"));
        let points = effective_points(&ops);
        let parts = split(&ops, &points, 2, b"x");
        let keys: Vec<Vec<&str>> = parts
            .iter()
            .map(|p| keys_and_ops(p.points).into_iter().map(|(k, _)| k).collect())
            .collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(keys[2], ["x2", "x3"]);
        assert_eq!(keys[0].len() + keys[1].len(), 50);
        let second = parts[1].points[0].0;
        assert_eq!(parts[0].ranges, [(&b"a"[..], second)]);
        assert_eq!(parts[1].ranges, [(second, &b"x1"[..])]);
        assert!(parts[2].ranges.is_empty());
        // Only keys from `apart` on: one file; none: as without it.
        let tail = effective_points(&ops[51..]);
        assert_eq!(split(&ops[51..], &tail, 2, b"x").len(), 1);
        let head = effective_points(&ops[..51]);
        assert_eq!(split(&ops[..51], &head, 2, b"x").len(), 2);
    }

    /// With no point writes, the range deletes make one part over the whole key space; a
    /// write of nothing but empty ranges makes none.
    #[test]
    fn range_deletes_alone_make_one_part() {
        let ops = vec![range("a", "c"), range("x", "y")];
        let points = effective_points(&ops);
        let one = split(&ops, &points, 4, NOTHING_APART);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].ranges.len(), 2);
        let ops = vec![range("c", "a")];
        let points = effective_points(&ops);
        assert!(split(&ops, &points, 4, NOTHING_APART).is_empty());
    }
}
