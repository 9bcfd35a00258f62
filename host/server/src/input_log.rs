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
//!
//! I/O errors lose nothing acknowledged and let nothing unacknowledged through:
//! - a failed or partial write, or a failed fsync, fails the requests it covers, and the
//!   open segment is cut back to its acknowledged length before anything else is written
//!   (if the cut fails too, appends and seals are refused until a retry of it succeeds), so
//!   rows a client was told failed are never processed, and a torn line never merges with
//!   the next one;
//! - a seal whose rename succeeded but whose directory fsync failed still moves on to the
//!   next segment number (the sealed segment is never overwritten by the next one) and
//!   fails until the directory fsync succeeds.
//!
//! All file operations go through [`LogFs`], so tests inject each of these faults.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::registry::sync_dir;

/// The file operations of the input log's writer: the real ones, or faulty ones in tests.
pub(crate) trait LogFs: Send + Sync {
    fn create_append(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new().create(true).append(true).open(path)
    }
    fn write_all(&self, file: &mut File, bytes: &[u8]) -> std::io::Result<()> {
        file.write_all(bytes)
    }
    fn sync_data(&self, file: &File) -> std::io::Result<()> {
        file.sync_data()
    }
    fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
        file.set_len(len)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        sync_dir(dir)
    }
}

/// The operating system's file operations.
pub(crate) struct RealFs;

impl LogFs for RealFs {}

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
    fs: Arc<dyn LogFs>,
    seq: u64,
    open: Option<File>,
    /// Bytes written to the open segment (some maybe not yet synced).
    written: u64,
    /// Bytes of the open segment that are durable and acknowledged.
    synced: u64,
    /// After an I/O error: the open segment must be cut back to this length before it
    /// takes more rows or is sealed.
    cut_to: Option<u64>,
    /// A sealed segment's rename may not be durable yet: the directory fsync failed.
    dir_unsynced: bool,
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

/// The length of `file` up to and including its last line break (0 if none), read
/// backwards in small chunks: an open segment may be large.
fn complete_len(file: &mut File) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 64 << 10;
    let mut to = file.metadata()?.len();
    let mut buf = vec![0u8; CHUNK as usize];
    while to > 0 {
        let from = to.saturating_sub(CHUNK);
        let chunk = &mut buf[..(to - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(from + i as u64 + 1);
        }
        to = from;
    }
    Ok(0)
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
        let mut f = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = f.metadata()?.len();
        let keep = complete_len(&mut f)?;
        if keep == 0 {
            drop(f);
            std::fs::remove_file(&path)?;
            continue;
        }
        if keep < len {
            tracing::warn!(
                discarded = len - keep,
                "cutting an unacknowledged torn line off the input log"
            );
            f.set_len(keep)?;
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
        InputLog::open_with(dir, pipeline, Arc::new(RealFs))
    }

    /// Like [`open`](Self::open), with the writer's file operations going through `fs`.
    pub(crate) fn open_with(
        dir: &Path,
        pipeline: &str,
        fs: Arc<dyn LogFs>,
    ) -> std::io::Result<InputLog> {
        let seq = recover(dir)?;
        let mut writer = Writer {
            dir: dir.to_owned(),
            fs,
            seq,
            open: None,
            written: 0,
            synced: 0,
            cut_to: None,
            dir_unsynced: false,
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

    /// Cuts the open segment back to `len` (durably) now, or leaves the cut pending.
    fn cut(&mut self, len: u64) -> Result<(), String> {
        self.cut_to = Some(len);
        let Some(file) = self.open.as_ref() else {
            self.cut_to = None;
            return Ok(());
        };
        self.fs
            .set_len(file, len)
            .and_then(|()| self.fs.sync_data(file))
            .map_err(|e| {
                format!(
                    "cannot cut rows that were not stored off the input log ({e}); the log \
                     takes no rows until it can"
                )
            })?;
        self.cut_to = None;
        self.written = len;
        self.synced = self.synced.min(len);
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), String> {
        if let Some(len) = self.cut_to {
            self.cut(len)?;
        }
        if self.open.is_none() {
            let path = self.dir.join(open_name(self.seq));
            let file = self
                .fs
                .create_append(&path)
                .map_err(|e| format!("cannot create input segment {}: {e}", path.display()))?;
            // The new file's directory entry must be durable before its rows are acknowledged.
            self.fs
                .sync_dir(&self.dir)
                .map_err(|e| format!("cannot sync the input log: {e}"))?;
            self.open = Some(file);
            self.written = 0;
            self.synced = 0;
        }
        let file = self.open.as_mut().expect("opened above");
        if let Err(e) = self.fs.write_all(file, bytes) {
            // A partial write leaves a torn line: cut it off, so later rows stay on lines of
            // their own (or, if that fails too, before anything else is written).
            let written = self.written;
            let _ = self.cut(written);
            return Err(format!("cannot append to the input log: {e}"));
        }
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), String> {
        // Nothing is synced (and so acknowledged) while rows that failed are still there.
        if let Some(len) = self.cut_to {
            self.cut(len)?;
        }
        let Some(file) = &self.open else {
            return Ok(());
        };
        if self.written == self.synced {
            return Ok(());
        }
        if let Err(e) = self.fs.sync_data(file) {
            // Whatever was written since the last sync is reported failed, so it must never
            // be processed: cut it off.
            let synced = self.synced;
            let _ = self.cut(synced);
            return Err(format!("cannot sync the input log: {e}"));
        }
        self.synced = self.written;
        Ok(())
    }

    fn seal(&mut self) -> Result<(), String> {
        if self.dir_unsynced {
            self.fs
                .sync_dir(&self.dir)
                .map_err(|e| format!("cannot sync the input log's directory: {e}"))?;
            self.dir_unsynced = false;
        }
        if let Some(len) = self.cut_to {
            self.cut(len)?;
        }
        if self.open.is_none() {
            return Ok(());
        }
        let from = self.dir.join(open_name(self.seq));
        let to = self.dir.join(sealed_name(self.seq));
        self.fs
            .rename(&from, &to)
            .map_err(|e| format!("cannot seal input segment {}: {e}", from.display()))?;
        // Renamed: the next rows go to a new segment, whatever happens next.
        self.open = None;
        self.seq += 1;
        self.written = 0;
        self.synced = 0;
        if let Err(e) = self.fs.sync_dir(&self.dir) {
            self.dir_unsynced = true;
            return Err(format!(
                "cannot sync the input log's directory after sealing {}: {e}",
                to.display()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Faults to inject, each counting down the operations it fails.
    #[derive(Default)]
    struct Faults {
        /// Writes that write half their bytes, then fail.
        partial_writes: u32,
        sync_data: u32,
        set_len: u32,
        sync_dir: u32,
    }

    /// The real file operations, failing as `faults` says.
    #[derive(Default)]
    struct FaultyFs {
        faults: Mutex<Faults>,
    }

    impl FaultyFs {
        fn inject(&self, f: impl FnOnce(&mut Faults)) {
            f(&mut self.faults.lock().unwrap());
        }

        fn take(&self, pick: impl FnOnce(&mut Faults) -> &mut u32) -> bool {
            let mut faults = self.faults.lock().unwrap();
            let n = pick(&mut faults);
            if *n > 0 {
                *n -= 1;
                return true;
            }
            false
        }
    }

    fn eio(what: &str) -> std::io::Error {
        std::io::Error::other(format!("injected EIO ({what})"))
    }

    impl LogFs for FaultyFs {
        fn write_all(&self, file: &mut File, bytes: &[u8]) -> std::io::Result<()> {
            if self.take(|f| &mut f.partial_writes) {
                file.write_all(&bytes[..bytes.len() / 2])?;
                return Err(eio("write"));
            }
            file.write_all(bytes)
        }
        fn sync_data(&self, file: &File) -> std::io::Result<()> {
            if self.take(|f| &mut f.sync_data) {
                return Err(eio("fsync"));
            }
            file.sync_data()
        }
        fn set_len(&self, file: &File, len: u64) -> std::io::Result<()> {
            if self.take(|f| &mut f.set_len) {
                return Err(eio("set_len"));
            }
            file.set_len(len)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            if self.take(|f| &mut f.sync_dir) {
                return Err(eio("directory fsync"));
            }
            sync_dir(dir)
        }
    }

    /// A log on faulty file operations, and a runtime to await appends.
    struct Harness {
        dir: tempfile::TempDir,
        fs: Arc<FaultyFs>,
        log: Option<InputLog>,
        rt: tokio::runtime::Runtime,
        /// Rows whose append was acknowledged, in order.
        acked: Vec<String>,
    }

    impl Harness {
        fn new() -> Harness {
            let dir = tempfile::tempdir().unwrap();
            let fs = Arc::new(FaultyFs::default());
            let log = InputLog::open_with(dir.path(), "t", fs.clone()).unwrap();
            Harness {
                dir,
                fs,
                log: Some(log),
                rt: tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap(),
                acked: Vec::new(),
            }
        }

        /// Appends one row; whether it was acknowledged.
        fn append(&mut self, row: &str) -> bool {
            let log = self.log.as_ref().unwrap();
            let ok = self
                .rt
                .block_on(log.append(format!("{row}\n").into_bytes()))
                .is_ok();
            if ok {
                self.acked.push(row.to_owned());
            }
            ok
        }

        fn seal(&self) -> Result<(), String> {
            self.log.as_ref().unwrap().seal()
        }

        /// What a pipeline processes: every complete line of the sealed segments, in the
        /// order the engine reads them (by name), after the log closed and (as after a
        /// restart) was recovered.
        fn processed(&mut self) -> Vec<String> {
            drop(self.log.take());
            recover(self.dir.path()).unwrap();
            let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect();
            names.sort();
            names
                .iter()
                .flat_map(|n| {
                    let text = std::fs::read_to_string(self.dir.path().join(n)).unwrap();
                    text.lines().map(str::to_owned).collect::<Vec<_>>()
                })
                .collect()
        }
    }

    #[test]
    fn a_failed_directory_fsync_during_a_seal_overwrites_no_sealed_segment() {
        let mut h = Harness::new();
        assert!(h.append("{\"k\":\"a\"}"));
        h.fs.inject(|f| f.sync_dir = 1);
        let err = h.seal().unwrap_err();
        assert!(err.contains("directory"), "{err}");
        // More rows while the seal is failing, then a seal that succeeds.
        assert!(h.append("{\"k\":\"b\"}"));
        h.seal().unwrap();
        assert!(h.append("{\"k\":\"c\"}"));
        assert_eq!(h.processed(), h.acked);
        assert_eq!(h.acked.len(), 3);
    }

    #[test]
    fn rows_whose_fsync_failed_are_reported_failed_and_never_processed() {
        let mut h = Harness::new();
        assert!(h.append("{\"k\":\"a\"}"));
        h.fs.inject(|f| f.sync_data = 1);
        assert!(!h.append("{\"k\":\"lost\"}"));
        assert!(h.append("{\"k\":\"b\"}"));
        h.seal().unwrap();
        assert!(h.append("{\"k\":\"c\"}"));
        assert_eq!(h.processed(), h.acked);
        assert_eq!(h.acked, ["{\"k\":\"a\"}", "{\"k\":\"b\"}", "{\"k\":\"c\"}"]);
    }

    #[test]
    fn a_partial_write_whose_cut_fails_is_cut_before_the_next_row() {
        let mut h = Harness::new();
        assert!(h.append("{\"k\":\"a\"}"));
        // The write tears, and cutting the torn half off fails too.
        h.fs.inject(|f| {
            f.partial_writes = 1;
            f.set_len = 1;
        });
        assert!(!h.append("{\"k\":\"torn\"}"));
        assert!(h.append("{\"k\":\"b\"}"));
        h.seal().unwrap();
        assert_eq!(h.processed(), h.acked);
        assert_eq!(h.acked, ["{\"k\":\"a\"}", "{\"k\":\"b\"}"]);
    }

    #[test]
    fn a_log_that_cannot_cut_takes_no_rows_and_seals_nothing_until_it_can() {
        let mut h = Harness::new();
        assert!(h.append("{\"k\":\"a\"}"));
        // The fsync fails, and so do the next four attempts to cut the unsynced row off
        // (after the failed fsync, before the next write, at that write's sync, at the
        // seal).
        h.fs.inject(|f| {
            f.sync_data = 1;
            f.set_len = 4;
        });
        assert!(!h.append("{\"k\":\"lost\"}"));
        assert!(!h.append("{\"k\":\"refused\"}"));
        let err = h.seal().unwrap_err();
        assert!(err.contains("cannot cut"), "{err}");
        // The cut succeeds on the next try: everything acknowledged is there, once.
        assert!(h.append("{\"k\":\"b\"}"));
        h.seal().unwrap();
        assert_eq!(h.processed(), h.acked);
        assert_eq!(h.acked, ["{\"k\":\"a\"}", "{\"k\":\"b\"}"]);
    }

    #[test]
    fn recovery_reads_only_the_tail_of_a_large_open_segment() {
        let dir = tempfile::tempdir().unwrap();
        let row = format!("{{\"a\":\"{}\"}}\n", "x".repeat(100));
        let mut text = row.repeat(2000);
        text.push_str("{\"torn");
        std::fs::write(dir.path().join(open_name(0)), &text).unwrap();
        assert_eq!(recover(dir.path()).unwrap(), 1);
        let sealed = std::fs::read_to_string(dir.path().join(sealed_name(0))).unwrap();
        assert_eq!(sealed, row.repeat(2000));
    }

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
