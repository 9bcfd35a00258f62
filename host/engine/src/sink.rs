//! The output sink: a JSON Lines file appended once per batch.
//!
//! The file is only ever appended to, and the committed length after each batch is
//! stored in that batch's commit record. Opening the sink truncates anything past the
//! committed length: output of a batch that died before its commit.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::EngineError;

pub(crate) struct Sink {
    path: PathBuf,
    file: File,
    len: u64,
}

impl Sink {
    pub fn open(path: &Path, committed: u64) -> Result<Sink, EngineError> {
        let io = |e: std::io::Error| {
            EngineError::Io(format!("cannot open output {}: {e}", path.display()))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < committed {
            return Err(EngineError::Io(format!(
                "output {} has {len} bytes but the checkpoint committed {committed}: it was \
                 truncated or replaced outside statebox; restore it or use a new checkpoint",
                path.display()
            )));
        }
        if len > committed {
            tracing::info!(
                discarded = len - committed,
                "discarding output of an uncommitted batch"
            );
            file.set_len(committed).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        Ok(Sink {
            path: path.to_owned(),
            file,
            len: committed,
        })
    }

    /// Cuts the file back to `len` bytes (the committed length) after a batch failed.
    pub fn rollback(&mut self, len: u64) -> Result<(), EngineError> {
        let io = |e: std::io::Error| {
            EngineError::Io(format!(
                "cannot truncate output {}: {e}",
                self.path.display()
            ))
        };
        // The file, not `self.len`, is the truth: a failed append may have written part.
        if self.file.metadata().map_err(io)?.len() == len {
            self.len = len;
            return Ok(());
        }
        self.file.set_len(len).map_err(io)?;
        self.file.sync_all().map_err(io)?;
        self.len = len;
        Ok(())
    }

    /// Appends a batch's output durably and returns the new length.
    pub fn append(&mut self, bytes: &[u8]) -> Result<u64, EngineError> {
        if bytes.is_empty() {
            return Ok(self.len);
        }
        let io = |e: std::io::Error| {
            EngineError::Io(format!("cannot write output {}: {e}", self.path.display()))
        };
        self.file.write_all(bytes).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.len += bytes.len() as u64;
        Ok(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_cuts_uncommitted_output_and_appends_continue_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let mut sink = Sink::open(&path, 0).unwrap();
        assert_eq!(sink.append(b"{\"a\":1}\n").unwrap(), 8);
        assert_eq!(sink.append(b"{\"uncommitted\":1}\n").unwrap(), 26);
        sink.rollback(8).unwrap();
        assert_eq!(sink.append(b"{\"b\":2}\n").unwrap(), 16);
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
    }

    #[test]
    fn opening_truncates_to_the_committed_length_and_refuses_a_shorter_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, b"{\"a\":1}\n{\"partial\"").unwrap();
        Sink::open(&path, 8).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n");
        assert!(matches!(Sink::open(&path, 100), Err(EngineError::Io(_))));
    }
}
