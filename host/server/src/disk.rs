//! What a pipeline takes on disk, and reclaiming the input it has processed.

use std::path::Path;

use crate::pipeline::PipelineHandle;

/// Processed input is reclaimed once this many bytes of it have piled up (or when a round
/// finds no new input): removing and emptying segments after every batch costs a journal
/// commit per batch that the next ingest fsync waits on.
const RECLAIM_AFTER_BYTES: u64 = 32 << 20;

/// Reclaims the input segments every batch has read, once no input is left to read (so
/// the engine has consumed every sealed segment) and either `force` or they hold at least
/// [`RECLAIM_AFTER_BYTES`]: removes all but the newest, and empties that one, which stays
/// so the segment numbers keep going up after a restart (the engine's progress is per file
/// name, so a number must never be used twice; an emptied file is shorter than its
/// progress, so it is never read again). Runs on the runner's thread, between batches, when
/// no seal can add a segment and no batch is planned. Returns whether anything was
/// reclaimed.
pub(crate) fn reclaim_input(dir: &Path, force: bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut sealed: Vec<(String, u64)> = entries
        .filter_map(Result::ok)
        .map(|e| {
            let len = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .filter(|(n, _)| n.starts_with("seg-"))
        .collect();
    let bytes: u64 = sealed.iter().map(|(_, len)| len).sum();
    if bytes == 0 || (!force && bytes < RECLAIM_AFTER_BYTES) {
        return false;
    }
    sealed.sort();
    if let Some((newest, len)) = sealed.pop()
        && len > 0
    {
        let emptied = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join(&newest))
            .and_then(|f| f.set_len(0));
        if let Err(e) = emptied {
            tracing::warn!(error = %e, segment = %newest, "cannot empty a processed input segment");
        }
    }
    for (name, _) in sealed {
        if let Err(e) = std::fs::remove_file(dir.join(&name)) {
            tracing::warn!(error = %e, segment = %name, "cannot remove a processed input segment");
        }
    }
    true
}

/// Bytes a pipeline in `dir` takes on disk: its files' lengths, less the output its
/// retention punched out (the output file keeps its length; its blocks are freed).
pub(crate) fn pipeline_disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let punched = std::fs::metadata(PipelineHandle::output_path(dir)).map_or(0, |m| {
        m.len().saturating_sub(m.blocks().saturating_mul(512))
    });
    dir_size(dir).saturating_sub(punched)
}

/// Bytes of the files under `dir`.
pub(crate) fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
