//! The sandbox context: what confines an instance, whatever its state does. The WASI and
//! `wasi:http` contexts (nothing granted but what the limits allow), the resource table,
//! the memory limiter, the call's deadline and CPU budget, the virtual clock and randomness
//! that make replays deterministic, and the count of the call's log messages.

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView};

use super::limiter::MemoryLimiter;
use crate::http::HttpHooks;
use crate::sandbox::{self, CallDeadline, Limits, VirtualClock, VirtualRandom};

/// Most resources (state handles, iterators, pollables, HTTP objects) one instance may hold
/// at once; past it, creating one traps.
pub(crate) const MAX_RESOURCES: usize = 65_536;
/// How much of the guest's stderr is kept to explain a trap.
const STDERR_CAPACITY: usize = 64 << 10;

/// The sandbox of one instance.
pub(crate) struct SandboxCtx {
    /// The processor's name, for its log lines.
    pub(super) processor: String,
    pub(super) limits: Limits,
    pub(super) limiter: MemoryLimiter,
    pub(super) table: ResourceTable,
    wasi: WasiCtx,
    /// Outbound HTTP: denied unless the host is on the allow-list (`Limits::http_hosts`).
    http: WasiHttpCtx,
    http_hooks: HttpHooks,
    stderr: MemoryOutputPipe,
    /// The wall-clock deadline of the call in progress (shared with the driving thread and
    /// the outbound-HTTP hooks).
    pub(super) deadline: CallDeadline,
    /// The thread's CPU time when the call started, when a shared [`Limits::batch_cpu`]
    /// budget is checked during the call.
    cpu_started: u64,
    pub(super) clock: VirtualClock,
    pub(super) random: VirtualRandom,
    /// Messages logged in the call in progress, and how many of them were dropped.
    pub(super) logged: u32,
}

impl SandboxCtx {
    pub(super) fn new(processor: String, limits: &Limits, mut table: ResourceTable) -> SandboxCtx {
        table.set_max_capacity(MAX_RESOURCES);
        let clock = VirtualClock::default();
        let random = VirtualRandom::default();
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let deadline = CallDeadline::default();
        // Nothing is granted: no preopened directories, no environment, no network, no
        // arguments, stdin closed. Clocks and randomness are virtual.
        let wasi = WasiCtx::builder()
            .stderr(stderr.clone())
            .wall_clock(clock.clone())
            .monotonic_clock(clock.clone())
            .secure_random(random.clone())
            .insecure_random(random.clone())
            .insecure_random_seed(0)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        SandboxCtx {
            processor,
            limits: limits.clone(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            table,
            wasi,
            http: WasiHttpCtx::new(),
            http_hooks: HttpHooks::new(&limits.http_hosts, &limits.http_routes, deadline.clone()),
            stderr,
            deadline,
            cpu_started: 0,
            clock,
            random,
            logged: 0,
        }
    }

    pub(super) fn wasi(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }

    pub(super) fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }

    /// Starts the deadline of a call: it bounds the guest's CPU (epoch interruption), its
    /// waits in host calls and its outbound HTTP requests.
    pub(super) fn start_call_deadline(&mut self) {
        self.start_key_budget();
        if self.limits.batch_cpu.is_some() {
            self.cpu_started = sandbox::thread_cpu_ns();
        }
    }

    /// Starts a full CPU, waiting and outbound-HTTP budget, as a key of a batched call gets
    /// when first selected (a shared batch budget still binds across keys).
    pub(super) fn start_key_budget(&mut self) {
        self.deadline.start(self.limits.call_timeout);
        self.http_hooks.start_call();
    }

    /// Whether the call in progress, with the CPU it has used so far, took the shared batch
    /// budget past its limit.
    pub(super) fn batch_budget_exceeded(&self) -> bool {
        self.limits.batch_cpu.as_ref().is_some_and(|budget| {
            let running = sandbox::thread_cpu_ns().saturating_sub(self.cpu_started);
            budget.exceeded_with(running)
        })
    }

    /// Epoch ticks until the deadline callback first runs in a call: at the call's deadline,
    /// or sooner when a shared batch budget must be checked while the call runs.
    pub(super) fn deadline_ticks(&self) -> u64 {
        let ticks = self.limits.deadline_ticks();
        if self.limits.batch_cpu.is_some() {
            let check = sandbox::BUDGET_CHECK.as_millis() / crate::EPOCH_TICK.as_millis();
            return ticks.min(check as u64);
        }
        ticks
    }

    /// A new call may log [`MAX_LOGS_PER_CALL`](super::log::MAX_LOGS_PER_CALL) messages.
    pub(super) fn start_call_log(&mut self) {
        self.logged = 0;
    }

    /// The end of the guest's stderr, where a Rust guest prints its panic message.
    pub(super) fn stderr_tail(&self) -> String {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        let text = text.trim();
        let start = text.len().saturating_sub(2000);
        let start = (start..=text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }
}

/// `wasi:clocks/monotonic-clock` on the virtual clock. It replaces wasmtime-wasi's, whose
/// pollables wait in real time: here a guest that sleeps (`subscribe-duration` then
/// `block`) holds no host thread, and its clock moves by exactly the time it slept.
impl wasmtime_wasi::p2::bindings::clocks::monotonic_clock::Host for SandboxCtx {
    fn now(&mut self) -> wasmtime::Result<u64> {
        Ok(self.clock.monotonic_now())
    }

    fn resolution(&mut self) -> wasmtime::Result<u64> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: u64,
    ) -> wasmtime::Result<Resource<wasmtime_wasi::p2::DynPollable>> {
        let timer = self.table.push(self.clock.timer_at(when))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, timer)
    }

    fn subscribe_duration(
        &mut self,
        duration: u64,
    ) -> wasmtime::Result<Resource<wasmtime_wasi::p2::DynPollable>> {
        let timer = self.table.push(self.clock.timer_in(duration))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, timer)
    }
}
