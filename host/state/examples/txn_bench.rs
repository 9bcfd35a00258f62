//! The counter benchmark's state operations without the runtime: per grouping key
//! `value_get`, `value_put`, `list_append`, `map_get`, `map_put`, over a RocksDB checkpoint
//! in a temporary directory, batch after batch.
//!
//! `cargo run --release -p statebox-state --example txn_bench -- [keys] [batches] [partitions]`
//! (defaults: 100000 keys, 3 batches, 1 partition). Prints µs per key for the operations and
//! for the commit of each batch.

use std::time::Instant;

use statebox_state::{Checkpoint, Commit, PartitionTxn, StoredValue};

const COUNT: u32 = 1;
const BATCH_COUNTS: u32 = 2;
const STATS: u32 = 3;

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(default)
}

fn value(payload: String) -> StoredValue {
    StoredValue {
        schema_id: 0,
        expires_at_ms: None,
        payload: payload.into_bytes(),
    }
}

fn parse(v: Option<StoredValue>) -> i64 {
    v.and_then(|v| std::str::from_utf8(&v.payload).ok()?.parse().ok())
        .unwrap_or(0)
}

/// One key's worth of the counter's state operations.
fn count_key(txn: &mut PartitionTxn, key: &[u8]) -> statebox_state::Result<()> {
    let calls_key = br#"{"name":"calls"}"#;
    let total = parse(txn.value_get(COUNT, key)?) + 1;
    txn.value_put(COUNT, key, value(total.to_string()))?;
    txn.list_append(BATCH_COUNTS, key, vec![value("1".to_string())])?;
    let calls = parse(txn.map_get(STATS, key, calls_key)?) + 1;
    txn.map_put(STATS, key, calls_key, value(calls.to_string()))
}

fn main() -> statebox_state::Result<()> {
    let keys = arg(1, 100_000);
    let batches = arg(2, 3);
    let partitions = arg(3, 1).max(1);
    let dir = tempfile::tempdir().expect("temporary directory");
    let cp = Checkpoint::open(dir.path())?;
    let key_bytes: Vec<Vec<u8>> = (0..keys)
        .map(|i| format!(r#"["key-{i:07}"]"#).into_bytes())
        .collect();
    println!(
        "{keys} keys, {partitions} partition(s), RocksDB in {}",
        dir.path().display()
    );
    for batch in 0..batches {
        let started = Instant::now();
        let mut txns: Vec<PartitionTxn> = (0..partitions).map(|p| cp.txn(p as u16)).collect();
        for (i, key) in key_bytes.iter().enumerate() {
            count_key(&mut txns[i % partitions], key)?;
        }
        let ops = started.elapsed();
        let started = Instant::now();
        cp.commit(Commit {
            txns,
            ..Commit::default()
        })?;
        let commit = started.elapsed();
        let per_key = |d: std::time::Duration| d.as_secs_f64() * 1e6 / keys as f64;
        println!(
            "batch {batch}: ops {:.2} µs/key, commit {:.2} µs/key, total {:.2} µs/key",
            per_key(ops),
            per_key(commit),
            per_key(ops + commit)
        );
    }
    Ok(())
}
