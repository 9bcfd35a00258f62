//! Decoding input: JSON Lines → (grouping key, row) → partition, grouped by key in
//! arrival order.
//!
//! Decoding runs in two parallel phases. First, chunks of lines (split at line breaks)
//! are scanned on all workers: each row is checked against the processor's input schema
//! and its key columns are extracted in the same pass. Then each worker groups the rows of
//! its own partitions, walking the chunks in input order so every key's rows keep their
//! arrival order. The grouping copies each partition's rows into one text of its own, key
//! by key: a processor is then handed each key's rows from adjacent memory, not from all
//! over the batch's input (with keys spread over the input, every row read from the input
//! itself would be a cache miss).

use std::ops::Range;

use rustc_hash::FxHashMap;
use statebox_schema::{RawValue, RowScanner};
use statebox_state::keys;

use crate::EngineError;
use crate::source::FileRange;

/// Where an input row came from, to name it in errors.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Origin {
    /// Index of the file among the batch's input ranges followed by its initial-state
    /// ranges.
    pub file: u32,
    /// 1-based line number in the file.
    pub line: u64,
}

/// All rows of one grouping key in one batch.
pub(crate) struct Group {
    /// The key: a JSON array of the key columns' values.
    pub key: String,
    /// The key's rows, in arrival order: their indexes among the partition's rows
    /// ([`PartitionInput::rows`], [`PartitionInput::origins`]).
    pub rows: Range<usize>,
}

/// One partition's input for a batch: groups in order of each key's first row, and their
/// rows, key by key.
#[derive(Default)]
pub(crate) struct PartitionInput {
    pub groups: Vec<Group>,
    /// Every row's text, one after the other, key by key.
    text: String,
    /// Where each row ends in `text`; row `i` starts where row `i - 1` ends.
    ends: Vec<usize>,
    /// Where each row came from.
    origins: Vec<Origin>,
}

impl PartitionInput {
    /// Every row, key by key: a group's rows are `rows()[group.rows]`.
    pub fn rows(&self) -> Vec<&str> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let row = &self.text[start..end];
                start = end;
                row
            })
            .collect()
    }

    /// Where each row of `group` came from.
    pub fn origins(&self, group: &Group) -> &[Origin] {
        &self.origins[group.rows.clone()]
    }
}

/// The input text of one file range with the file's display name.
pub(crate) struct Text<'a> {
    pub text: &'a str,
    pub range: &'a FileRange,
    pub file_name: String,
}

/// A contiguous run of lines of one text.
struct Chunk<'a> {
    file: u32,
    text: &'a str,
    first_line: u64,
}

/// Event-time handling while decoding: which scanned column holds event time and the
/// watermark that decides lateness.
#[derive(Clone, Copy)]
pub(crate) struct EventTime<'c> {
    /// The event-time column's name.
    pub column: &'c str,
    /// Rows with event time at or before this are late and dropped.
    pub watermark_ms: i64,
}

/// What decoding a batch produced besides the groups.
#[derive(Default, Debug, Clone)]
pub(crate) struct DecodeStats {
    /// Rows handed to the processor.
    pub rows: u64,
    /// Rows dropped as late.
    pub late_rows: u64,
    /// The largest event time among all rows read (late ones included), if any.
    pub max_event_time_ms: Option<i64>,
    /// The same for each text, in the order of the texts.
    pub max_event_time_per_text: Vec<Option<i64>>,
}

/// One decoded row of a chunk.
struct Decoded<'a> {
    key: Range<u32>,
    row: &'a str,
    line: u64,
}

/// A chunk's decoded rows, by partition and in input order within each; keys live in one
/// arena string.
struct DecodedChunk<'a> {
    file: u32,
    keys: String,
    /// Indexed by partition: each grouping worker then reads only its partitions' rows.
    rows: Vec<Vec<Decoded<'a>>>,
    late_rows: u64,
    max_event_time_ms: Option<i64>,
}

/// Decodes every text of a batch into `partitions` groups using `workers` threads.
pub(crate) fn decode<'a>(
    texts: &[Text<'a>],
    file_offset: u32,
    scanner: &RowScanner,
    key_columns: &[String],
    event_time: Option<EventTime<'_>>,
    partitions: usize,
    workers: usize,
) -> Result<(Vec<PartitionInput>, DecodeStats), EngineError> {
    let chunks = split(texts, workers * 4);
    let lanes = workers.min(chunks.len()).max(1);
    let per_lane = chunks.len().div_ceil(lanes).max(1);
    let decoded: Vec<Result<Vec<DecodedChunk<'a>>, EngineError>> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .chunks(per_lane)
            .map(|lane| {
                s.spawn(move || {
                    lane.iter()
                        .map(|c| {
                            decode_chunk(c, texts, scanner, key_columns, event_time, partitions)
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("decoder panicked"))
            .collect()
    });
    // Lanes are in input order, so the first error found is the earliest bad line.
    let mut all = Vec::with_capacity(chunks.len());
    for lane in decoded {
        all.extend(lane?);
    }
    let mut max_event_time_per_text = vec![None; texts.len()];
    for c in &all {
        let m = &mut max_event_time_per_text[c.file as usize];
        *m = (*m).max(c.max_event_time_ms);
    }
    let stats = DecodeStats {
        rows: all
            .iter()
            .flat_map(|c| &c.rows)
            .map(|r| r.len() as u64)
            .sum(),
        late_rows: all.iter().map(|c| c.late_rows).sum(),
        max_event_time_ms: all.iter().filter_map(|c| c.max_event_time_ms).max(),
        max_event_time_per_text,
    };

    let group_lanes = workers.min(partitions).max(1);
    let all = &all;
    let mut grouped: Vec<(usize, PartitionInput)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..group_lanes)
            .map(|lane| {
                s.spawn(move || {
                    (lane..partitions)
                        .step_by(group_lanes)
                        .map(|p| (p, group(all, p, file_offset)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("grouping worker panicked"))
            .collect()
    });
    grouped.sort_by_key(|(p, _)| *p);
    Ok((grouped.into_iter().map(|(_, g)| g).collect(), stats))
}

/// Splits the texts into about `target` chunks at line breaks, counting line numbers.
fn split<'a>(texts: &[Text<'a>], target: usize) -> Vec<Chunk<'a>> {
    let total: usize = texts.iter().map(|t| t.text.len()).sum();
    let size = (total / target.max(1)).max(1 << 16);
    let mut chunks = Vec::new();
    for (file, t) in texts.iter().enumerate() {
        let mut rest = t.text;
        let mut line = t.range.first_line;
        while !rest.is_empty() {
            let cut = if rest.len() <= size {
                rest.len()
            } else {
                rest[size..].find('\n').map_or(rest.len(), |i| size + i + 1)
            };
            let (head, tail) = rest.split_at(cut);
            chunks.push(Chunk {
                file: file as u32,
                text: head,
                first_line: line,
            });
            line += crate::source::count_lines(head.as_bytes());
            rest = tail;
        }
    }
    chunks
}

fn decode_chunk<'a>(
    chunk: &Chunk<'a>,
    texts: &[Text<'a>],
    scanner: &RowScanner,
    key_columns: &[String],
    event_time: Option<EventTime<'_>>,
    partitions: usize,
) -> Result<DecodedChunk<'a>, EngineError> {
    let mut out = DecodedChunk {
        file: chunk.file,
        keys: String::with_capacity(chunk.text.len() / 4),
        rows: (0..partitions)
            .map(|_| Vec::with_capacity(chunk.text.len() / 64 / partitions.max(1)))
            .collect(),
        late_rows: 0,
        max_event_time_ms: None,
    };
    // The scanner extracts the key columns and then, in event-time mode, the event time.
    let mut columns: Vec<Option<&RawValue>> = vec![None; scanner.columns().len()];
    for (i, line) in chunk.text.split('\n').enumerate() {
        let line_no = chunk.first_line + i as u64;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| EngineError::Input {
            file: texts[chunk.file as usize].file_name.clone(),
            line: line_no,
            message,
        };
        scanner
            .scan_into(line, &mut columns)
            .map_err(|e| bad(e.to_string()))?;
        if let Some(et) = event_time {
            let Some(raw) = columns[key_columns.len()] else {
                return Err(bad(format!(
                    "the row has no event-time column `{}`",
                    et.column
                )));
            };
            let ts = statebox_schema::timestamp_millis(raw.get())
                .map_err(|e| bad(format!("event-time column `{}`: {e}", et.column)))?;
            out.max_event_time_ms = out.max_event_time_ms.max(Some(ts));
            if ts <= et.watermark_ms {
                out.late_rows += 1;
                continue;
            }
        }
        let start = out.keys.len();
        out.keys.push('[');
        for (c, value) in key_columns.iter().zip(&columns) {
            let Some(value) = value else {
                return Err(bad(format!("the row has no key column `{c}`")));
            };
            if out.keys.len() > start + 1 {
                out.keys.push(',');
            }
            push_canonical(&mut out.keys, value.get());
        }
        out.keys.push(']');
        let partition = partition_of(&out.keys.as_bytes()[start..], partitions);
        out.rows[partition].push(Decoded {
            key: start as u32..out.keys.len() as u32,
            row: line,
            line: line_no,
        });
    }
    Ok(out)
}

/// Groups partition `p`'s rows by key, in input order, and copies them key by key into the
/// partition's own text. The copy reads the input in order: a first pass counts each key's
/// rows and bytes, a second puts each row at its key's next place.
fn group(chunks: &[DecodedChunk<'_>], p: usize, file_offset: u32) -> PartitionInput {
    let rows_of_p = || {
        chunks
            .iter()
            .flat_map(move |chunk| chunk.rows[p].iter().map(move |r| (chunk, r)))
    };
    // Per key, in order of first rows: (key, rows, bytes); and each row's key.
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    let mut keys: Vec<(&str, usize, usize)> = Vec::new();
    let mut key_of_row: Vec<u32> = Vec::new();
    for (chunk, row) in rows_of_p() {
        let key = &chunk.keys[row.key.start as usize..row.key.end as usize];
        let i = *index.entry(key).or_insert_with(|| {
            keys.push((key, 0, 0));
            keys.len() - 1
        });
        keys[i].1 += 1;
        keys[i].2 += row.row.len();
        key_of_row.push(i as u32);
    }
    // Each key's next row index and byte offset.
    let mut next = Vec::with_capacity(keys.len());
    let mut groups = Vec::with_capacity(keys.len());
    let (mut rows, mut bytes) = (0, 0);
    for &(key, n, len) in &keys {
        next.push((rows, bytes));
        groups.push(Group {
            key: key.to_owned(),
            rows: rows..rows + n,
        });
        rows += n;
        bytes += len;
    }
    let mut text = vec![0u8; bytes];
    let mut ends = vec![0; rows];
    let mut origins = vec![Origin::default(); rows];
    for ((chunk, row), &i) in rows_of_p().zip(&key_of_row) {
        let (r, at) = &mut next[i as usize];
        let end = *at + row.row.len();
        text[*at..end].copy_from_slice(row.row.as_bytes());
        ends[*r] = end;
        origins[*r] = Origin {
            file: file_offset + chunk.file,
            line: row.line,
        };
        *r += 1;
        *at = end;
    }
    PartitionInput {
        groups,
        // Whole rows of valid text, so valid text (checked again: cheap, and no `unsafe`).
        text: String::from_utf8(text).expect("rows are whole UTF-8 strings"),
        ends,
        origins,
    }
}

/// Appends a key column's JSON in canonical form, so that equal values make equal keys
/// however the input spelled them (whitespace, escapes, `1.0` vs `1e0`).
fn push_canonical(out: &mut String, raw: &str) {
    let raw = raw.trim();
    let simple_string =
        raw.len() >= 2 && raw.starts_with('"') && !raw[1..raw.len() - 1].contains(['\\', '"']);
    let simple_int = !raw.is_empty()
        && raw != "-"
        && raw
            .bytes()
            .enumerate()
            .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'));
    if simple_string || simple_int {
        out.push_str(raw);
    } else {
        match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(v) => out.push_str(&v.to_string()),
            Err(_) => out.push_str(raw),
        }
    }
}

/// The state partition of a key ([`keys::grouping_key_hash`]).
pub(crate) fn partition_of(key: &[u8], partitions: usize) -> usize {
    (keys::grouping_key_hash(key) % partitions as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first_line: u64) -> FileRange {
        FileRange {
            file: "f".into(),
            start: 0,
            end: 0,
            first_line,
        }
    }

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
        // Part of the checkpoint format: changing it would move keys between partitions
        // of existing checkpoints.
        assert_eq!(
            partition_of(b"", 7),
            (0xcbf2_9ce4_8422_2325u64 % 7) as usize
        );
        assert_eq!(partition_of(b"[\"u1\"]", 4), 3);
    }

    #[test]
    fn groups_keep_arrival_order_across_chunks_and_workers() {
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("{{\"k\":\"k{}\",\"i\":{i}}}\n", i % 7));
        }
        let r = range(1);
        let texts = [Text {
            text: &text,
            range: &r,
            file_name: "f".into(),
        }];
        let scanner = RowScanner::new(None, vec!["k".into()]);
        let (parts, stats) = decode(&texts, 0, &scanner, &["k".into()], None, 3, 4).unwrap();
        assert_eq!(stats.rows, 20_000);
        let mut seen = 0;
        for p in &parts {
            let rows = p.rows();
            for g in &p.groups {
                let idx: Vec<u64> = p.origins(g).iter().map(|o| o.line).collect();
                assert!(
                    idx.windows(2).all(|w| w[0] < w[1]),
                    "rows of {} out of order",
                    g.key
                );
                // Each row is the input's line its origin names, whole.
                for (row, line) in rows[g.rows.clone()].iter().zip(&idx) {
                    let i = line - 1;
                    assert_eq!(*row, format!("{{\"k\":\"k{}\",\"i\":{i}}}", i % 7));
                    assert_eq!(g.key, format!("[\"k{}\"]", i % 7));
                }
                seen += g.rows.len();
            }
        }
        assert_eq!(seen, 20_000);
    }

    #[test]
    fn late_rows_are_dropped_and_counted() {
        let text = "{\"k\":1,\"ts\":5}\n{\"k\":1,\"ts\":10}\n{\"k\":2,\"ts\":\"1970-01-01T00:00:00.020Z\"}\n";
        let r = range(1);
        let texts = [Text {
            text,
            range: &r,
            file_name: "f".into(),
        }];
        let scanner = RowScanner::new(None, vec!["k".into(), "ts".into()]);
        let et = EventTime {
            column: "ts",
            watermark_ms: 10,
        };
        let (parts, stats) = decode(&texts, 0, &scanner, &["k".into()], Some(et), 1, 1).unwrap();
        assert_eq!(
            (stats.rows, stats.late_rows, stats.max_event_time_ms),
            (1, 2, Some(20))
        );
        assert_eq!(parts[0].groups[0].key, "[2]");
    }

    #[test]
    fn reports_the_first_bad_line() {
        let text = "{\"k\":1}\n{\"k\":2}\nnot json\n{\"x\":1}\n";
        let r = range(10);
        let texts = [Text {
            text,
            range: &r,
            file_name: "in.jsonl".into(),
        }];
        let scanner = RowScanner::new(None, vec!["k".into()]);
        match decode(&texts, 0, &scanner, &["k".into()], None, 2, 2) {
            Err(EngineError::Input { file, line, .. }) => {
                assert_eq!((file.as_str(), line), ("in.jsonl", 12));
            }
            other => panic!("expected an input error, got {:?}", other.map(|(_, s)| s)),
        }
    }
}
