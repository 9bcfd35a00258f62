//! Output retention: a pipeline's output file would grow without end, so the server drops
//! its oldest committed rows once they are past the tenant's retention (by bytes and by
//! age, [`Quotas::output_retention_bytes`] and [`Quotas::output_retention_ms`]).
//!
//! The output is one JSON Lines file whose byte offsets are the API's positions (`after`,
//! `next`, `before`) and whose committed length is in every commit record, so the file is
//! never rewritten or renamed: dropped bytes are punched out of it
//! (`fallocate(PUNCH_HOLE)`), which frees their disk blocks and keeps every offset. The
//! first byte still kept, `start`, is always the start of a row; readers refuse positions
//! before it.
//!
//! The committed output is cut into segments at batch boundaries: the segment being
//! written closes after a commit once it holds an eighth of the retention's bytes or is an
//! eighth of its age old (so a segment is at most about that big or old, plus one batch).
//! Only closed segments are dropped, oldest first: while the output kept is more than the
//! retention's bytes (but never the newest closed segment), or when a segment's last batch
//! committed longer ago than the retention's age. A segment ends at a committed length, so nothing that is not committed
//! (output of a batch in progress, which a restart cuts off) is ever dropped.
//!
//! The segments and `start` live in `output-retention.json` next to the output, written
//! atomically before any byte is dropped: after a crash, `start` never names bytes that
//! are still there while the ones before it are gone. Retention runs on the pipeline's
//! runner thread between batches (never while the engine appends) and on its trigger
//! ticks, so a stopped pipeline keeps its output as it is.
//!
//! [`Quotas::output_retention_bytes`]: crate::registry::Quotas::output_retention_bytes
//! [`Quotas::output_retention_ms`]: crate::registry::Quotas::output_retention_ms

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::registry::write_atomically;

/// How much output to keep.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Bytes of output kept at most (whole segments are dropped until it holds).
    pub bytes: u64,
    /// Age after which a segment's rows are dropped, in milliseconds.
    pub age_ms: u64,
}

impl Policy {
    /// A segment closes at this size.
    fn segment_bytes(&self) -> u64 {
        (self.bytes / 8).clamp(4 << 10, 64 << 20)
    }

    /// A segment closes at this age (of its first batch), in milliseconds.
    fn segment_age_ms(&self) -> u64 {
        (self.age_ms / 8).clamp(1_000, 3_600_000)
    }
}

/// A closed segment of committed output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Segment {
    /// Where it ends (exclusive): a committed length.
    end: u64,
    /// When its last batch committed (ms since the epoch).
    last_ms: i64,
}

/// What `output-retention.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Marks {
    /// The first byte kept: the start of a row; every byte before it was dropped.
    start: u64,
    /// Closed segments after `start`, oldest first.
    segments: Vec<Segment>,
    /// When the open segment (from the last closed one's end, or `start`, to the committed
    /// length) got its first batch's output.
    open_since_ms: Option<i64>,
}

/// One pipeline's output retention.
pub(crate) struct Retention {
    output: PathBuf,
    marks_path: PathBuf,
    marks: Marks,
}

impl Retention {
    /// The file the marks of the pipeline in `dir` live in.
    fn marks_path(dir: &Path) -> PathBuf {
        dir.join("output-retention.json")
    }

    /// The first byte of the output in `dir` still kept (0 when nothing was dropped).
    pub fn start_of(dir: &Path) -> u64 {
        Retention::load(dir, PathBuf::new()).marks.start
    }

    /// The retention of the pipeline in `dir`, whose output file is `output`. Marks that
    /// cannot be read start afresh from `start` 0: nothing more is dropped until new
    /// segments close, and the rows already dropped read as a gap the readers report.
    pub fn load(dir: &Path, output: PathBuf) -> Retention {
        let marks_path = Retention::marks_path(dir);
        let marks = match std::fs::read(&marks_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(error = %e, path = %marks_path.display(), "unreadable output retention marks");
                Marks::default()
            }),
            Err(_) => Marks::default(),
        };
        Retention {
            output,
            marks_path,
            marks,
        }
    }

    /// The first byte still kept.
    #[cfg(test)]
    fn start(&self) -> u64 {
        self.marks.start
    }

    /// Applies `policy` after a batch (or on a tick) with `committed` bytes of committed
    /// output at `now_ms`: closes the open segment if it is due, drops the segments past
    /// the retention. Returns the new `start` if it moved, after the marks are stored and
    /// before the dropped bytes are punched out: `publish` is called in between, so
    /// readers stop reading the bytes before they go.
    pub fn apply(
        &mut self,
        committed: u64,
        now_ms: i64,
        policy: Policy,
        publish: impl FnOnce(u64),
    ) -> std::io::Result<()> {
        let before = self.marks.clone();
        self.plan(committed, now_ms, policy);
        if self.marks == before {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&self.marks).expect("the marks serialise");
        write_atomically(&self.marks_path, &bytes)?;
        if self.marks.start != before.start {
            publish(self.marks.start);
            punch(&self.output, self.marks.start)?;
            tracing::debug!(
                output = %self.output.display(),
                start = self.marks.start,
                "dropped output past its retention"
            );
        }
        Ok(())
    }

    /// The marks' changes, in memory.
    fn plan(&mut self, committed: u64, now_ms: i64, policy: Policy) {
        let m = &mut self.marks;
        if committed < m.start {
            // Output the marks name was cut off (never done by the engine): start over.
            *m = Marks::default();
        }
        let open_start = m.segments.last().map_or(m.start, |s| s.end);
        if committed > open_start {
            let since = *m.open_since_ms.get_or_insert(now_ms);
            let age = u64::try_from(now_ms.saturating_sub(since)).unwrap_or(0);
            if committed - open_start >= policy.segment_bytes() || age >= policy.segment_age_ms() {
                m.segments.push(Segment {
                    end: committed,
                    last_ms: now_ms,
                });
                m.open_since_ms = None;
            }
        }
        while let Some(oldest) = m.segments.first() {
            let kept = committed - m.start;
            let age = u64::try_from(now_ms.saturating_sub(oldest.last_ms)).unwrap_or(0);
            // By bytes, the newest closed segment stays (a batch bigger than the whole
            // retention is still readable until the next segment closes); by age, not.
            let too_big = kept > policy.bytes && m.segments.len() > 1;
            if !too_big && age < policy.age_ms {
                break;
            }
            m.start = oldest.end;
            m.segments.remove(0);
        }
    }
}

/// Frees the disk blocks of `path`'s bytes before `start` (whole blocks; the file keeps
/// its length and offsets, and reads of a freed range give zeros).
fn punch(path: &Path, start: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const BLOCK: u64 = 4096;
    let len = start / BLOCK * BLOCK;
    if len == 0 {
        return Ok(());
    }
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let len = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: `file` is an open descriptor for the duration of the call; fallocate reads
    // nothing from our memory.
    let done = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            len,
        )
    };
    if done != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(bytes: u64, age_ms: u64) -> Policy {
        Policy { bytes, age_ms }
    }

    fn retention(dir: &Path) -> Retention {
        Retention::load(dir, dir.join("output.jsonl"))
    }

    #[test]
    fn segments_close_at_an_eighth_and_the_oldest_go_past_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = retention(dir.path());
        let p = policy(80_000, u64::MAX / 2);
        // 10 kB a batch: each batch closes a segment (an eighth is 10 kB).
        let mut committed = 0;
        for batch in 0..8 {
            committed += 10_000;
            r.plan(committed, batch, p);
        }
        assert_eq!(r.start(), 0, "80 kB kept: nothing dropped yet");
        committed += 10_000;
        r.plan(committed, 9, p);
        assert_eq!(r.start(), 10_000, "the oldest segment went");
        assert!(committed - r.start() <= p.bytes);
        // Output that is not in a closed segment is never dropped, however big.
        committed += 1_000_000;
        r.plan(committed, 10, p);
        assert_eq!(r.marks.segments.last().unwrap().end, committed);
        assert_eq!(r.start(), committed - 1_000_000, "only closed segments go");
        assert!(r.marks.segments.len() == 1);
    }

    #[test]
    fn segments_go_when_they_are_older_than_the_age() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = retention(dir.path());
        let p = policy(u64::MAX / 2, 80_000);
        r.plan(100, 0, p);
        assert!(r.marks.segments.is_empty(), "open: 100 bytes, just begun");
        // An eighth of the age later, the open segment closes at the next look.
        r.plan(100, 10_000, p);
        assert_eq!(
            r.marks.segments,
            [Segment {
                end: 100,
                last_ms: 10_000
            }]
        );
        r.plan(250, 20_000, p);
        r.plan(250, 89_999, p);
        assert_eq!(r.start(), 0);
        r.plan(250, 90_000, p);
        assert_eq!(r.start(), 100, "its last batch is 80 s old");
        assert_eq!(
            r.marks.segments,
            [Segment {
                end: 250,
                last_ms: 89_999
            }]
        );
    }

    #[test]
    fn the_marks_are_stored_before_bytes_are_punched_and_survive_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("output.jsonl");
        let row = format!("{{\"s\":\"{}\"}}\n", "x".repeat(10_000));
        let mut r = retention(dir.path());
        let p = policy(40_000, u64::MAX / 2);
        let mut text = String::new();
        let mut published = Vec::new();
        for batch in 0..10 {
            text.push_str(&row);
            std::fs::write(&output, &text).unwrap();
            r.apply(text.len() as u64, batch, p, |start| {
                // The marks are durable by now.
                assert_eq!(Retention::start_of(dir.path()), start);
                published.push(start);
            })
            .unwrap();
        }
        let start = r.start();
        assert!(
            start > 0 && start.is_multiple_of(row.len() as u64),
            "{start}"
        );
        assert_eq!(published.last(), Some(&start));
        // Blocks before `start` are freed; the length and the kept rows are intact.
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&output).unwrap();
        assert_eq!(meta.len(), text.len() as u64);
        assert!(meta.blocks() * 512 < meta.len() - start / 4096 * 4096 + 8192);
        let bytes = std::fs::read(&output).unwrap();
        assert_eq!(&bytes[start as usize..], &text.as_bytes()[start as usize..]);
        assert_eq!(Retention::start_of(dir.path()), start);
        assert_eq!(retention(dir.path()).marks, r.marks);
    }
}
