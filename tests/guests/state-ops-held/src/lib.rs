//! The `state-ops` conformance processor with `HOLD_WRITES`: its value updates, list appends
//! and map updates are held back and sent to the host together. The end-to-end tests run the
//! same operations through both and expect the same results.

#[path = "../../state-ops/src/ops.rs"]
mod ops;

statebox_sdk::export_processor!(ops::StateOps<true>);
