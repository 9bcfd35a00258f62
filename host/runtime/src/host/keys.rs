//! The `keys` interface: in a batched call, the guest selects which of the call's entries
//! its state and timer operations act on, and sends the writes it held back for several
//! entries at once. It names an index, never a key.

use wasmtime::component::Resource;

use super::HostView;
use super::state::err;
use super::state::{ListStateRes, MapStateRes, ValueStateRes};
use crate::bindings::statebox::processor::keys::{self, HeldWrites, WriteFailure};
use crate::bindings::statebox::processor::types::{ErrorKind, StateError};

/// A held write to the entry's timers rather than to a state variable: the `variables`
/// numbers `batch.wit` sets aside for them, which no state variable has (a variable's
/// number is its slot in the instance's resource table, which wasmtime caps at a million).
#[derive(Clone, Copy)]
pub(super) enum HeldTimer {
    /// `register-timer`, at number [`HeldTimer::REGISTER`].
    Register,
    /// `delete-timer`, at number [`HeldTimer::DELETE`].
    Delete,
}

impl HeldTimer {
    pub(super) const REGISTER: u32 = u32::MAX;
    pub(super) const DELETE: u32 = u32::MAX - 1;

    fn of(variable: u32) -> Option<HeldTimer> {
        match variable {
            HeldTimer::REGISTER => Some(HeldTimer::Register),
            HeldTimer::DELETE => Some(HeldTimer::Delete),
            _ => None,
        }
    }

    fn verb(self) -> &'static str {
        match self {
            HeldTimer::Register => "registers",
            HeldTimer::Delete => "deletes",
        }
    }
}

impl keys::Host for HostView<'_> {
    fn use_key(&mut self, index: u32) -> wasmtime::Result<Result<(), StateError>> {
        let batch_id = self.state.batch_id();
        let Some(batch) = self.state.batch.as_mut() else {
            return Ok(Err(err(
                ErrorKind::InvalidUse,
                "use-key is allowed only during a batched call (handle-input-batch or \
                 handle-expired-timers)"
                    .into(),
            )));
        };
        let index = index as usize;
        if index >= batch.keys.len() {
            return Ok(Err(err(
                ErrorKind::InvalidUse,
                format!(
                    "use-key({index}): the call has {} entries",
                    batch.keys.len()
                ),
            )));
        }
        if batch.selected == Some(index) {
            return Ok(Ok(()));
        }
        // Each key keeps its own random stream across switches, as if it had been called
        // alone.
        let random = &self.sandbox.random;
        if let Some(previous) = batch.selected {
            batch.random[previous] = Some(random.state());
        }
        match batch.random[index] {
            Some(state) => random.restore(state),
            None => {
                random.reseed(batch_id, &batch.keys[index]);
                // A key's first selection starts its own CPU, waiting and outbound-HTTP
                // budget (a shared batch budget still binds across keys).
                self.sandbox.start_key_budget();
            }
        }
        batch.selected = Some(index);
        batch.keys[index].clone_into(&mut self.state.key);
        // Guests select the entries in order: the next one's state is read next.
        self.state.prefetch_entry(index + 1);
        Ok(Ok(()))
    }

    fn apply_writes(&mut self, writes: HeldWrites) -> wasmtime::Result<Result<(), WriteFailure>> {
        let HeldWrites {
            entries,
            variables,
            values,
            user_keys,
        } = writes;
        let failure = |position: usize, error| {
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            Ok(Err(WriteFailure { position, error }))
        };
        if entries.len() != variables.len() || entries.len() != values.len() {
            let lengths = (entries.len(), variables.len(), values.len());
            return failure(
                lengths.0.min(lengths.1).min(lengths.2),
                err(
                    ErrorKind::InvalidUse,
                    format!(
                        "apply-writes: {} entries, {} variables and {} values: one each per write",
                        lengths.0, lengths.1, lengths.2
                    ),
                ),
            );
        }
        let values_len = values.len();
        let mut user_keys = user_keys.into_iter();
        let writes = entries.into_iter().zip(variables).zip(values);
        for (position, ((entry, variable), value)) in writes.enumerate() {
            let entry = Some(entry);
            if let Some(timer) = HeldTimer::of(variable) {
                let applied = match serde_json::from_str::<i64>(&value) {
                    Ok(at) => match timer {
                        HeldTimer::Register => self.timer_register(at, entry)?,
                        HeldTimer::Delete => self.timer_delete(at, entry)?,
                    },
                    Err(_) => Err(err(
                        ErrorKind::InvalidUse,
                        format!(
                            "apply-writes: write {position} {} a timer at `{value}`, which is \
                             not a time in milliseconds (a JSON integer)",
                            timer.verb()
                        ),
                    )),
                };
                if let Err(error) = applied {
                    return failure(position, error);
                }
                continue;
            }
            let any = self.sandbox.table.get_any_mut(variable)?;
            let applied = if any.is::<ValueStateRes>() {
                self.value_update(&Resource::new_borrow(variable), value, entry)?
            } else if any.is::<ListStateRes>() {
                self.list_append_value(&Resource::new_borrow(variable), value, entry)?
            } else if any.is::<MapStateRes>() {
                let Some(user_key) = user_keys.next() else {
                    return failure(
                        position,
                        err(
                            ErrorKind::InvalidUse,
                            format!("apply-writes: write {position} to a map has no user key"),
                        ),
                    );
                };
                self.map_update_value(&Resource::new_borrow(variable), &user_key, value, entry)?
            } else {
                wasmtime::bail!("apply-writes: {variable} is not the number of a state variable");
            };
            if let Err(error) = applied {
                return failure(position, error);
            }
        }
        let extra = user_keys.len();
        if extra > 0 {
            return failure(
                values_len,
                err(
                    ErrorKind::InvalidUse,
                    format!("apply-writes: {extra} user keys more than the writes to maps"),
                ),
            );
        }
        Ok(Ok(()))
    }
}
