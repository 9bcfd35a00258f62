//! End-to-end tests of Statebox: real guest components (built by `build.rs`), the real
//! wasmtime runtime, RocksDB checkpoints, and the `statebox` CLI.
//!
//! The CLI must be built first, with the same profile and target directory:
//! `cargo build --release -p statebox`.

mod bad_input;
mod bench_failover;
mod bench_rounds;
mod cluster;
mod cluster_store;
mod components;
mod console;
mod exactly_once;
mod examples;
mod guests_used;
mod js;
mod kafka;
mod kafka_group;
mod library_errors;
mod profiling;
mod pyspark_docs;
mod pyspark_http;
mod pyspark_tws;
mod python;
mod restart;
mod runtime_limits;
mod sandbox;
mod scenarios;
mod serve;
mod serve_kafka;
mod serve_limits;
mod sql;
mod state_memory;
mod state_ops;
mod state_reader;
mod trigger;
mod upgrade;
