//! State queries share a few open checkpoint readers instead of opening one per request:
//! each reader is a read-only RocksDB instance (all of them share one block cache, see
//! `statebox_state`), so a burst of queries would otherwise open as many instances (file
//! descriptors, threads, table readers) as it has requests. At most [`MAX_READERS`] stay open (least recently used out first), a reader
//! serves every query of its pipeline until the pipeline commits another batch, and at
//! most [`MAX_READING`] queries read at once (more wait their turn).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use statebox_engine::{EngineError, StateReader};

/// Readers kept open over all pipelines.
pub(crate) const MAX_READERS: usize = 8;
/// State queries reading at once over all tenants.
pub(crate) const MAX_READING: usize = 4;

struct Entry {
    pipeline: String,
    /// The pipeline's last committed batch when the reader was opened.
    batch: Option<u64>,
    reader: Arc<StateReader>,
    used: Instant,
}

/// The shared readers.
pub(crate) struct ReaderCache {
    entries: Mutex<Vec<Entry>>,
    /// Turns to read.
    pub reading: Arc<tokio::sync::Semaphore>,
}

impl ReaderCache {
    pub fn new() -> ReaderCache {
        ReaderCache {
            entries: Mutex::new(Vec::new()),
            reading: Arc::new(tokio::sync::Semaphore::new(MAX_READING)),
        }
    }

    /// A reader of `pipeline`'s checkpoint in `checkpoint`, current as of its committed
    /// `batch`. Blocks (opening a reader reads the checkpoint's metadata).
    pub fn get(
        &self,
        pipeline: &str,
        checkpoint: &Path,
        batch: Option<u64>,
    ) -> Result<Arc<StateReader>, EngineError> {
        {
            let mut entries = self.entries.lock().expect("readers lock");
            if let Some(e) = entries
                .iter_mut()
                .find(|e| e.pipeline == pipeline && e.batch == batch)
            {
                e.used = Instant::now();
                return Ok(e.reader.clone());
            }
        }
        let reader = Arc::new(StateReader::open(checkpoint)?);
        let mut entries = self.entries.lock().expect("readers lock");
        entries.retain(|e| e.pipeline != pipeline);
        if entries.len() >= MAX_READERS
            && let Some(oldest) = entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
        {
            entries.swap_remove(oldest);
        }
        entries.push(Entry {
            pipeline: pipeline.to_owned(),
            batch,
            reader: reader.clone(),
            used: Instant::now(),
        });
        Ok(reader)
    }

    /// Closes `pipeline`'s reader (the pipeline is being deleted).
    pub fn forget(&self, pipeline: &str) {
        self.entries
            .lock()
            .expect("readers lock")
            .retain(|e| e.pipeline != pipeline);
    }
}
