//! The processor contract: what the Statebox engine asks of a processor, and what a runtime
//! (the WebAssembly one in `statebox-runtime`, or native Rust logic in tests and benchmarks)
//! implements.
//!
//! It sits below both: the engine drives [`PartitionProcessor`]s made by a
//! [`ProcessorFactory`] and never learns how they run; the runtime implements the traits
//! over wasmtime. So the engine, and what builds on it (SQL, the server's pipelines), compile
//! without wasmtime. Per-call accounting is a [`CallMeter`] hook around any factory.
//!
//! Architecture Invariant: this crate names no runtime. It depends on the schema and state
//! crates only (a call reads and writes state through a [`PartitionBatch`]'s transaction).

mod budget;
mod call;
mod meter;
mod processor;
mod time;

pub use crate::budget::{CpuBudget, thread_cpu_ns};
pub use crate::call::{BatchFailure, CallError, CallErrorKind, Function, KeyRows, each_entry};
pub use crate::meter::{CallMeter, Metered};
pub use crate::processor::{
    InstanceConfig, PartitionBatch, PartitionProcessor, ProcessorFactory, ProcessorInfo,
};
pub use crate::time::{BatchTimes, TimeMode};
