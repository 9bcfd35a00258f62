//! The Statebox runtime: runs stateful processor components in a wasmtime sandbox.
//!
//! A [`Runtime`] owns the wasmtime engine and a cache of compiled components. Loading a
//! component gives a [`Processor`]: checked against the `stateful-processor` world and
//! described (name, schemas). A processor is instantiated once per state partition into an
//! [`Instance`]. Both implement the processor contract (`statebox-contract`):
//! [`Processor`] is a [`ProcessorFactory`], [`Instance`] a [`PartitionProcessor`], which the
//! engine drives batch by batch; each call holds the batch's transaction in the instance's
//! store for its length (host functions reach only what the store owns) and gives it back.
//!
//! The modules follow the life of a processor: [`runtime`](Runtime) (the engine and the
//! linker), `cache` (compiled components by content hash), `load` (checking and describing a
//! component, making stores), `instance` (export calls and their checks), `host` (the imports:
//! a state context, a sandbox context and the borrowed view the imports are written
//! against), `sandbox` (limits, deadlines, virtual clock and randomness) and `driver`
//! (polling a call under its deadline).
//!
//! Architecture Invariant: every state and timer import acts on the key of the call in
//! progress, which only the host sets. The guest never names a key, so per-key isolation
//! holds whatever the guest does.

mod bindings;
pub mod cache;
mod driver;
mod error;
mod host;
mod http;
mod instance;
mod load;
mod positional;
mod runtime;
mod sandbox;

use std::time::Duration;

pub use statebox_contract::{
    BatchFailure, BatchTimes, CallError, CallErrorKind, CpuBudget, Function, InstanceConfig,
    KeyRows, PartitionBatch, PartitionProcessor, ProcessorFactory, ProcessorInfo, TimeMode,
    each_entry, thread_cpu_ns,
};

pub use crate::error::{LoadError, RuntimeError};
pub use crate::http::{HttpHost, HttpRoute};
pub use crate::instance::Instance;
pub use crate::load::Processor;
pub use crate::runtime::{Runtime, RuntimeConfig};
pub use crate::sandbox::Limits;

/// The fully qualified name of the world every processor must implement.
pub const WORLD: &str = "statebox:processor/stateful-processor@0.1.0";
/// The world of processors that also take many keys per call (`batch-processor`).
pub const BATCH_WORLD: &str = "statebox:processor/stateful-batch-processor@0.1.0";

/// How long the epoch ticker sleeps between ticks; the CPU deadline is measured in ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);
