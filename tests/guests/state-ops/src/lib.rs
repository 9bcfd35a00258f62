//! A conformance processor: each input row runs one state operation and the processor emits
//! its result, so the end-to-end tests can check SPEC §2 through the real host and RocksDB.
//!
//! Grouped by `k`. Input rows are
//! `{"k": ..., "op": ..., "v": long|null, "vs": [long|null, ...], "mk": string, "n": long, "j": <json text>}`
//! (only `k` and `op` are required), and each emits `{"k", "op", "result"}` where `result` is
//! JSON text: `{"ok": <value>}` on success, `{"err": "<ErrorKind>", "message": "..."}` when the
//! operation failed. A failed operation does not fail the call.
//!
//! | variable | kind | schema |
//! |---|---|---|
//! | `value` | value | `long` |
//! | `list` | list | `long` |
//! | `map` | map | key `string`, value `long` |
//! | `record` | value | `name string, visits int` |
//!
//! Operations (`v` may be null, to check that null is refused):
//!
//! | op | does | ok value |
//! |---|---|---|
//! | `value-get`, `value-exists`, `value-clear`, `value-update` (v) | the value state operation | the value / bool / null |
//! | `list-append` (v), `list-append-list` (vs), `list-put` (vs), `list-clear` | the list operation | null |
//! | `list-get`, `list-exists` | all elements / bool | array / bool |
//! | `list-append-range` (v = first, n) | appends `v, v+1, ..., v+n-1` in one `append-list` | null |
//! | `list-count` | iterates lazily | `{"count", "sum", "first", "last"}` |
//! | `map-update` (mk, v), `map-get` (mk), `map-contains` (mk), `map-remove` (mk), `map-clear`, `map-exists` | the map operation | value / bool / null |
//! | `map-iter`, `map-keys`, `map-values` | all entries / keys / values in iteration order | array |
//! | `map-fill` (v = first, n) | sets `m<i>` (`i` in 7 digits) to `i` for `i` in `v..v+n` | null |
//! | `map-remove-evens` (v = first, n) | removes `m<i>` for the even `i` in `v..v+n` | null |
//! | `map-count` | iterates entries lazily | `{"count", "sum"}` |
//! | `record-update` (j), `record-get` | the `record` value state with raw JSON | null / value |
//! | `timer-register` (v), `timer-list`, `timer-delete` (v) | the timer operation | null / array |
//! | `iter-keep` | creates a list iterator and keeps it in the processor | null |
//! | `iter-next` | takes the next item of the kept iterator | the item, if any |
//! | `iter-drain` | takes every remaining item of the kept iterator | how many |
//!
//! `tests/guests/state-ops-held` is the same processor with its writes held back and sent
//! together ([`StatefulProcessor::HOLD_WRITES`](statebox_sdk::StatefulProcessor::HOLD_WRITES)).

mod ops;

pub use ops::*;

statebox_sdk::export_processor!(StateOps);
