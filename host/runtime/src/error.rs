//! The runtime's errors, each saying whose fault it is: [`LoadError`] (the tenant's
//! component), [`RuntimeError`] (the host could not set up its engine), and, inside the
//! crate, [`InstantiateError`] (a component that loaded but cannot be instantiated).
//!
//! Wasmtime's own errors (`wasmtime::Error`) have no `std::error::Error` impl, so they are
//! carried as values and printed with their whole chain (`{:#}`), as they were before these
//! types existed.

use std::path::PathBuf;

/// Failures to load a processor component: the tenant's file is at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read processor {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not a WebAssembly component, or not one that implements the world.
    #[error("invalid processor component: {0}")]
    Invalid(String),
    /// The processor's `describe` trapped or returned unusable schemas.
    #[error("processor `describe` failed: {0}")]
    Describe(String),
}

/// Failures to create a [`Runtime`](crate::Runtime): the host's fault (its configuration or
/// its resources), never a processor's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// Wasmtime refused the engine configuration.
    #[error("cannot configure the WebAssembly engine: {0:#}")]
    Engine(wasmtime::Error),
    /// The host imports could not be added to the linker.
    #[error("cannot link the host imports: {0:#}")]
    Link(wasmtime::Error),
    /// The runtime's I/O thread (timers and sockets of guest calls) could not start.
    #[error("cannot start the runtime's I/O thread: {0}")]
    Io(std::io::Error),
}

/// Failures to instantiate a loaded component in a fresh store.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstantiateError {
    /// Its start functions waited in a host call past the store's deadline.
    #[error("instantiation waited past its deadline")]
    WaitedPastDeadline,
    /// Instantiation trapped, or an export could not be looked up.
    #[error("{0:#}")]
    Wasm(wasmtime::Error),
}

/// Failures to write a compiled component to the disk cache (logged, never fatal).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CacheWriteError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("cannot serialize the compiled component: {0:#}")]
    Serialize(wasmtime::Error),
}
