//! The sandbox: engine configuration, per-call limits, the epoch ticker behind CPU
//! deadlines, and the virtual clock and randomness that make replays deterministic.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime::{Engine, Store, Trap};

use crate::EPOCH_TICK;
use crate::host::HostState;

/// Sandbox limits applied to every processor call.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Wall-clock CPU budget of one call (enforced by epoch interruption).
    pub call_timeout: Duration,
    /// Maximum linear memory of one instance, in bytes.
    pub memory_bytes: usize,
    /// Maximum total size of the rows one call may emit, in bytes.
    pub output_bytes_per_call: usize,
    /// Hosts the processor may send HTTP requests to through `wasi:http`, each `HOST` (any
    /// port) or `HOST:PORT` (see [`HttpHost::parse`](crate::HttpHost::parse)). Empty, the
    /// default, denies every request: the guest gets the error code `HTTP-request-denied`.
    /// An allowed request is bounded by the call's deadline ([`call_timeout`](Self::call_timeout)).
    /// Replays are deterministic only as far as the services called are.
    pub http_hosts: Vec<String>,
    /// Operator routes, each `ORIGIN=TARGET` (see [`HttpRoute::parse`](crate::HttpRoute::parse)):
    /// an allowed request to ORIGIN goes to TARGET instead. They grant nothing: the request
    /// must be allowed by [`http_hosts`](Self::http_hosts) first.
    pub http_routes: Vec<String>,
    /// A CPU budget shared with other instances (a multi-tenant host's per-batch budget of
    /// a pipeline): a call that takes it past its limit traps inside the call, however many
    /// keys a batched call has left. `None`, the default: no budget beyond the per-call one.
    pub batch_cpu: Option<Arc<CpuBudget>>,
    /// Most bytes of state values (and map keys) one instance may write in one batch: the
    /// partition's overlay holds them in host memory until the commit. Past it, writes
    /// return the WIT error `limit-exceeded`.
    pub state_bytes_per_batch: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            call_timeout: Duration::from_secs(10),
            memory_bytes: 256 << 20,
            output_bytes_per_call: 16 << 20,
            http_hosts: Vec::new(),
            http_routes: Vec::new(),
            batch_cpu: None,
            state_bytes_per_batch: 1 << 30,
        }
    }
}

impl Limits {
    /// The CPU deadline in epoch ticks.
    pub(crate) fn deadline_ticks(&self) -> u64 {
        (self.call_timeout.as_millis() / EPOCH_TICK.as_millis()).max(1) as u64
    }
}

/// How long a call blocked in a host wait (`wasi:io/poll`, a stream, an HTTP response) may
/// outlive its deadline before the host gives up on it: the wall-clock margin of the bound
/// "every call ends within its CPU deadline plus a small margin".
pub(crate) const BLOCKED_CALL_MARGIN: Duration = Duration::from_millis(100);

/// The wall-clock deadline of the call in progress. The store moves it (each key of a
/// batched call gets a budget from its first selection); the thread driving the call reads
/// it to give up on a guest blocked in a host call, which epoch interruption cannot stop.
#[derive(Clone, Debug, Default)]
pub(crate) struct CallDeadline(Arc<AtomicU64>);

impl CallDeadline {
    /// All deadlines are kept as nanoseconds since this instant.
    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    /// Sets the deadline to `budget` from now.
    pub(crate) fn start(&self, budget: Duration) {
        let at = Self::origin().elapsed().saturating_add(budget);
        let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX);
        self.0.store(nanos, Ordering::Relaxed);
    }

    /// When the call's time runs out.
    pub(crate) fn at(&self) -> Instant {
        Self::origin() + Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// What is left of the call's time (zero once it passed).
    pub(crate) fn left(&self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }
}

/// How often a running call compares itself with a shared [`CpuBudget`].
pub(crate) const BUDGET_CHECK: Duration = Duration::from_millis(50);

pub use statebox_contract::{CpuBudget, thread_cpu_ns};

/// The wasmtime engine every processor runs on.
pub(crate) fn engine() -> wasmtime::Result<Engine> {
    let mut config = wasmtime::Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.cranelift_opt_level(wasmtime::OptLevel::Speed);
    // Deep guest recursion must trap, not overflow the host's stack.
    config.max_wasm_stack(1 << 20);
    // For profiling: `STATEBOX_PERFMAP=1` has wasmtime write `/tmp/perf-<pid>.map`, which
    // names the compiled guest functions in `perf report` (else they are bare addresses).
    if std::env::var_os("STATEBOX_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    Engine::new(&config)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] so calls past their deadline trap.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine) -> EpochTicker {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("statebox-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .expect("spawn epoch ticker thread");
        EpochTicker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Rejects files that are not WebAssembly components before handing them to the compiler,
/// with a message that says what the file is instead.
pub(crate) fn check_component_header(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("the file is not WebAssembly (no `\\0asm` header)".into());
    }
    match bytes[4..8] {
        [0x01, 0x00, 0x00, 0x00] => Err("the file is a core WebAssembly module, not a component; \
             build it for the `wasm32-wasip2` target (or wrap it with `wasm-tools component new`)"
            .into()),
        [_, _, 0x01, 0x00] => Ok(()),
        _ => Err("the file has an unknown WebAssembly version or layer".into()),
    }
}

/// Explains a trap: limit violations in plain words, plus the tail of the guest's stderr
/// (where a Rust guest prints its panic message).
pub(crate) fn describe_trap(err: &wasmtime::Error, store: &Store<HostState>) -> String {
    let host = store.data();
    let mut reason = match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => format!(
            "exceeded the CPU time limit of {:?} per call",
            host.call_timeout()
        ),
        Some(Trap::StackOverflow) => "stack overflow (recursion too deep)".to_owned(),
        Some(trap) => trap.to_string(),
        // Not a trap code: a host function failed (its message is the root cause).
        None => err.root_cause().to_string(),
    };
    if host.memory_limit_hit() {
        reason.push_str(&format!(
            " (the instance reached its memory limit of {} bytes)",
            host.memory_limit()
        ));
    }
    let stderr = host.stderr_tail();
    if !stderr.is_empty() {
        reason.push_str("; guest stderr: ");
        reason.push_str(&stderr);
    }
    // The guest backtrace helps the processor's author but buries the reason: it goes last.
    if let Some(bt) = err.downcast_ref::<wasmtime::WasmBacktrace>() {
        reason.push_str(&format!("\n{bt}"));
    }
    reason
}

/// The guest's wall and monotonic clock: the batch timestamp, never the host's real time,
/// so a replayed batch sees exactly what the first run saw. Waiting on a `wasi:clocks`
/// pollable takes no real time: it is ready at once and moves this clock to its deadline
/// (see [`VirtualTimer`]), so a guest that sleeps sees the time it slept pass, and a replay
/// sees the same times.
#[derive(Clone, Default)]
pub(crate) struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// Sets the clock to `ms` since the Unix epoch (calls start at the batch timestamp).
    pub(crate) fn set_ms(&self, ms: i64) {
        let nanos = (ms.max(0) as u64).saturating_mul(1_000_000);
        self.0.store(nanos, Ordering::Relaxed);
    }

    fn nanos(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Moves the clock forward to `nanos`, never back.
    fn advance_to(&self, nanos: u64) {
        self.0.fetch_max(nanos, Ordering::Relaxed);
    }

    /// A pollable that is ready at once and moves the clock to `nanos` when waited on.
    pub(crate) fn timer_at(&self, nanos: u64) -> VirtualTimer {
        VirtualTimer {
            clock: self.clone(),
            at_nanos: nanos,
        }
    }

    /// Like [`timer_at`](Self::timer_at), `nanos` from now.
    pub(crate) fn timer_in(&self, nanos: u64) -> VirtualTimer {
        self.timer_at(self.nanos().saturating_add(nanos))
    }

    pub(crate) fn monotonic_now(&self) -> u64 {
        self.nanos()
    }
}

impl wasmtime_wasi::HostWallClock for VirtualClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }
}

impl wasmtime_wasi::HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.nanos()
    }
}

/// A `wasi:clocks` pollable on the virtual clock (what `subscribe-instant` and
/// `subscribe-duration` return): ready at once, and waiting on it moves the guest's clock to
/// its deadline. A sleep never holds a host thread, and is as deterministic as the rest of
/// the call.
pub(crate) struct VirtualTimer {
    clock: VirtualClock,
    at_nanos: u64,
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::Pollable for VirtualTimer {
    async fn ready(&mut self) {
        self.clock.advance_to(self.at_nanos);
    }
}

/// The guest's randomness: a SplitMix64 stream reseeded from (batch, key) before every
/// call, so replays are deterministic and keys do not share a stream.
#[derive(Clone, Default)]
pub(crate) struct VirtualRandom(Arc<AtomicU64>);

impl VirtualRandom {
    pub(crate) fn reseed(&self, batch_id: u64, key: &str) {
        // FNV-1a over the batch id and key: cheap, stable, and distinct per (batch, key).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in batch_id.to_le_bytes().iter().chain(key.as_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.0.store(h, Ordering::Relaxed);
    }

    /// The stream's position, to resume it later with [`restore`](Self::restore).
    pub(crate) fn state(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn restore(&self, state: u64) {
        self.0.store(state, Ordering::Relaxed);
    }

    fn next(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for VirtualRandom {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.next() as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_check_names_what_the_file_is() {
        assert!(
            check_component_header(b"hello world")
                .unwrap_err()
                .contains("not WebAssembly")
        );
        let module = b"\0asm\x01\0\0\0";
        assert!(
            check_component_header(module)
                .unwrap_err()
                .contains("core WebAssembly module")
        );
        let component = b"\0asm\x0d\0\x01\0";
        assert!(check_component_header(component).is_ok());
    }

    #[test]
    fn virtual_random_is_deterministic_per_batch_and_key() {
        let a = VirtualRandom::default();
        a.reseed(7, "[\"k\"]");
        let first: Vec<u64> = (0..4).map(|_| a.next()).collect();
        a.reseed(7, "[\"k\"]");
        let again: Vec<u64> = (0..4).map(|_| a.next()).collect();
        a.reseed(7, "[\"other\"]");
        let other: Vec<u64> = (0..4).map(|_| a.next()).collect();
        assert_eq!(first, again);
        assert_ne!(first, other);
    }
}
