//! The imports, called as a guest would call them, over an in-memory checkpoint: no
//! component is compiled or instantiated. Each test drives the call lifecycle the instance
//! drives (`begin_init`, `lend`, `begin_call`, …) and calls the WIT functions on the
//! [`HostView`] the linker hands them.

use statebox_state::{Checkpoint, PartitionTxn};
use wasmtime::component::{Resource, ResourceTable};

use super::state::MAX_LIVE_ITERATORS;
use super::vars::{MAX_PAGE, MAX_PAGE_BYTES};
use super::*;
use crate::bindings::statebox::processor::handle::Host as _;
use crate::bindings::statebox::processor::keys::Host as _;
use crate::bindings::statebox::processor::state::{
    HostJsonIterator, HostListState, HostMapIterator, HostMapState, HostValueState,
};
use crate::bindings::statebox::processor::types::{ErrorKind, StateError};
use crate::{BatchTimes, InstanceConfig, Limits, TimeMode};

pub(super) const KEY: &str = r#"["a"]"#;
pub(super) const OTHER: &str = r#"["b"]"#;
pub(super) const TIMES: BatchTimes = BatchTimes {
    batch_id: 7,
    batch_timestamp_ms: 10_000,
    watermark_ms: 4_000,
};

pub(super) fn host(mode: TimeMode) -> HostState {
    host_with(mode, &Limits::default())
}

pub(super) fn host_with(mode: TimeMode, limits: &Limits) -> HostState {
    HostState::new(
        "test".into(),
        InstanceConfig::detached(mode),
        limits,
        ResourceTable::new(),
    )
}

/// Another handle to the same resource, as the guest passes a borrowed handle each call.
pub(super) fn again<T: 'static>(res: &Resource<T>) -> Resource<T> {
    Resource::new_borrow(res.rep())
}

/// The kind of a WIT error, failing the test on success.
pub(super) fn kind<T: std::fmt::Debug>(result: Result<T, StateError>) -> (ErrorKind, String) {
    let e = result.expect_err("expected a WIT error");
    (e.kind, e.message)
}

/// Declares in `init`: a value `count` (long), a list `items` (string), a map `tags`
/// (string to long), and lends a fresh transaction of an in-memory checkpoint.
pub(super) struct Declared {
    pub(super) count: Resource<ValueStateRes>,
    pub(super) items: Resource<ListStateRes>,
    pub(super) tags: Resource<MapStateRes>,
}

pub(super) fn declare(h: &mut HostState) -> Declared {
    h.begin_init();
    let mut v = h.view();
    let count = v
        .get_value_state("count".into(), "long".into(), None)
        .unwrap()
        .unwrap();
    let items = v
        .get_list_state("items".into(), "string".into(), None)
        .unwrap()
        .unwrap();
    let tags = v
        .get_map_state("tags".into(), "string".into(), "long".into(), None)
        .unwrap()
        .unwrap();
    h.end_call();
    Declared { count, items, tags }
}

pub(super) fn lend(h: &mut HostState) -> Checkpoint {
    let checkpoint = Checkpoint::in_memory();
    h.lend(checkpoint.txn(0), TIMES);
    checkpoint
}

pub(super) fn take_back(h: &mut HostState) -> PartitionTxn {
    h.end_call();
    h.take_back().expect("the transaction was lent")
}

#[test]
fn value_get_update_clear() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap(),
        None
    );
    assert!(
        !HostValueState::exists(&mut v, again(&d.count))
            .unwrap()
            .unwrap()
    );
    v.update(again(&d.count), "41".into()).unwrap().unwrap();
    v.update(again(&d.count), "42".into()).unwrap().unwrap();
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap()
            .as_deref(),
        Some("42")
    );
    HostValueState::clear(&mut v, again(&d.count))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap(),
        None
    );
    // A value that does not match the schema, and null, are the guest's errors.
    let (k, m) = kind(v.update(again(&d.count), "\"x\"".into()).unwrap());
    assert_eq!(k, ErrorKind::SchemaMismatch, "{m}");
    assert!(m.contains("`count`"), "{m}");
    let (k, _) = kind(v.update(again(&d.count), " null ".into()).unwrap());
    assert_eq!(k, ErrorKind::NullElement);
}

#[test]
fn state_belongs_to_the_key_of_the_call() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    h.view()
        .update(again(&d.count), "1".into())
        .unwrap()
        .unwrap();
    h.end_call();
    h.begin_call(OTHER);
    assert_eq!(
        HostValueState::get(&mut h.view(), again(&d.count))
            .unwrap()
            .unwrap(),
        None
    );
    h.end_call();
    h.begin_call(KEY);
    assert_eq!(
        HostValueState::get(&mut h.view(), again(&d.count))
            .unwrap()
            .unwrap()
            .as_deref(),
        Some("1")
    );
    let txn = take_back(&mut h);
    // What the import wrote is in the transaction the engine gets back, under the key.
    let id = h.view().sandbox.table.get(&d.count).unwrap().0.id;
    assert_eq!(
        txn.value_get(id, KEY.as_bytes()).unwrap().unwrap().payload,
        b"1"
    );
    assert!(txn.value_get(id, OTHER.as_bytes()).unwrap().is_none());
}

#[test]
fn list_append_put_clear_and_pages() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    assert!(
        !HostListState::exists(&mut v, again(&d.items))
            .unwrap()
            .unwrap()
    );
    v.append_value(again(&d.items), "\"a\"".into())
        .unwrap()
        .unwrap();
    v.append_list(again(&d.items), vec!["\"b\"".into(), "\"c\"".into()])
        .unwrap()
        .unwrap();
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), 2)
            .unwrap()
            .unwrap(),
        ["\"a\"", "\"b\""]
    );
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), 2)
            .unwrap()
            .unwrap(),
        ["\"c\""]
    );
    assert!(
        HostJsonIterator::next_page(&mut v, again(&it), 2)
            .unwrap()
            .unwrap()
            .is_empty()
    );
    // An empty list cannot be put or appended; a bad element fails the whole append.
    let (k, _) = kind(v.put(again(&d.items), vec![]).unwrap());
    assert_eq!(k, ErrorKind::EmptyList);
    let (k, _) = kind(
        v.append_list(again(&d.items), vec!["\"d\"".into(), "1".into()])
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::SchemaMismatch);
    v.put(again(&d.items), vec!["\"z\"".into()])
        .unwrap()
        .unwrap();
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), 10)
            .unwrap()
            .unwrap(),
        ["\"z\""]
    );
    HostListState::clear(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    assert!(
        !HostListState::exists(&mut v, again(&d.items))
            .unwrap()
            .unwrap()
    );
}

#[test]
fn a_page_is_bounded_by_count_and_by_bytes() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    // By count: whatever the guest asks for, at most MAX_PAGE elements (and at least one).
    let many = (0..MAX_PAGE as usize + 10)
        .map(|i| format!("\"{i}\""))
        .collect();
    v.append_list(again(&d.items), many).unwrap().unwrap();
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), u32::MAX)
            .unwrap()
            .unwrap()
            .len(),
        MAX_PAGE as usize
    );
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), u32::MAX)
            .unwrap()
            .unwrap(),
        (MAX_PAGE..MAX_PAGE + 10)
            .map(|i| format!("\"{i}\""))
            .collect::<Vec<_>>()
    );
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), 0)
            .unwrap()
            .unwrap(),
        ["\"0\""]
    );
    // By bytes: a page ends once it holds MAX_PAGE_BYTES, however many were asked for.
    HostListState::clear(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    let big = format!("\"{}\"", "x".repeat(MAX_PAGE_BYTES / 4));
    v.put(again(&d.items), vec![big.clone(); 10])
        .unwrap()
        .unwrap();
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    let mut pages = Vec::new();
    loop {
        let page = HostJsonIterator::next_page(&mut v, again(&it), 100)
            .unwrap()
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.iter().all(|e| *e == big));
        pages.push(page.len());
    }
    // Each element is a little over a quarter of the bound: four fill a page.
    assert_eq!(pages, [4, 4, 2]);
}

#[test]
fn map_update_get_remove_and_pages() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    assert!(
        !HostMapState::exists(&mut v, again(&d.tags))
            .unwrap()
            .unwrap()
    );
    for (k, n) in [("b", 2), ("a", 1), ("c", 3)] {
        v.update_value(again(&d.tags), format!("\"{k}\""), n.to_string())
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        v.get_value(again(&d.tags), "\"b\"".into())
            .unwrap()
            .unwrap()
            .as_deref(),
        Some("2")
    );
    assert!(
        v.contains_key(again(&d.tags), "\"c\"".into())
            .unwrap()
            .unwrap()
    );
    v.remove_key(again(&d.tags), "\"c\"".into())
        .unwrap()
        .unwrap();
    assert!(
        !v.contains_key(again(&d.tags), "\"c\"".into())
            .unwrap()
            .unwrap()
    );
    let (k, _) = kind(v.get_value(again(&d.tags), "null".into()).unwrap());
    assert_eq!(k, ErrorKind::NullElement);
    let (k, _) = kind(
        v.update_value(again(&d.tags), "1".into(), "1".into())
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::SchemaMismatch);
    // Entries come in the byte order of the canonical user key, page by page.
    let it = v.iterator(again(&d.tags)).unwrap().unwrap();
    let page = HostMapIterator::next_page(&mut v, again(&it), 1)
        .unwrap()
        .unwrap();
    assert_eq!(
        (page[0].key.as_str(), page[0].value.as_str()),
        ("\"a\"", "1")
    );
    let page = HostMapIterator::next_page(&mut v, again(&it), 5)
        .unwrap()
        .unwrap();
    assert_eq!((page[0].key.as_str(), page.len()), ("\"b\"", 1));
    let keys = HostMapState::keys(&mut v, again(&d.tags)).unwrap().unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&keys), 10)
            .unwrap()
            .unwrap(),
        ["\"a\"", "\"b\""]
    );
    let values = HostMapState::values(&mut v, again(&d.tags))
        .unwrap()
        .unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&values), 10)
            .unwrap()
            .unwrap(),
        ["1", "2"]
    );
    HostMapState::clear(&mut v, again(&d.tags))
        .unwrap()
        .unwrap();
    assert!(
        !HostMapState::exists(&mut v, again(&d.tags))
            .unwrap()
            .unwrap()
    );
}

#[test]
fn map_user_keys_are_checked_and_canonicalized_each_time() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    let get = |v: &mut HostView<'_>, k: &str| {
        v.get_value(again(&d.tags), k.into())
            .unwrap()
            .map(|found| found.unwrap_or_default())
    };
    // The first text a handle sees is checked: "" is no JSON.
    let (k, _) = kind(get(&mut v, ""));
    assert_eq!(k, ErrorKind::SchemaMismatch);
    v.update_value(again(&d.tags), "\"x\"".into(), "1".into())
        .unwrap()
        .unwrap();
    assert_eq!(get(&mut v, "\"x\"").unwrap(), "1", "the same text again");
    // Other texts of the same key reach the same entry; after each, so does the first.
    for text in ["\"\\u0078\"", " \"x\" ", "\"x\""] {
        assert_eq!(get(&mut v, text).unwrap(), "1", "{text}");
    }
    // A text that fails is not kept: it fails every time, and the key before it still works.
    for _ in 0..2 {
        let (k, _) = kind(get(&mut v, "1"));
        assert_eq!(k, ErrorKind::SchemaMismatch);
    }
    assert_eq!(get(&mut v, "\"x\"").unwrap(), "1");
    v.update_value(again(&d.tags), "\"y\"".into(), "2".into())
        .unwrap()
        .unwrap();
    assert_eq!(get(&mut v, "\"y\"").unwrap(), "2");
    assert_eq!(get(&mut v, "\"x\"").unwrap(), "1");
    v.remove_key(again(&d.tags), "\"x\"".into())
        .unwrap()
        .unwrap();
    assert_eq!(get(&mut v, "\"x\"").unwrap(), "", "removed");
    assert_eq!(get(&mut v, "\"y\"").unwrap(), "2");
}

#[test]
fn declarations_are_checked() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    // Outside init: refused, and so is deleting.
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    let (k, m) = kind(
        v.get_value_state("late".into(), "long".into(), None)
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::WrongPhase);
    assert!(m.contains("`late`") && m.contains("init"), "{m}");
    assert_eq!(
        kind(v.delete_if_exists("count".into()).unwrap()).0,
        ErrorKind::WrongPhase
    );
    h.end_call();
    h.begin_init();
    let mut v = h.view();
    // A TTL without a time mode, a bad schema, another kind under a name.
    let (k, _) = kind(
        v.get_value_state("t".into(), "long".into(), Some(5))
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::UnsupportedInTimeMode);
    let (k, _) = kind(
        v.get_value_state("s".into(), "no such type".into(), None)
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::InvalidSchema);
    let (k, m) = kind(
        v.get_list_state("count".into(), "long".into(), None)
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::InvalidUse, "{m}");
    // The same declaration again is the same variable.
    let again_count = v
        .get_value_state("count".into(), "long".into(), None)
        .unwrap()
        .unwrap();
    let id = |v: &HostView<'_>, r: &Resource<ValueStateRes>| v.sandbox.table.get(r).unwrap().0.id;
    assert_eq!(id(&v, &again_count), id(&v, &d.count));
}

#[test]
fn a_zero_ttl_is_refused() {
    let mut h = host(TimeMode::ProcessingTime);
    h.begin_init();
    let (k, m) = kind(
        h.view()
            .get_value_state("t".into(), "long".into(), Some(0))
            .unwrap(),
    );
    assert_eq!(k, ErrorKind::InvalidUse);
    assert!(m.contains("TTL must be positive"), "{m}");
}

#[test]
fn a_handle_the_host_never_gave_traps() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    // A variable never declared (no such handle): a trap, not a WIT error.
    assert!(HostValueState::get(&mut v, Resource::<ValueStateRes>::new_borrow(999)).is_err());
    // So does a handle of another kind of variable.
    assert!(HostValueState::get(&mut v, Resource::new_borrow(d.items.rep())).is_err());
}

#[test]
fn state_is_reachable_only_in_handlers() {
    let mut h = host(TimeMode::ProcessingTime);
    let d = declare(&mut h);
    // In init: declarations only.
    h.begin_init();
    let (k, m) = kind(HostValueState::get(&mut h.view(), again(&d.count)).unwrap());
    assert_eq!(k, ErrorKind::WrongPhase);
    assert!(m.contains("not allowed in init"), "{m}");
    h.end_call();
    h.begin_close();
    assert_eq!(
        kind(h.view().register_timer(1).unwrap()).0,
        ErrorKind::WrongPhase
    );
    h.end_call();
    // A handler without a lent transaction.
    h.begin_call(KEY);
    let (k, m) = kind(HostValueState::get(&mut h.view(), again(&d.count)).unwrap());
    assert_eq!(k, ErrorKind::WrongPhase);
    assert!(m.contains("no batch is in progress"), "{m}");
}

#[test]
fn a_batched_call_acts_on_the_selected_key_only() {
    let mut h = host(TimeMode::ProcessingTime);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_batch_call(vec![KEY.into(), OTHER.into()]);
    let mut v = h.view();
    // Nothing is selected until use-key.
    let (k, m) = kind(HostValueState::get(&mut v, again(&d.count)).unwrap());
    assert_eq!(k, ErrorKind::WrongPhase);
    assert!(m.contains("use-key"), "{m}");
    let (k, m) = kind(v.use_key(2).unwrap());
    assert_eq!(k, ErrorKind::InvalidUse);
    assert!(m.contains("2 entries"), "{m}");
    v.use_key(0).unwrap().unwrap();
    v.update(again(&d.count), "10".into()).unwrap().unwrap();
    v.use_key(1).unwrap().unwrap();
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap(),
        None
    );
    v.update(again(&d.count), "20".into()).unwrap().unwrap();
    v.use_key(0).unwrap().unwrap();
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap()
            .as_deref(),
        Some("10")
    );
    assert_eq!(h.selected_entry(), Some(0));
    h.end_call();
    // use-key outside a batched call.
    h.begin_call(KEY);
    assert_eq!(kind(h.view().use_key(0).unwrap()).0, ErrorKind::InvalidUse);
    h.end_call();
    let txn = take_back(&mut h);
    let id = h.view().sandbox.table.get(&d.count).unwrap().0.id;
    assert_eq!(
        txn.value_get(id, OTHER.as_bytes())
            .unwrap()
            .unwrap()
            .payload,
        b"20"
    );
}

#[test]
fn held_writes_apply_to_their_entries_keys_in_order_and_stop_at_the_first_rejected() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    let mut v = h.view();
    let (count, items, tags) = (
        HostValueState::number(&mut v, again(&d.count)).unwrap(),
        HostListState::number(&mut v, again(&d.items)).unwrap(),
        HostMapState::number(&mut v, again(&d.tags)).unwrap(),
    );
    let writes = held_writes;
    // Outside a batched call there are no entries to name.
    h.begin_call(KEY);
    let failure = h
        .view()
        .apply_writes(writes(&[(0, count, "1")], &[]))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        failure.error.kind,
        ErrorKind::InvalidUse,
        "{}",
        failure.error.message
    );
    h.end_call();

    h.begin_batch_call(vec![KEY.into(), OTHER.into()]);
    let mut v = h.view();
    v.use_key(1).unwrap().unwrap();
    // Entry 0's writes apply to its key although entry 1 is selected; a later write to the
    // same variable wins.
    v.apply_writes(writes(
        &[
            (0, count, "1"),
            (1, count, "2"),
            (0, items, "\"x\""),
            (0, items, "\"y\""),
            (0, count, "3"),
            (1, tags, "5"),
        ],
        &["\"t\""],
    ))
    .unwrap()
    .unwrap();
    // The selected key is still entry 1's.
    assert_eq!(
        HostValueState::get(&mut v, again(&d.count))
            .unwrap()
            .unwrap()
            .as_deref(),
        Some("2")
    );
    // A refused write stops the writes there: the one before it applied, the one after not.
    let failure = v
        .apply_writes(writes(
            &[(1, count, "4"), (0, count, "\"four\""), (1, count, "5")],
            &[],
        ))
        .unwrap()
        .unwrap_err();
    assert_eq!(failure.position, 1);
    assert_eq!(failure.error.kind, ErrorKind::SchemaMismatch);
    assert!(
        failure.error.message.contains("`count`"),
        "{}",
        failure.error.message
    );
    // An entry past the call's.
    let failure = v
        .apply_writes(writes(&[(2, count, "1")], &[]))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (failure.position, failure.error.kind),
        (0, ErrorKind::InvalidUse)
    );
    assert!(
        failure.error.message.contains("2 entries"),
        "{}",
        failure.error.message
    );
    // Columns that disagree, and user keys that are not one per map write.
    let mut short = writes(&[(0, count, "1"), (0, count, "2")], &[]);
    short.values.pop();
    let failure = v.apply_writes(short).unwrap().unwrap_err();
    assert_eq!(
        (failure.position, failure.error.kind),
        (1, ErrorKind::InvalidUse)
    );
    let failure = v
        .apply_writes(writes(&[(0, tags, "1")], &[]))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (failure.position, failure.error.kind),
        (0, ErrorKind::InvalidUse)
    );
    let failure = v
        .apply_writes(writes(&[(0, count, "9")], &["\"t\""]))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (failure.position, failure.error.kind),
        (1, ErrorKind::InvalidUse)
    );
    // A number that is no state variable traps, as a forged handle does.
    assert!(v.apply_writes(writes(&[(0, 9999, "1")], &[])).is_err());
    // Entry 0's count was 3; the refused batch of user keys wrote 9 before failing.
    v.apply_writes(writes(&[(0, count, "3")], &[]))
        .unwrap()
        .unwrap();
    // What each key holds now, as the guest reads it.
    let read = |v: &mut HostView<'_>, entry: u32| {
        v.use_key(entry).unwrap().unwrap();
        let count = HostValueState::get(v, again(&d.count)).unwrap().unwrap();
        let list = HostListState::get(v, again(&d.items)).unwrap().unwrap();
        let items = HostJsonIterator::next_page(v, list, 10).unwrap().unwrap();
        let tag = v
            .get_value(again(&d.tags), "\"t\"".into())
            .unwrap()
            .unwrap();
        (count, items, tag)
    };
    assert_eq!(
        read(&mut v, 0),
        (Some("3".into()), vec!["\"x\"".into(), "\"y\"".into()], None)
    );
    assert_eq!(
        read(&mut v, 1),
        (Some("4".into()), vec![], Some("5".into()))
    );
}

/// Held writes as (entry, variable, value), and the map writes' user keys.
fn held_writes(
    writes: &[(u32, u32, &str)],
    user_keys: &[&str],
) -> crate::bindings::statebox::processor::keys::HeldWrites {
    crate::bindings::statebox::processor::keys::HeldWrites {
        entries: writes.iter().map(|w| w.0).collect(),
        variables: writes.iter().map(|w| w.1).collect(),
        values: writes.iter().map(|w| w.2.to_owned()).collect(),
        user_keys: user_keys.iter().map(|&k| k.to_owned()).collect(),
    }
}

/// Held writes numbered 2^32 - 1 and 2^32 - 2 register and delete timers of their entries'
/// keys, in order with the other writes; a time that is no integer, or timers in time mode
/// none, are refused at the write.
#[test]
fn held_timer_writes_register_and_delete_their_entries_timers() {
    use super::keys::HeldTimer;

    const REGISTER: u32 = HeldTimer::REGISTER;
    const DELETE: u32 = HeldTimer::DELETE;
    let writes = |writes: &[(u32, u32, &str)]| held_writes(writes, &[]);
    let mut h = host(TimeMode::ProcessingTime);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_batch_call(vec![KEY.into(), OTHER.into()]);
    let mut v = h.view();
    let count = HostValueState::number(&mut v, again(&d.count)).unwrap();
    v.use_key(1).unwrap().unwrap();
    v.apply_writes(writes(&[
        (0, REGISTER, "30"),
        (1, REGISTER, "20"),
        (0, count, "7"),
        (0, REGISTER, "40"),
        (0, DELETE, "30"),
        (1, DELETE, "99"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(v.list_timers().unwrap().unwrap(), [20]);
    v.use_key(0).unwrap().unwrap();
    assert_eq!(v.list_timers().unwrap().unwrap(), [40]);
    for bad in ["\"soon\"", "1.5", "null", "99999999999999999999"] {
        let failure = v
            .apply_writes(writes(&[(0, DELETE, "40"), (0, REGISTER, bad)]))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            (failure.position, failure.error.kind),
            (1, ErrorKind::InvalidUse),
            "{bad}"
        );
        assert!(
            failure.error.message.contains(bad) && failure.error.message.contains("registers"),
            "{}",
            failure.error.message
        );
        // The deletion before it applied.
        assert_eq!(v.list_timers().unwrap().unwrap(), Vec::<i64>::new());
        v.timer_register(40, None).unwrap().unwrap();
    }
    h.end_call();

    let mut h = host(TimeMode::None);
    let _d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_batch_call(vec![KEY.into()]);
    let failure = h
        .view()
        .apply_writes(writes(&[(0, DELETE, "1")]))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        (failure.position, failure.error.kind),
        (0, ErrorKind::UnsupportedInTimeMode)
    );
    assert!(
        failure.error.message.contains("delete-timer"),
        "{}",
        failure.error.message
    );
    h.end_call();
}

#[test]
fn an_iterator_works_only_in_its_call_and_for_its_key() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_batch_call(vec![KEY.into(), OTHER.into()]);
    let mut v = h.view();
    v.use_key(0).unwrap().unwrap();
    v.append_value(again(&d.items), "\"a\"".into())
        .unwrap()
        .unwrap();
    let it = HostListState::get(&mut v, again(&d.items))
        .unwrap()
        .unwrap();
    v.use_key(1).unwrap().unwrap();
    let (k, _) = kind(HostJsonIterator::next_page(&mut v, again(&it), 10).unwrap());
    assert_eq!(k, ErrorKind::InvalidUse);
    // Back on its key, it works again (an async handler's iterator survives switches).
    v.use_key(0).unwrap().unwrap();
    assert_eq!(
        HostJsonIterator::next_page(&mut v, again(&it), 10)
            .unwrap()
            .unwrap(),
        ["\"a\""]
    );
    h.end_call();
    // Not in a later call, even for the same key.
    h.begin_call(KEY);
    assert_eq!(
        kind(HostJsonIterator::next_page(&mut h.view(), again(&it), 10).unwrap()).0,
        ErrorKind::InvalidUse
    );
}

#[test]
fn open_iterators_are_limited() {
    let mut h = host(TimeMode::None);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    let mut open: Vec<_> = (0..MAX_LIVE_ITERATORS)
        .map(|_| {
            HostListState::get(&mut v, again(&d.items))
                .unwrap()
                .unwrap()
        })
        .collect();
    let (k, m) = kind(v.iterator(again(&d.tags)).unwrap());
    assert_eq!(k, ErrorKind::LimitExceeded);
    assert!(m.contains(&MAX_LIVE_ITERATORS.to_string()), "{m}");
    // Dropping one makes room for one.
    let one = open.pop().unwrap();
    HostJsonIterator::drop(&mut v, Resource::new_own(one.rep())).unwrap();
    let map_it = v.iterator(again(&d.tags)).unwrap().unwrap();
    assert_eq!(
        kind(HostMapState::keys(&mut v, again(&d.tags)).unwrap()).0,
        ErrorKind::LimitExceeded
    );
    HostMapIterator::drop(&mut v, Resource::new_own(map_it.rep())).unwrap();
    assert!(HostMapState::keys(&mut v, again(&d.tags)).unwrap().is_ok());
}

#[test]
fn state_written_per_batch_is_limited() {
    let limits = Limits {
        state_bytes_per_batch: 8,
        ..Limits::default()
    };
    let mut h = host_with(TimeMode::None, &limits);
    let d = declare(&mut h);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    let mut v = h.view();
    v.update(again(&d.count), "1234".into()).unwrap().unwrap();
    v.update(again(&d.count), "1234".into()).unwrap().unwrap();
    let (k, m) = kind(v.update(again(&d.count), "1".into()).unwrap());
    assert_eq!(k, ErrorKind::LimitExceeded);
    assert!(m.contains("more than 8 bytes"), "{m}");
    // Map keys count too.
    assert_eq!(
        kind(
            v.update_value(again(&d.tags), "\"k\"".into(), "1".into())
                .unwrap()
        )
        .0,
        ErrorKind::LimitExceeded
    );
    // The next batch starts over.
    h.start_batch();
    h.view()
        .update(again(&d.count), "12345678".into())
        .unwrap()
        .unwrap();
}

#[test]
fn describe_mode_records_init_and_touches_no_catalog() {
    let mut h = host(TimeMode::None);
    let catalog = statebox_state::catalog::Catalog::default();
    h.start_describing(&catalog);
    h.begin_init();
    let mut v = h.view();
    v.get_value_state("count".into(), "long".into(), None)
        .unwrap()
        .unwrap();
    assert!(
        v.get_list_state("count".into(), "long".into(), None)
            .unwrap()
            .is_err()
    );
    v.delete_if_exists("old".into()).unwrap().unwrap();
    h.end_call();
    let described = h.take_described();
    assert_eq!(described.ops.len(), 3);
    assert!(described.ops[0].1.is_ok() && described.ops[1].1.is_err());
    assert!(
        h.state
            .config
            .catalog
            .lock()
            .unwrap()
            .get("count")
            .is_none()
    );
}

#[test]
fn query_info_names_the_batch_in_progress() {
    let mut h = host(TimeMode::None);
    assert_eq!(h.view().get_query_info().unwrap().batch_id, 0);
    let _cp = lend(&mut h);
    h.begin_call(KEY);
    assert_eq!(h.view().get_query_info().unwrap().batch_id, TIMES.batch_id);
}

/// A backend whose every operation fails, as a dying disk would.
struct FailingStore;

fn gone<T>() -> statebox_state::Result<T> {
    Err(statebox_state::StoreError::Storage(
        "the disk is gone".into(),
    ))
}

impl statebox_state::KvEngine for FailingStore {
    fn get_with(
        &self,
        _: &[u8],
        _: &mut statebox_state::GetFn<'_>,
    ) -> statebox_state::Result<bool> {
        gone()
    }

    fn scan(
        &self,
        _: &[u8],
        _: &[u8],
        _: &mut statebox_state::ScanFn<'_>,
    ) -> statebox_state::Result<()> {
        gone()
    }

    fn write(&self, _: &statebox_state::WriteBatch) -> statebox_state::Result<()> {
        gone()
    }
}

/// A storage failure is the host's: the import traps (the guest cannot catch it as a WIT
/// error) and the failure is kept for the report, which names it instead of the trap.
#[test]
fn a_storage_failure_traps_and_is_kept_for_the_report() {
    let mut h = host(TimeMode::ProcessingTime);
    let d = declare(&mut h);
    let checkpoint = Checkpoint::with_engine(std::sync::Arc::new(FailingStore));
    h.lend(checkpoint.txn(0), TIMES);
    h.begin_call(KEY);
    let trap = HostValueState::get(&mut h.view(), again(&d.count)).unwrap_err();
    assert!(trap.to_string().contains("the disk is gone"), "{trap:#}");
    let kept = h.take_internal_error().expect("the failure is kept");
    assert!(
        matches!(kept, statebox_state::StoreError::Storage(_)),
        "{kept}"
    );
    assert!(h.take_internal_error().is_none());
}
