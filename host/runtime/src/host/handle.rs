//! The `handle` interface: declaring state variables (in `init`), the query's identity,
//! and timers (`timers.rs`).

use wasmtime::component::Resource;

use super::HostView;
use super::state::{ListStateRes, MapStateRes, ValueStateRes};
use crate::bindings::statebox::processor::handle;
use crate::bindings::statebox::processor::types::{self, StateError};
use statebox_state::catalog::VarKind;

impl handle::Host for HostView<'_> {
    fn get_query_info(&mut self) -> wasmtime::Result<types::QueryInfo> {
        Ok(self.state.query_info())
    }

    fn get_value_state(
        &mut self,
        name: String,
        value_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<ValueStateRes>, StateError>> {
        Ok(
            match self
                .state
                .declare(&name, VarKind::Value, None, &value_schema, ttl_ms)
            {
                Ok(var) => Ok(self.sandbox.table.push(ValueStateRes(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn get_list_state(
        &mut self,
        name: String,
        element_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<ListStateRes>, StateError>> {
        Ok(
            match self
                .state
                .declare(&name, VarKind::List, None, &element_schema, ttl_ms)
            {
                Ok(var) => Ok(self.sandbox.table.push(ListStateRes(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn get_map_state(
        &mut self,
        name: String,
        user_key_schema: String,
        value_schema: String,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Resource<MapStateRes>, StateError>> {
        Ok(
            match self.state.declare(
                &name,
                VarKind::Map,
                Some(&user_key_schema),
                &value_schema,
                ttl_ms,
            ) {
                Ok(var) => Ok(self.sandbox.table.push(MapStateRes::new(var))?),
                Err(e) => Err(e),
            },
        )
    }

    fn delete_if_exists(&mut self, name: String) -> wasmtime::Result<Result<(), StateError>> {
        Ok(self.state.delete_if_exists(name))
    }

    fn register_timer(&mut self, expiry_ms: i64) -> wasmtime::Result<Result<(), StateError>> {
        HostView::timer_register(self, expiry_ms, None)
    }

    fn delete_timer(&mut self, expiry_ms: i64) -> wasmtime::Result<Result<(), StateError>> {
        HostView::timer_delete(self, expiry_ms, None)
    }

    fn list_timers(&mut self) -> wasmtime::Result<Result<Vec<i64>, StateError>> {
        HostView::list_timers(self)
    }
}
