//! Host bindings generated from `wit/`, for the larger world `stateful-batch-processor`:
//! its imports are a superset of `stateful-processor`'s, and its two exports are looked up
//! one by one (see `Exports`), so a component implementing either world loads.
//!
//! Every import is trappable: a host-side fault (the state store failing) or a sandbox
//! violation traps the guest, while expected conditions are returned as WIT errors.

wasmtime::component::bindgen!({
    world: "stateful-batch-processor",
    path: "../../wit",
    imports: { default: trappable },
    // Export calls are async (`call_async`) so the driver can abandon a guest blocked in a
    // host call at its deadline (see `driver.rs`); the imports themselves never wait.
    exports: { default: async },
    ownership: Borrowing { duplicate_if_necessary: true },
    with: {
        "statebox:processor/state.value-state": crate::host::ValueStateRes,
        "statebox:processor/state.list-state": crate::host::ListStateRes,
        "statebox:processor/state.map-state": crate::host::MapStateRes,
        "statebox:processor/state.json-iterator": crate::host::JsonIteratorRes,
        "statebox:processor/state.map-iterator": crate::host::MapIteratorRes,
    },
});
