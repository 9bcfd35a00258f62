//! The file source: JSON Lines files in a directory (read in name order) or a single file.
//!
//! Progress is tracked per file as the number of bytes consumed, committed with each
//! batch, so a re-run reads only what no committed batch has read, and a file that grows
//! is read from where the last batch stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::EngineError;

/// A byte range of one input file that a batch reads. Files are expected to be complete
/// when listed (written elsewhere, then moved in), as with Spark's file source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRange {
    /// File name relative to the input directory (or the file's own name).
    pub file: String,
    /// First byte to read.
    pub start: u64,
    /// One past the last byte to read.
    pub end: u64,
    /// 1-based number of the line starting at `start`, for error messages.
    pub first_line: u64,
}

/// Where input comes from.
#[derive(Clone, Debug)]
pub struct FileSource {
    root: PathBuf,
    single_file: bool,
}

impl FileSource {
    /// A source over a file or a directory of files.
    pub fn new(path: &Path) -> Result<FileSource, EngineError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| EngineError::Io(format!("cannot read input {}: {e}", path.display())))?;
        Ok(FileSource {
            root: path.to_owned(),
            single_file: meta.is_file(),
        })
    }

    /// The path of a file named by a [`FileRange`].
    pub fn path_of(&self, file: &str) -> PathBuf {
        if self.single_file {
            self.root.clone()
        } else {
            self.root.join(file)
        }
    }

    fn files(&self) -> Result<Vec<String>, EngineError> {
        if self.single_file {
            let name = self
                .root
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Ok(vec![name]);
        }
        let mut names = Vec::new();
        let dir = std::fs::read_dir(&self.root).map_err(|e| {
            EngineError::Io(format!(
                "cannot list input directory {}: {e}",
                self.root.display()
            ))
        })?;
        for entry in dir {
            let entry = entry.map_err(|e| {
                EngineError::Io(format!("cannot list {}: {e}", self.root.display()))
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Hidden and temporary files are being written by someone; skip them like Spark.
            if name.starts_with('.') || name.starts_with('_') || !entry.path().is_file() {
                continue;
            }
            names.push(name);
        }
        names.sort();
        Ok(names)
    }

    /// Plans the next batch's input: up to `max_files` files with unread complete lines.
    pub fn next_ranges(
        &self,
        progress: &BTreeMap<String, crate::config::FileProgress>,
        max_files: usize,
    ) -> Result<Vec<FileRange>, EngineError> {
        self.next_ranges_bounded(progress, max_files, u64::MAX)
    }

    /// Like [`next_ranges`](Self::next_ranges), reading at most `max_bytes` in all: the
    /// range that reaches the budget ends at the last line break within it (or, when its
    /// first line alone is longer, at the end of that line), and no later file is planned.
    /// So a batch's memory is bounded by the budget plus one line, however large the
    /// backlog.
    pub fn next_ranges_bounded(
        &self,
        progress: &BTreeMap<String, crate::config::FileProgress>,
        max_files: usize,
        max_bytes: u64,
    ) -> Result<Vec<FileRange>, EngineError> {
        let mut ranges = Vec::new();
        let mut budget = max_bytes.max(1);
        for name in self.files()? {
            if ranges.len() >= max_files || budget == 0 {
                break;
            }
            let path = self.path_of(&name);
            let (consumed, lines) = progress.get(&name).map_or((0, 0), |p| (p.bytes, p.lines));
            let len = std::fs::metadata(&path)
                .map_err(|e| EngineError::Io(format!("cannot read {}: {e}", path.display())))?
                .len();
            if len <= consumed {
                continue;
            }
            // Everything present is read, including a last line without a trailing
            // newline, as Spark's file source does for files that are complete when listed;
            // unless that is over the budget.
            let mut end = len;
            if len - consumed > budget {
                end = line_end_within(&path, consumed, consumed + budget, len)?;
                budget = 0;
            } else {
                budget -= len - consumed;
            }
            ranges.push(FileRange {
                file: name,
                start: consumed,
                end,
                first_line: lines + 1,
            });
        }
        Ok(ranges)
    }

    /// Reads a planned range.
    pub fn read(&self, range: &FileRange) -> Result<String, EngineError> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path_of(&range.file);
        let io =
            |e: std::io::Error| EngineError::Io(format!("cannot read {}: {e}", path.display()));
        let mut f = std::fs::File::open(&path).map_err(io)?;
        f.seek(SeekFrom::Start(range.start)).map_err(io)?;
        let mut buf = Vec::with_capacity((range.end - range.start) as usize);
        f.take(range.end - range.start)
            .read_to_end(&mut buf)
            .map_err(io)?;
        if (buf.len() as u64) < range.end - range.start {
            return Err(EngineError::Io(format!(
                "input file {} shrank after it was planned into a batch (expected {} bytes from offset {})",
                path.display(),
                range.end - range.start,
                range.start
            )));
        }
        String::from_utf8(buf).map_err(|e| EngineError::Input {
            file: path.display().to_string(),
            line: range.first_line + count_lines(&e.as_bytes()[..e.utf8_error().valid_up_to()]),
            message: "input is not valid UTF-8".into(),
        })
    }
}

/// Where a range of `path` from `start` should end to read at most up to `limit`: just past
/// the last line break in `start..limit`, or, if there is none (the first line is longer
/// than the budget), just past the first line break after it (or at `len`). Reads
/// backwards, then forwards, in small chunks: never more than the line in memory.
fn line_end_within(path: &Path, start: u64, limit: u64, len: u64) -> Result<u64, EngineError> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 64 << 10;
    let io = |e: std::io::Error| EngineError::Io(format!("cannot read {}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut to = limit;
    while to > start {
        let from = to.saturating_sub(CHUNK).max(start);
        let chunk = &mut buf[..(to - from) as usize];
        f.seek(SeekFrom::Start(from)).map_err(io)?;
        f.read_exact(chunk).map_err(io)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(from + i as u64 + 1);
        }
        to = from;
    }
    let mut from = limit;
    while from < len {
        let to = (from + CHUNK).min(len);
        let chunk = &mut buf[..(to - from) as usize];
        f.seek(SeekFrom::Start(from)).map_err(io)?;
        f.read_exact(chunk).map_err(io)?;
        if let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            return Ok(from + i as u64 + 1);
        }
        from = to;
    }
    Ok(len)
}

/// Number of line breaks in `bytes`.
pub(crate) fn count_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileProgress;

    fn plan(dir: &Path, progress: &BTreeMap<String, FileProgress>, max: u64) -> Vec<FileRange> {
        FileSource::new(dir)
            .unwrap()
            .next_ranges_bounded(progress, 64, max)
            .unwrap()
    }

    #[test]
    fn a_byte_budget_cuts_batches_at_line_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        // Lines of 10 bytes.
        let line = "{\"a\":123}\n";
        std::fs::write(dir.path().join("a.jsonl"), line.repeat(10)).unwrap();
        std::fs::write(dir.path().join("b.jsonl"), line.repeat(2)).unwrap();
        // 35 bytes: three whole lines of a, nothing of b.
        let ranges = plan(dir.path(), &BTreeMap::new(), 35);
        assert_eq!(ranges.len(), 1);
        assert_eq!((ranges[0].start, ranges[0].end), (0, 30));
        // Read on from there: the rest of a (70 bytes) fits in 100, then 20 of b.
        let mut progress = BTreeMap::new();
        progress.insert(
            "a.jsonl".to_owned(),
            FileProgress {
                bytes: 30,
                lines: 3,
            },
        );
        let ranges = plan(dir.path(), &progress, 100);
        assert_eq!(ranges.len(), 2);
        assert_eq!(
            (ranges[0].start, ranges[0].end, ranges[0].first_line),
            (30, 100, 4)
        );
        assert_eq!((ranges[1].start, ranges[1].end), (0, 20));
        // Exactly at a boundary.
        let ranges = plan(dir.path(), &BTreeMap::new(), 20);
        assert_eq!((ranges[0].start, ranges[0].end), (0, 20));
    }

    #[test]
    fn a_line_longer_than_the_budget_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let long = format!("{{\"a\":\"{}\"}}\n", "x".repeat(200_000));
        std::fs::write(dir.path().join("a.jsonl"), format!("{long}{{\"a\":1}}\n")).unwrap();
        let ranges = plan(dir.path(), &BTreeMap::new(), 1000);
        assert_eq!((ranges[0].start, ranges[0].end), (0, long.len() as u64));
        // Without a final newline, the rest of the file.
        std::fs::write(dir.path().join("a.jsonl"), "x".repeat(300_000)).unwrap();
        let ranges = plan(dir.path(), &BTreeMap::new(), 1000);
        assert_eq!(ranges[0].end, 300_000);
    }
}
