//! The host side of the imports: state variables, timers, keys and logging, each bound to
//! the grouping key of the call in progress, and the WASI and `wasi:http` the sandbox
//! grants.
//!
//! Built the way wasmtime's own WASI crates are (`WasiCtx`, `WasiCtxView`, `WasiView`):
//! what an instance's imports can reach is held in two contexts, and the imports are
//! written against a borrowed view of both, linked by one [`add_to_linker`].
//!
//! - [`StateCtx`] (`state.rs`): the lent transaction, the catalog and declarations, the
//!   batch's times (the timer and TTL clock, `timers.rs`), the phase and the key in use.
//!   Nothing of wasmtime but the resource types.
//! - [`SandboxCtx`] (`sandbox_ctx.rs`): the WASI and HTTP contexts and hooks, the resource
//!   table, the limits and memory limiter, the call's deadline, the virtual clock and
//!   randomness, the log counter.
//! - [`HostView`]: `&mut` both. Every `statebox:processor` import is implemented on it
//!   (`handle.rs`, `vars.rs`, `timers.rs`, `keys.rs`, `log.rs`), so the imports can be
//!   called, and unit-tested (`tests.rs`), over an in-memory checkpoint without
//!   instantiating a component.
//!
//! [`HostState`] is the store's data: the two contexts, and the call lifecycle the instance
//! drives (`begin_call`, `lend`, `end_call`, …).

/// Runs a state operation on the current key's transaction, in an import of [`HostView`]
/// returning `wasmtime::Result<Result<_, StateError>>`: the phase's refusal returns the WIT
/// error, a storage failure traps (and is remembered for the report).
///
/// With an entry (`Some(index)`), the operation acts on that entry's key of the batched call
/// in progress instead of the selected one (`keys.apply-writes`).
macro_rules! op {
    ($view:ident, $what:expr, |$txn:ident, $key:ident| $body:expr) => {
        op!($view, $what, None, |$txn, $key| $body)
    };
    ($view:ident, $what:expr, $entry:expr, |$txn:ident, $key:ident| $body:expr) => {{
        let ($txn, $key) = match $view.state.access_at($what, $entry) {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let $key = $key.as_bytes();
        match $body {
            Ok(v) => v,
            Err(e) => return Err($view.state.fail(e)),
        }
    }};
}

mod handle;
mod keys;
mod limiter;
mod log;
mod sandbox_ctx;
mod state;
#[cfg(test)]
mod tests;
mod timers;
mod vars;

use statebox_state::catalog::{Catalog, Described};
use statebox_state::{PartitionTxn, StoreError};
use wasmtime::component::{HasData, HasSelf, Linker, ResourceTable};
use wasmtime_wasi::{WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use crate::bindings::StatefulBatchProcessor;
use crate::bindings::statebox::processor::types;
use crate::sandbox::{CallDeadline, CpuBudget, Limits};
use crate::{BatchTimes, InstanceConfig};

pub(crate) use self::limiter::MemoryLimiter;
pub(crate) use self::sandbox_ctx::SandboxCtx;
pub(crate) use self::state::StateCtx;
pub use self::state::{JsonIteratorRes, ListStateRes, MapIteratorRes, MapStateRes, ValueStateRes};

/// What the `statebox:processor` imports of one instance reach: its state context and its
/// sandbox context, borrowed together (as `WasiCtxView` borrows a `WasiCtx` and a table).
pub struct HostView<'a> {
    pub(crate) state: &'a mut StateCtx,
    pub(crate) sandbox: &'a mut SandboxCtx,
}

/// A store's data that holds Statebox's contexts (as `WasiView` is for WASI's).
pub(crate) trait StateboxView: Send {
    fn statebox(&mut self) -> HostView<'_>;
}

/// The `HasData` of the `statebox:processor` imports: a [`HostView`].
struct StateboxImports;

impl HasData for StateboxImports {
    type Data<'a> = HostView<'a>;
}

/// Links everything a processor may import: WASI (nothing granted, the clocks virtual),
/// `wasi:http` (checked against the allow-list) and the `statebox:processor` package.
pub(crate) fn add_to_linker<T>(linker: &mut Linker<T>) -> wasmtime::Result<()>
where
    T: StateboxView + WasiView + WasiHttpView + 'static,
{
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    // The guest's clocks are virtual, and so are their pollables: a sleep takes no real
    // time (wasmtime-wasi's monotonic clock, linked above, would wait in real time).
    linker.allow_shadowing(true);
    wasmtime_wasi::p2::bindings::clocks::monotonic_clock::add_to_linker::<T, HasSelf<SandboxCtx>>(
        linker,
        |t| t.statebox().sandbox,
    )?;
    linker.allow_shadowing(false);
    // Always linked, so a processor that imports wasi:http loads; every request is checked
    // against the processor's allow-list (`Limits::http_hosts`, empty by default).
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    StatefulBatchProcessor::add_to_linker::<T, StateboxImports>(linker, T::statebox)?;
    Ok(())
}

/// The store data of one instance: everything its imports can reach.
pub struct HostState {
    state: StateCtx,
    sandbox: SandboxCtx,
}

impl StateboxView for HostState {
    fn statebox(&mut self) -> HostView<'_> {
        HostView {
            state: &mut self.state,
            sandbox: &mut self.sandbox,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.wasi()
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        self.sandbox.http()
    }
}

impl HostState {
    pub(crate) fn new(
        processor: String,
        config: InstanceConfig,
        limits: &Limits,
        table: ResourceTable,
    ) -> HostState {
        HostState {
            state: StateCtx::new(config, limits.state_bytes_per_batch),
            sandbox: SandboxCtx::new(processor, limits, table),
        }
    }

    /// Switches to describe mode against a trial copy of `catalog`.
    pub(crate) fn start_describing(&mut self, catalog: &Catalog) {
        self.state.start_describing(catalog);
    }

    /// What `init` did in describe mode.
    pub(crate) fn take_described(&mut self) -> Described {
        self.state.take_described()
    }

    pub(crate) fn memory_limiter(&mut self) -> &mut MemoryLimiter {
        &mut self.sandbox.limiter
    }

    /// The largest memory the instance has been granted so far, in bytes.
    pub(crate) fn memory_high_water_bytes(&self) -> usize {
        self.sandbox.limiter.peak
    }

    pub(crate) fn memory_limit(&self) -> usize {
        self.sandbox.limiter.max()
    }

    pub(crate) fn memory_limit_hit(&self) -> bool {
        self.sandbox.limiter.hit()
    }

    pub(crate) fn call_timeout(&self) -> std::time::Duration {
        self.sandbox.limits.call_timeout
    }

    pub(crate) fn output_limit(&self) -> usize {
        self.sandbox.limits.output_bytes_per_call
    }

    /// Starts the deadline of a call: it bounds the guest's CPU (epoch interruption), its
    /// waits in host calls and its outbound HTTP requests.
    pub(crate) fn start_call_deadline(&mut self) {
        self.sandbox.start_call_deadline();
    }

    /// The deadline of the call in progress.
    pub(crate) fn deadline(&self) -> &CallDeadline {
        &self.sandbox.deadline
    }

    /// Whether the call in progress, with the CPU it has used so far, took the shared batch
    /// budget past its limit.
    pub(crate) fn batch_budget_exceeded(&self) -> bool {
        self.sandbox.batch_budget_exceeded()
    }

    pub(crate) fn batch_budget(&self) -> Option<&CpuBudget> {
        self.sandbox.limits.batch_cpu.as_deref()
    }

    /// Epoch ticks until the deadline callback first runs in a call.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        self.sandbox.deadline_ticks()
    }

    pub(crate) fn stderr_tail(&self) -> String {
        self.sandbox.stderr_tail()
    }

    pub(crate) fn take_internal_error(&mut self) -> Option<StoreError> {
        self.state.internal_error.take()
    }

    /// A new batch starts: the per-batch write allowance starts over.
    pub(crate) fn start_batch(&mut self) {
        self.state.start_batch();
    }

    /// Holds the batch's transaction for one export call (host functions reach only what
    /// the store owns); [`Self::take_back`] returns it when the call is over. The engine
    /// set its TTL clock and time floor when it opened it.
    pub(crate) fn lend(&mut self, txn: PartitionTxn, times: BatchTimes) {
        self.state.lend(txn, times);
        self.reset_clock();
    }

    /// Gives back the transaction [lent](Self::lend) for a call.
    pub(crate) fn take_back(&mut self) -> Option<PartitionTxn> {
        self.state.take_back()
    }

    pub(crate) fn begin_init(&mut self) {
        self.state.begin(state::Phase::Init);
        self.sandbox.start_call_log();
    }

    pub(crate) fn begin_close(&mut self) {
        self.state.begin(state::Phase::Close);
        self.sandbox.start_call_log();
    }

    /// Starts a call of a handler for `key`: the clock starts at the batch timestamp
    /// whatever an earlier call slept, and the key gets its own random stream.
    pub(crate) fn begin_call(&mut self, key: &str) {
        self.begin_handler();
        key.clone_into(&mut self.state.key);
        self.sandbox.random.reseed(self.state.batch_id(), key);
    }

    /// Starts a batched call over `keys`: no key is current until the guest selects one
    /// with `use-key`.
    pub(crate) fn begin_batch_call(&mut self, keys: Vec<String>) {
        self.begin_handler();
        self.state.key.clear();
        self.state.batch = Some(state::BatchKeys::new(keys));
    }

    fn begin_handler(&mut self) {
        self.state.begin(state::Phase::Handler);
        self.sandbox.start_call_log();
        self.reset_clock();
    }

    /// The guest's clock starts every call at the batch timestamp, whatever an earlier call
    /// slept.
    fn reset_clock(&mut self) {
        if let Some(times) = self.state.times {
            self.sandbox.clock.set_ms(times.batch_timestamp_ms);
        }
    }

    pub(crate) fn end_call(&mut self) {
        self.state.end_call();
    }

    /// The entry of the batched call in progress that the guest selected last.
    pub(crate) fn selected_entry(&self) -> Option<usize> {
        self.state.selected_entry()
    }

    /// The times a handler is called with.
    pub(crate) fn timer_values(&self) -> types::TimerValues {
        self.state.timer_values()
    }

    /// The view the imports are written against.
    #[cfg(test)]
    pub(crate) fn view(&mut self) -> HostView<'_> {
        self.statebox()
    }
}
