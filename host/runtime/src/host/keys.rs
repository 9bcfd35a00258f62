//! The `keys` interface: in a batched call, the guest selects which of the call's entries
//! its state and timer operations act on, and sends the writes it held back for several
//! entries at once. It names an index, never a key.

use wasmtime::component::Resource;

use super::HostView;
use super::state::err;
use crate::bindings::statebox::processor::keys::{self, BufferedWrite, Write, WriteFailure};
use crate::bindings::statebox::processor::types::{ErrorKind, StateError};

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
        Ok(Ok(()))
    }

    fn apply_writes(
        &mut self,
        writes: Vec<BufferedWrite>,
    ) -> wasmtime::Result<Result<(), WriteFailure>> {
        for (position, w) in writes.into_iter().enumerate() {
            let entry = Some(w.entry);
            let applied = match w.write {
                Write::ValueUpdate(value) => {
                    self.value_update(&Resource::new_borrow(w.variable), value, entry)?
                }
                Write::ListAppend(value) => {
                    self.list_append_value(&Resource::new_borrow(w.variable), value, entry)?
                }
                Write::MapUpdate(e) => self.map_update_value(
                    &Resource::new_borrow(w.variable),
                    &e.key,
                    e.value,
                    entry,
                )?,
            };
            if let Err(error) = applied {
                let position = u32::try_from(position).unwrap_or(u32::MAX);
                return Ok(Err(WriteFailure { position, error }));
            }
        }
        Ok(Ok(()))
    }
}
