//! Driving a guest call: to completion, or until the guest, blocked in a host call, has
//! outlived its deadline.
//!
//! Every export call is a wasmtime async call (`call_async`), run on the calling thread.
//! Running wasm is stopped by epoch interruption; a guest *waiting* in a host call
//! (`wasi:io/poll`, a blocking stream operation, an outgoing HTTP body) cannot be
//! interrupted that way, so the driver stops polling the call once its deadline plus
//! [`BLOCKED_CALL_MARGIN`] passes and drops it, which unwinds the guest with a trap. The
//! common case, a call that never waits, completes on its first poll without touching the
//! runtime's timers or parking the thread.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use crate::sandbox::{BLOCKED_CALL_MARGIN, CallDeadline};

/// Runs one instance's calls on the runtime's tokio runtime, under the instance's deadline.
#[derive(Clone)]
pub(crate) struct Driver {
    handle: tokio::runtime::Handle,
    deadline: CallDeadline,
}

impl Driver {
    pub(crate) fn new(handle: tokio::runtime::Handle, deadline: CallDeadline) -> Driver {
        Driver { handle, deadline }
    }

    /// Polls `call` to completion on this thread; `None` if it was still waiting in a host
    /// call when the deadline (as the store last moved it) and the margin had passed.
    pub(crate) fn run<T>(&self, call: impl Future<Output = T>) -> Option<T> {
        let mut call = pin!(call);
        {
            // Host calls may create timers and sockets: they need the runtime's context.
            let _context = self.handle.enter();
            let mut cx = Context::from_waker(Waker::noop());
            if let Poll::Ready(done) = call.as_mut().poll(&mut cx) {
                return Some(done);
            }
        }
        self.handle.block_on(async {
            let give_up_at = |d: &CallDeadline| d.at() + BLOCKED_CALL_MARGIN;
            let mut timer = pin!(tokio::time::sleep_until(give_up_at(&self.deadline).into()));
            poll_fn(|cx| {
                if let Poll::Ready(done) = call.as_mut().poll(cx) {
                    return Poll::Ready(Some(done));
                }
                while timer.as_mut().poll(cx).is_ready() {
                    // A batched call may have moved the deadline (a new key's budget).
                    let at = give_up_at(&self.deadline);
                    if at <= Instant::now() {
                        return Poll::Ready(None);
                    }
                    timer.as_mut().reset(at.into());
                }
                Poll::Pending
            })
            .await
        })
    }
}
