//! Shared CPU accounting: a budget many calls draw on, and the clock they are measured by.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A CPU budget shared by many calls, e.g. every partition of one batch of a pipeline.
/// Finished calls [`charge`](Self::charge) it; a running call checks it (with its own CPU
/// time so far) periodically and traps once the total passes the limit.
#[derive(Debug)]
pub struct CpuBudget {
    used_ns: AtomicU64,
    limit_ns: u64,
}

impl CpuBudget {
    /// A budget of `limit` CPU time, none of it used.
    pub fn new(limit: Duration) -> CpuBudget {
        CpuBudget {
            used_ns: AtomicU64::new(0),
            limit_ns: u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Starts over (a new batch).
    pub fn reset(&self) {
        self.used_ns.store(0, Ordering::Relaxed);
    }

    /// Adds the CPU time of a finished call.
    pub fn charge(&self, ns: u64) {
        self.used_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// CPU time charged so far, in nanoseconds.
    pub fn used_ns(&self) -> u64 {
        self.used_ns.load(Ordering::Relaxed)
    }

    /// The limit, in nanoseconds.
    pub fn limit_ns(&self) -> u64 {
        self.limit_ns
    }

    /// Whether the budget is used up once `running_ns` more (a call in progress) is added.
    pub fn exceeded_with(&self, running_ns: u64) -> bool {
        self.used_ns().saturating_add(running_ns) > self.limit_ns
    }
}

/// The calling thread's CPU time, in nanoseconds (0 if the clock cannot be read).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is supported on
    // every Linux the host runs on, and on failure `ts` stays zero.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
