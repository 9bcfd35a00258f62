//! A pipeline's input log: the rows a client sent, durable before they are acknowledged.
//!
//! Rows are appended to an open segment, `.open-<seq>.jsonl`, which the engine's file source
//! does not list (its name starts with a dot). One writer thread per pipeline appends every
//! waiting request and then fsyncs once (group commit), and only then acknowledges them.
//! Before a batch runs, the open segment is sealed: renamed to `seg-<seq>.jsonl` (and the
//! directory fsynced), so the engine only ever sees complete files that never change. The
//! engine's checkpointed per-file offsets then give exactly-once processing of every
//! acknowledged row.
//!
//! After a crash, an open segment keeps every acknowledged row; a torn last line was never
//! acknowledged (the ack follows the fsync) and is cut off before the segment is sealed.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::registry::sync_dir;

/// Resolves an append once its rows are durable (or could not be stored).
type Ack = tokio::sync::oneshot::Sender<Result<(), String>>;

enum Request {
    Append {
        bytes: Vec<u8>,
        ack: Ack,
    },
    Seal {
        ack: mpsc::Sender<Result<(), String>>,
    },
}

/// The writer of one pipeline's input log.
pub(crate) struct InputLog {
    tx: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

struct Writer {
    dir: PathBuf,
    seq: u64,
    open: Option<File>,
    open_len: u64,
}

fn open_name(seq: u64) -> String {
    format!(".open-{seq:012}.jsonl")
}

fn sealed_name(seq: u64) -> String {
    format!("seg-{seq:012}.jsonl")
}

fn parse_seq(name: &str) -> Option<(u64, bool)> {
    if let Some(rest) = name.strip_prefix(".open-") {
        return rest.strip_suffix(".jsonl")?.parse().ok().map(|s| (s, true));
    }
    let rest = name.strip_prefix("seg-")?.strip_suffix(".jsonl")?;
    rest.parse().ok().map(|s| (s, false))
}

/// Recovers the log in `dir` after a restart (or a crash): open segments are cut back to
/// their last complete line and sealed. Returns the next segment number.
fn recover(dir: &Path) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let mut next = 0;
    let mut open = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some((seq, is_open)) = parse_seq(&name) {
            next = next.max(seq + 1);
            if is_open {
                open.push(seq);
            }
        }
    }
    for seq in open {
        let path = dir.join(open_name(seq));
        let bytes = std::fs::read(&path)?;
        let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if keep == 0 {
            std::fs::remove_file(&path)?;
            continue;
        }
        if keep < bytes.len() {
            tracing::warn!(
                discarded = bytes.len() - keep,
                "cutting an unacknowledged torn line off the input log"
            );
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(keep as u64)?;
            f.sync_all()?;
        }
        std::fs::rename(&path, dir.join(sealed_name(seq)))?;
    }
    sync_dir(dir)?;
    Ok(next)
}

impl InputLog {
    /// Recovers the log in `dir` and starts its writer thread.
    pub fn open(dir: &Path, pipeline: &str) -> std::io::Result<InputLog> {
        let seq = recover(dir)?;
        let mut writer = Writer {
            dir: dir.to_owned(),
            seq,
            open: None,
            open_len: 0,
        };
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("input-{pipeline}"))
            .spawn(move || writer.run(rx))?;
        Ok(InputLog {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Appends complete lines (each ending in `\n`); resolves once they are durable.
    pub async fn append(&self, bytes: Vec<u8>) -> Result<(), String> {
        let (ack, done) = tokio::sync::oneshot::channel();
        self.tx
            .as_ref()
            .ok_or("the input log is closed")?
            .send(Request::Append { bytes, ack })
            .map_err(|_| "the input log writer stopped".to_owned())?;
        done.await
            .map_err(|_| "the input log writer stopped".to_owned())?
    }

    /// Seals the open segment, so a batch can read everything acknowledged so far. Blocks.
    pub fn seal(&self) -> Result<(), String> {
        let (ack, done) = mpsc::channel();
        self.tx
            .as_ref()
            .ok_or("the input log is closed")?
            .send(Request::Seal { ack })
            .map_err(|_| "the input log writer stopped".to_owned())?;
        done.recv()
            .map_err(|_| "the input log writer stopped".to_owned())?
    }
}

impl Drop for InputLog {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Writer {
    fn run(&mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            // Group commit: everything already waiting is written with one fsync.
            let mut waiting = vec![first];
            while waiting.len() < 1024 {
                match rx.try_recv() {
                    Ok(r) => waiting.push(r),
                    Err(_) => break,
                }
            }
            let mut acks = Vec::new();
            for request in waiting {
                match request {
                    Request::Append { bytes, ack } => {
                        let result = self.write(&bytes);
                        acks.push((ack, result));
                    }
                    Request::Seal { ack } => {
                        let synced = self.sync();
                        Self::acknowledge(&mut acks, &synced);
                        let _ = ack.send(synced.and_then(|()| self.seal()));
                    }
                }
            }
            let synced = self.sync();
            Self::acknowledge(&mut acks, &synced);
        }
        // Closing: acknowledged rows are all synced already; seal them for the next start.
        let _ = self.seal();
    }

    fn acknowledge(acks: &mut Vec<(Ack, Result<(), String>)>, synced: &Result<(), String>) {
        for (ack, written) in acks.drain(..) {
            let _ = ack.send(written.and(synced.clone()));
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.open.is_none() {
            let path = self.dir.join(open_name(self.seq));
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("cannot create input segment {}: {e}", path.display()))?;
            // The new file's directory entry must be durable before its rows are acknowledged.
            sync_dir(&self.dir).map_err(|e| format!("cannot sync the input log: {e}"))?;
            self.open = Some(file);
            self.open_len = 0;
        }
        let file = self.open.as_mut().expect("opened above");
        if let Err(e) = file.write_all(bytes) {
            // A partial write leaves a torn line: cut it off so later rows stay on lines of
            // their own.
            let _ = file.set_len(self.open_len);
            return Err(format!("cannot append to the input log: {e}"));
        }
        self.open_len += bytes.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), String> {
        match &self.open {
            Some(f) => f
                .sync_data()
                .map_err(|e| format!("cannot sync the input log: {e}")),
            None => Ok(()),
        }
    }

    fn seal(&mut self) -> Result<(), String> {
        if self.open.take().is_none() {
            return Ok(());
        }
        let from = self.dir.join(open_name(self.seq));
        let to = self.dir.join(sealed_name(self.seq));
        std::fs::rename(&from, &to)
            .and_then(|()| sync_dir(&self.dir))
            .map_err(|e| format!("cannot seal input segment {}: {e}", from.display()))?;
        self.seq += 1;
        self.open_len = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_cuts_torn_lines_and_seals_open_segments() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(sealed_name(0)), "{\"a\":1}\n").unwrap();
        std::fs::write(dir.path().join(open_name(1)), "{\"a\":2}\n{\"a\":").unwrap();
        std::fs::write(dir.path().join(open_name(2)), "{\"a\"").unwrap();
        assert_eq!(recover(dir.path()).unwrap(), 3);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(sealed_name(1))).unwrap(),
            "{\"a\":2}\n"
        );
        assert!(!dir.path().join(open_name(2)).exists());
        assert!(!dir.path().join(sealed_name(2)).exists());
    }

    #[test]
    fn appends_are_sealed_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let log = InputLog::open(dir.path(), "t").unwrap();
        rt.block_on(log.append(b"1\n".to_vec())).unwrap();
        rt.block_on(log.append(b"2\n".to_vec())).unwrap();
        log.seal().unwrap();
        log.seal().unwrap();
        rt.block_on(log.append(b"3\n".to_vec())).unwrap();
        drop(log);
        let read = |seq| std::fs::read_to_string(dir.path().join(sealed_name(seq))).unwrap();
        assert_eq!(read(0), "1\n2\n");
        assert_eq!(read(1), "3\n");
    }
}
