//! The counter benchmark's state operations without the runtime: per grouping key
//! `value_get`, `value_put`, `list_append`, `map_get`, `map_put`, batch after batch.
//!
//! `cargo run --release -p statebox-state --example txn_bench -- [rocks|null] [keys]
//! [batches] [partitions]` (defaults: rocks, 100000 keys, 4 batches, 1 partition).
//!
//! `rocks` runs over a RocksDB checkpoint in a temporary directory; `null` over a backend
//! that stores nothing, which isolates the overlay's own cost. Prints µs per key for the
//! operations, for sealing the transactions and for the commit of each batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use statebox_state::{
    Checkpoint, Commit, GetFn, KvEngine, PartitionTxn, ScanFn, StoredValue, WriteBatch,
};

/// The allocator of the CLI, which runs the real pipeline.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const COUNT: u32 = 1;
const BATCH_COUNTS: u32 = 2;
const STATS: u32 = 3;

/// A backend that holds nothing and discards writes.
struct NullEngine;

impl KvEngine for NullEngine {
    fn get_with(&self, _key: &[u8], _f: &mut GetFn<'_>) -> statebox_state::Result<bool> {
        Ok(false)
    }

    fn scan(&self, _start: &[u8], _end: &[u8], _f: &mut ScanFn<'_>) -> statebox_state::Result<()> {
        Ok(())
    }

    fn write(&self, batch: &WriteBatch) -> statebox_state::Result<()> {
        std::hint::black_box(batch);
        Ok(())
    }
}

fn arg<T: std::str::FromStr>(n: usize, default: T) -> T {
    std::env::args()
        .nth(n)
        .map(|a| a.parse().ok().expect("a valid argument"))
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
    txn.map_put(
        STATS,
        key,
        calls_key,
        value(format!("{{\"count\":{calls}}}")),
    )
}

fn main() -> statebox_state::Result<()> {
    let backend: String = arg(1, "rocks".to_string());
    let keys: usize = arg(2, 100_000);
    let batches: usize = arg(3, 4);
    let partitions: usize = arg::<usize>(4, 1).max(1);
    let dir = tempfile::tempdir().expect("temporary directory");
    let cp = match backend.as_str() {
        "rocks" => Checkpoint::open(dir.path())?,
        "null" => Checkpoint::with_engine(Arc::new(NullEngine)),
        other => panic!("unknown backend {other} (rocks or null)"),
    };
    let key_bytes: Vec<Vec<u8>> = (0..keys)
        .map(|i| format!(r#"["key-{i:07}"]"#).into_bytes())
        .collect();
    println!("{backend}: {keys} keys, {partitions} partition(s)");
    let per_key = |d: Duration| d.as_secs_f64() * 1e6 / keys as f64;
    for batch in 0..batches {
        let started = Instant::now();
        let mut txns: Vec<PartitionTxn> = (0..partitions).map(|p| cp.txn(p as u16)).collect();
        for (i, key) in key_bytes.iter().enumerate() {
            count_key(&mut txns[i % partitions], key)?;
        }
        let ops = started.elapsed();
        let started = Instant::now();
        txns.iter_mut().for_each(PartitionTxn::seal);
        let seal = started.elapsed();
        let started = Instant::now();
        cp.commit(Commit {
            txns,
            ..Commit::default()
        })?;
        let commit = started.elapsed();
        println!(
            "batch {batch}: ops {:.2}  seal {:.2}  commit {:.2}  total {:.2} µs/key",
            per_key(ops),
            per_key(seal),
            per_key(commit),
            per_key(ops + seal + commit)
        );
    }
    Ok(())
}
