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
