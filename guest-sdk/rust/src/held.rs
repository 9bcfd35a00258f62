//! Writes held back and sent to the host together, for a processor that asks for it
//! ([`StatefulProcessor::HOLD_WRITES`](crate::StatefulProcessor::HOLD_WRITES)).
//!
//! In a batched call, a value update, list append, map update, timer registration or timer
//! deletion is kept here instead of crossing into the host, and the kept writes go in one
//! `keys.apply-writes` call: when the batched call ends, when [`MAX_WRITES`] or
//! [`MAX_BYTES`] are kept, and before any other operation on a variable the current entry
//! wrote, or a listing of timers it registered or deleted (so a read sees every earlier
//! write).
//! Each write names its entry, so writes of keys already handled wait for later ones. The
//! host applies them in order, as the operations would have been one by one; state of one
//! key is reachable from that key's entry only, so nothing else can see the difference.
//!
//! The host checks each write when it arrives. One it rejects fails the batched call, named
//! by the entry it was made for, even when the failure was noticed during a later
//! operation (whose caller gets the error too).

use std::cell::RefCell;

use crate::__private::bindings::statebox::processor::keys::{self as wit, HeldWrites};
use crate::Error;

/// The variable number of a held timer registration (see `batch.wit`'s `held-writes`).
pub(crate) const TIMER_REGISTER: u32 = u32::MAX;

/// The variable number of a held timer deletion.
pub(crate) const TIMER_DELETE: u32 = u32::MAX - 1;

/// Writes kept at most before they are sent.
pub(crate) const MAX_WRITES: usize = 4096;

/// JSON bytes kept at most before the writes are sent.
pub(crate) const MAX_BYTES: usize = 1 << 20;

struct Held {
    /// Whether writes are held: inside a batched call of a processor that asks for it.
    on: bool,
    /// The entry selected (the index of the batched call's key being handled).
    entry: u32,
    writes: HeldWrites,
    bytes: usize,
    /// Variables (by number) the current entry wrote since its writes were last sent.
    dirty: Vec<u32>,
    /// The first held write the host rejected: its entry and the error.
    failed: Option<(u32, Error)>,
}

impl Held {
    fn new(on: bool) -> Held {
        Held {
            on,
            entry: 0,
            writes: no_writes(),
            bytes: 0,
            dirty: Vec::new(),
            failed: None,
        }
    }
}

fn no_writes() -> HeldWrites {
    HeldWrites {
        entries: Vec::new(),
        variables: Vec::new(),
        values: Vec::new(),
        user_keys: Vec::new(),
    }
}

thread_local! {
    static HELD: RefCell<Held> = RefCell::new(Held::new(false));
}

/// Holds writes until [`finish`] (or until dropped), if `on`.
pub(crate) struct Batch;

impl Batch {
    pub(crate) fn start(on: bool) -> Batch {
        HELD.with_borrow_mut(|held| *held = Held::new(on));
        Batch
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        HELD.with_borrow_mut(|held| *held = Held::new(false));
    }
}

/// Entry `index` of the batched call is being handled from now on.
pub(crate) fn select(index: u32) {
    HELD.with_borrow_mut(|held| {
        held.entry = index;
        held.dirty.clear();
    });
}

/// Keeps a write of `value` (and for a map, `user_key`) to variable `variable` (call it only
/// while [`holding`]); sends the held writes once they are many.
pub(crate) fn hold(variable: u32, value: String, user_key: Option<String>) -> Result<(), Error> {
    let full = HELD.with_borrow_mut(|held| {
        held.bytes += value.len() + user_key.as_ref().map_or(0, String::len);
        let writes = &mut held.writes;
        writes.entries.push(held.entry);
        writes.variables.push(variable);
        writes.values.push(value);
        writes.user_keys.extend(user_key);
        if !held.dirty.contains(&variable) {
            held.dirty.push(variable);
        }
        writes.entries.len() >= MAX_WRITES || held.bytes >= MAX_BYTES
    });
    if full { send() } else { Ok(()) }
}

/// Whether writes are held now.
pub(crate) fn holding() -> bool {
    HELD.with_borrow(|held| held.on)
}

/// Sends the held writes if the current entry wrote `variable` since they were last sent:
/// called before any operation on it that is not held.
pub(crate) fn sync(variable: u32) -> Result<(), Error> {
    if HELD.with_borrow(|held| held.dirty.contains(&variable)) {
        send()
    } else {
        Ok(())
    }
}

/// Sends every held write.
fn send() -> Result<(), Error> {
    let writes = HELD.with_borrow_mut(|held| {
        held.dirty.clear();
        held.bytes = 0;
        std::mem::replace(&mut held.writes, no_writes())
    });
    if writes.entries.is_empty() {
        return HELD.with_borrow(|held| match &held.failed {
            Some((_, e)) => Err(e.clone()),
            None => Ok(()),
        });
    }
    match wit::apply_writes(&writes) {
        Ok(()) => Ok(()),
        Err(failure) => {
            let entry = writes
                .entries
                .get(failure.position as usize)
                .copied()
                .unwrap_or(u32::MAX);
            let error = Error::from_host(failure.error);
            HELD.with_borrow_mut(|held| {
                // Later writes are not sent: the batched call fails.
                held.on = false;
                held.failed.get_or_insert((entry, error.clone()));
            });
            Err(error)
        }
    }
}

/// Sends what is still held at the end of a batched call. A held write the host rejected,
/// now or earlier, is the call's failure: its entry and error.
pub(crate) fn finish() -> Option<(u32, Error)> {
    if let Err(error) = send() {
        let failed = HELD.with_borrow_mut(|held| held.failed.take());
        return Some(failed.unwrap_or((u32::MAX, error)));
    }
    None
}

/// The held write the host rejected, if one was: its entry and error.
pub(crate) fn failure() -> Option<(u32, Error)> {
    HELD.with_borrow_mut(|held| held.failed.take())
}
