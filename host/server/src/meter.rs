//! Per-tenant accounting of processor calls: CPU time of every call (the calling thread's
//! CPU clock), each instance's memory high-water mark, and the per-batch CPU budget. A
//! [`CallMeter`] the contract's [`Metered`](statebox_contract::Metered) wrapper reports
//! every call to.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use statebox_contract::{CallMeter, Function};
use statebox_runtime::Processor;

/// What a tenant's processors have used.
#[derive(Debug, Default)]
pub(crate) struct TenantUsage {
    /// CPU time spent in processor calls, in nanoseconds.
    pub cpu_ns: AtomicU64,
    /// The largest linear memory any of the tenant's instances reached, in bytes.
    pub memory_high_water: AtomicU64,
}

/// The CPU budget of one pipeline's current batch, shared by its partitions: the meter
/// charges it after each call, and the runtime checks it inside every call (the processor
/// was loaded with it as [`Limits::batch_cpu`](statebox_runtime::Limits::batch_cpu)).
pub(crate) use statebox_contract::CpuBudget as BatchBudget;

/// A processor whose calls are accounted to a tenant and a pipeline's batch budget.
pub(crate) type Metered = statebox_contract::Metered<Processor, TenantMeter>;

/// Charges one tenant, and one pipeline's batch budget, for its processor's calls.
#[derive(Clone)]
pub(crate) struct TenantMeter {
    pub usage: Arc<TenantUsage>,
    pub budget: Arc<BatchBudget>,
}

impl CallMeter for TenantMeter {
    /// Refuses a call once the batch has used its CPU budget.
    fn admit(&self) -> Result<(), String> {
        let used = self.budget.used_ns();
        let limit = self.budget.limit_ns();
        if used <= limit {
            return Ok(());
        }
        Err(format!(
            "the batch used {} ms of CPU, more than its budget of {} ms (tenant quota \
             `batch_cpu_ms`)",
            used / 1_000_000,
            limit / 1_000_000
        ))
    }

    fn record(&self, function: Function, cpu_ns: u64, memory_high_water_bytes: usize) {
        self.usage.cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
        // Instantiation (with its `init`) counts to the tenant's CPU only; the batch budget
        // is charged for the batch's handler calls.
        if function != Function::Init {
            self.budget.charge(cpu_ns);
        }
        self.usage
            .memory_high_water
            .fetch_max(memory_high_water_bytes as u64, Ordering::Relaxed);
    }
}
