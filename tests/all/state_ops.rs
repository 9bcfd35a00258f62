//! State semantics (SPEC §2) through the real host and RocksDB, with the `state-ops` guest:
//! each input row runs one operation and its result comes back as an output row.

use serde_json::{Value, json};
use statebox_engine::TimeMode;
use statebox_runtime::Limits;
use statebox_tests::{EngineQuery, Rng, guests};

/// A state-ops query with one partition, so different keys share one instance and one
/// RocksDB partition: isolation cannot come from separate storage.
fn query() -> EngineQuery {
    EngineQuery::open(guests::STATE_OPS, "k", 1, Default::default())
}

/// An operation row for key `k`; `args` adds operands.
fn op(k: &str, name: &str, args: Value) -> Value {
    let mut row = json!({"k": k, "op": name});
    if let Value::Object(extra) = args {
        row.as_object_mut().unwrap().extend(extra);
    }
    row
}

/// Runs one batch and returns each operation's `{"ok": ..}` / `{"err": .., "message": ..}`.
fn run(q: &mut EngineQuery, ops: &[Value]) -> Vec<Value> {
    let out = q.batch(ops);
    assert_eq!(out.len(), ops.len(), "one row per operation: {out:?}");
    out.iter()
        .zip(ops)
        .map(|(row, op)| {
            assert_eq!(row["k"], op["k"], "rows come back in order");
            assert_eq!(row["op"], op["op"]);
            serde_json::from_str(row["result"].as_str().unwrap()).unwrap()
        })
        .collect()
}

fn ok(v: Value) -> Value {
    json!({ "ok": v })
}

#[track_caller]
fn assert_err(result: &Value, kind: &str, fragments: &[&str]) {
    assert_eq!(result["err"], kind, "{result}");
    let message = result["message"].as_str().unwrap();
    for f in fragments {
        assert!(message.contains(f), "`{f}` missing from: {message}");
    }
}

#[test]
fn value_state() {
    let mut q = query();
    let r = run(
        &mut q,
        &[
            op("a", "value-exists", json!({})),
            op("a", "value-get", json!({})),
            op("a", "value-update", json!({"v": 5})),
            op("a", "value-get", json!({})),
            op("a", "value-exists", json!({})),
            op("a", "value-update", json!({"v": 7})),
        ],
    );
    assert_eq!(
        r,
        [
            ok(json!(false)),
            ok(Value::Null),
            ok(Value::Null),
            ok(json!(5)),
            ok(json!(true)),
            ok(Value::Null),
        ]
    );
    // A restart reopens the committed value.
    q.reopen();
    let r = run(
        &mut q,
        &[
            op("a", "value-get", json!({})),
            op("a", "value-update", json!({"v": null})),
            op("a", "value-get", json!({})),
            op("a", "value-clear", json!({})),
            op("a", "value-exists", json!({})),
            op("a", "value-get", json!({})),
            op("a", "value-clear", json!({})),
        ],
    );
    assert_eq!(r[0], ok(json!(7)));
    assert_err(&r[1], "NullElement", &["value"]);
    assert_eq!(r[2], ok(json!(7)), "a refused update changes nothing");
    assert_eq!(
        r[3..],
        [
            ok(Value::Null),
            ok(json!(false)),
            ok(Value::Null),
            ok(Value::Null)
        ]
    );
    q.reopen();
    assert_eq!(
        run(&mut q, &[op("a", "value-exists", json!({}))]),
        [ok(json!(false))]
    );
}

#[test]
fn list_state() {
    let mut q = query();
    let r = run(
        &mut q,
        &[
            op("a", "list-exists", json!({})),
            op("a", "list-get", json!({})),
            op("a", "list-append", json!({"v": 1})),
            op("a", "list-append-list", json!({"vs": [2, 3]})),
            op("a", "list-append", json!({"v": 1})),
            op("a", "list-get", json!({})),
            op("a", "list-exists", json!({})),
        ],
    );
    assert_eq!(
        r,
        [
            ok(json!(false)),
            ok(json!([])),
            ok(Value::Null),
            ok(Value::Null),
            ok(Value::Null),
            ok(json!([1, 2, 3, 1])),
            ok(json!(true)),
        ]
    );
    let r = run(
        &mut q,
        &[
            op("a", "list-get", json!({})),
            op("a", "list-put", json!({"vs": [9, 8]})),
            op("a", "list-get", json!({})),
            op("a", "list-put", json!({"vs": []})),
            op("a", "list-append-list", json!({"vs": []})),
            op("a", "list-append", json!({"v": null})),
            op("a", "list-put", json!({"vs": [1, null]})),
            op("a", "list-append-list", json!({"vs": [4, null, 5]})),
            op("a", "list-get", json!({})),
        ],
    );
    assert_eq!(
        r[..3],
        [ok(json!([1, 2, 3, 1])), ok(Value::Null), ok(json!([9, 8]))]
    );
    assert_err(&r[3], "EmptyList", &["list"]);
    assert_err(&r[4], "EmptyList", &["list"]);
    assert_err(&r[5], "NullElement", &["list"]);
    assert_err(&r[6], "NullElement", &["list"]);
    assert_err(&r[7], "NullElement", &["list"]);
    assert_eq!(r[8], ok(json!([9, 8])), "refused operations change nothing");

    q.reopen();
    let r = run(
        &mut q,
        &[
            op("a", "list-get", json!({})),
            op("a", "list-clear", json!({})),
            op("a", "list-exists", json!({})),
            op("a", "list-get", json!({})),
            op("a", "list-append", json!({"v": 6})),
            op("a", "list-get", json!({})),
        ],
    );
    assert_eq!(
        r,
        [
            ok(json!([9, 8])),
            ok(Value::Null),
            ok(json!(false)),
            ok(json!([])),
            ok(Value::Null),
            ok(json!([6])),
        ]
    );
}

#[test]
fn map_state() {
    let mut q = query();
    let mut ops = Vec::new();
    for (mk, v) in [
        ("b", 2),
        ("a", 1),
        ("c", 3),
        ("aa", 4),
        ("b", 20),
        ("é", 5),
        ("B", 6),
    ] {
        ops.push(op("a", "map-update", json!({"mk": mk, "v": v})));
    }
    ops.extend([
        op("a", "map-exists", json!({})),
        op("a", "map-get", json!({"mk": "b"})),
        op("a", "map-get", json!({"mk": "zz"})),
        op("a", "map-contains", json!({"mk": "aa"})),
        op("a", "map-contains", json!({"mk": "zz"})),
        op("a", "map-iter", json!({})),
    ]);
    let r = run(&mut q, &ops);
    assert!(r[..7].iter().all(|r| *r == ok(Value::Null)), "{r:?}");
    // Iteration is ascending by the user key's canonical JSON encoding.
    let entries = json!([["B", 6], ["a", 1], ["aa", 4], ["b", 20], ["c", 3], ["é", 5]]);
    assert_eq!(
        r[7..],
        [
            ok(json!(true)),
            ok(json!(20)),
            ok(Value::Null),
            ok(json!(true)),
            ok(json!(false)),
            ok(entries.clone()),
        ]
    );

    // The same order after a restart, from RocksDB.
    q.reopen();
    let r = run(
        &mut q,
        &[
            op("a", "map-iter", json!({})),
            op("a", "map-keys", json!({})),
            op("a", "map-values", json!({})),
            op("a", "map-remove", json!({"mk": "b"})),
            op("a", "map-remove", json!({"mk": "zz"})),
            op("a", "map-keys", json!({})),
            op("a", "map-update", json!({"mk": "c", "v": null})),
            op("a", "map-get", json!({"mk": "c"})),
        ],
    );
    assert_eq!(r[0], ok(entries));
    assert_eq!(r[1], ok(json!(["B", "a", "aa", "b", "c", "é"])));
    assert_eq!(r[2], ok(json!([6, 1, 4, 20, 3, 5])));
    assert_eq!(
        r[3..5],
        [ok(Value::Null), ok(Value::Null)],
        "removing a missing key is a no-op"
    );
    assert_eq!(r[5], ok(json!(["B", "a", "aa", "c", "é"])));
    assert_err(&r[6], "NullElement", &["map"]);
    assert_eq!(r[7], ok(json!(3)), "a refused update changes nothing");

    let r = run(
        &mut q,
        &[
            op("a", "map-clear", json!({})),
            op("a", "map-exists", json!({})),
            op("a", "map-iter", json!({})),
            op("a", "map-get", json!({"mk": "a"})),
        ],
    );
    assert_eq!(
        r,
        [
            ok(Value::Null),
            ok(json!(false)),
            ok(json!([])),
            ok(Value::Null)
        ]
    );
}

#[test]
fn values_are_checked_against_the_schema() {
    let mut q = query();
    let rec = |j: &str| op("a", "record-update", json!({ "j": j }));
    let r = run(
        &mut q,
        &[
            rec(r#"{"name":"ann","visits":1}"#),
            op("a", "record-get", json!({})),
            rec(r#"{"name":"ann","visits":"many"}"#),
            rec(r#"{"name":"ann","visits":3000000000}"#),
            rec(r#"{"name":"ann","visits":2,"extra":true}"#),
            rec(r#""ann""#),
            op("a", "record-get", json!({})),
        ],
    );
    assert_eq!(r[0], ok(Value::Null));
    assert_eq!(r[1], ok(json!({"name": "ann", "visits": 1})));
    assert_err(&r[2], "SchemaMismatch", &["record", "visits"]);
    assert_err(&r[3], "SchemaMismatch", &["record", "visits"]);
    assert_err(&r[4], "SchemaMismatch", &["record", "extra"]);
    assert_err(&r[5], "SchemaMismatch", &["record"]);
    assert_eq!(r[6], ok(json!({"name": "ann", "visits": 1})));
}

#[test]
fn keys_never_see_each_other() {
    let mut q = query();
    let mut ops = Vec::new();
    for k in ["a", "b"] {
        ops.extend([
            op(k, "value-get", json!({})),
            op(k, "list-get", json!({})),
            op(k, "map-iter", json!({})),
        ]);
        let v = if k == "a" { 1 } else { 2 };
        ops.extend([
            op(k, "value-update", json!({"v": v})),
            op(k, "list-append", json!({"v": v})),
            op(k, "map-update", json!({"mk": "shared", "v": v})),
        ]);
    }
    let r = run(&mut q, &ops);
    // b, in the same batch and partition after a, sees none of a's state.
    assert_eq!(r[6..9], [ok(Value::Null), ok(json!([])), ok(json!([]))]);

    let r = run(
        &mut q,
        &[
            op("b", "map-clear", json!({})),
            op("b", "list-clear", json!({})),
            op("b", "value-clear", json!({})),
            op("a", "value-get", json!({})),
            op("a", "list-get", json!({})),
            op("a", "map-iter", json!({})),
            op("c", "map-exists", json!({})),
        ],
    );
    assert_eq!(
        r[3..],
        [
            ok(json!(1)),
            ok(json!([1])),
            ok(json!([["shared", 1]])),
            ok(json!(false)),
        ],
        "clearing b left a alone"
    );
    q.reopen();
    let r = run(
        &mut q,
        &[
            op("b", "map-exists", json!({})),
            op("a", "map-get", json!({"mk": "shared"})),
        ],
    );
    assert_eq!(r, [ok(json!(false)), ok(json!(1))]);
}

/// Timers are refused in time mode none, at the call that asks, also by a processor that
/// holds its writes (which then sends its timers at once).
#[test]
fn timers_are_refused_in_time_mode_none() {
    for guest in [guests::STATE_OPS, guests::STATE_OPS_HELD] {
        let mut q = EngineQuery::open(guest, "k", 1, Default::default());
        let r = run(
            &mut q,
            &[
                op("a", "timer-register", json!({"v": 1000})),
                op("a", "timer-list", json!({})),
                op("a", "timer-delete", json!({"v": 1000})),
            ],
        );
        for (result, what) in r
            .iter()
            .zip(["register-timer", "list-timers", "delete-timer"])
        {
            assert_err(result, "UnsupportedInTimeMode", &[what, "time mode none"]);
        }
    }
}

/// An iterator works during the call that created it; in a later call (here another key's)
/// the host refuses its next page. The SDK fetches 256 items per page, so the list is
/// longer than that to make the later call need a page.
#[test]
fn iterators_live_only_during_their_call() {
    let mut q = query();
    let r = run(
        &mut q,
        &[
            op("a", "list-append-range", json!({"v": 0, "n": 600})),
            op("a", "iter-keep", json!({})),
            op("a", "iter-next", json!({})),
            op("b", "iter-drain", json!({})),
        ],
    );
    assert_eq!(r[2], ok(json!(0)), "usable during the call that made it");
    assert_err(&r[3], "InvalidUse", &["iterator"]);

    let r = run(
        &mut q,
        &[
            op("a", "iter-keep", json!({})),
            op("a", "iter-drain", json!({})),
        ],
    );
    assert_eq!(r[1], ok(json!(600)), "a fresh iterator reads every page");
}

/// A list and a map far larger than one page are written in one batch and read back lazily
/// after a restart. The guest's memory limit is too small to hold the whole list at once.
#[test]
fn large_list_and_map_are_read_in_pages() {
    const LIST: i64 = 1_000_000;
    const CHUNK: i64 = 50_000;
    const MAP: i64 = 20_000;
    let limits = Limits {
        memory_bytes: 16 << 20,
        ..Limits::default()
    };
    let mut q = EngineQuery::open(guests::STATE_OPS, "k", 1, limits);
    let mut ops: Vec<Value> = (0..LIST / CHUNK)
        .map(|i| {
            op(
                "big",
                "list-append-range",
                json!({"v": i * CHUNK, "n": CHUNK}),
            )
        })
        .collect();
    ops.push(op("big", "map-fill", json!({"n": MAP})));
    ops.push(op("small", "list-append", json!({"v": 1})));
    let r = run(&mut q, &ops);
    assert!(r.iter().all(|r| *r == ok(Value::Null)), "{:?}", &r[..3]);

    q.reopen();
    let r = run(
        &mut q,
        &[
            op("big", "list-count", json!({})),
            op("big", "map-count", json!({})),
            op("big", "list-exists", json!({})),
            op("small", "list-count", json!({})),
        ],
    );
    assert_eq!(
        r,
        [
            ok(json!({"count": LIST, "sum": LIST * (LIST - 1) / 2, "first": 0, "last": LIST - 1})),
            ok(json!({"count": MAP, "sum": MAP * (MAP - 1) / 2})),
            ok(json!(true)),
            ok(json!({"count": 1, "sum": 1, "first": 1, "last": 1})),
        ]
    );
}

/// Reads within a batch merge the batch's uncommitted changes with committed state, across
/// page boundaries: removals hide committed entries, `put` and `clear` hide committed
/// elements, and new entries interleave with committed ones in key order.
#[test]
fn reads_merge_uncommitted_changes_with_committed_state() {
    let mut q = query();
    run(
        &mut q,
        &[
            op("a", "list-append-range", json!({"v": 0, "n": 1000})),
            op("a", "map-fill", json!({"v": 0, "n": 1000})),
        ],
    );
    q.reopen();
    let r = run(
        &mut q,
        &[
            op("a", "list-append-range", json!({"v": 1000, "n": 500})),
            op("a", "list-count", json!({})),
            // Removes committed entries, adds entries after them, overwrites a committed
            // entry and re-adds a removed one between committed ones.
            op("a", "map-remove-evens", json!({"v": 0, "n": 1000})),
            op("a", "map-fill", json!({"v": 1000, "n": 300})),
            op("a", "map-update", json!({"mk": "m0000001", "v": -1})),
            op("a", "map-update", json!({"mk": "m0000500", "v": 500})),
            op("a", "map-count", json!({})),
            op("a", "map-keys", json!({})),
        ],
    );
    let n: i64 = 1500;
    assert_eq!(
        r[1],
        ok(json!({"count": n, "sum": n * (n - 1) / 2, "first": 0, "last": n - 1}))
    );
    let mut expected: Vec<i64> = (0..1000).filter(|i| i % 2 == 1).collect();
    expected.push(500);
    expected.extend(1000..1300);
    expected.sort_unstable();
    // Every entry holds its number, but m0000001 holds -1 instead of 1.
    let sum: i64 = expected.iter().sum::<i64>() - 2;
    assert_eq!(
        r[6],
        ok(json!({"count": expected.len(), "sum": sum})),
        "m0000001 now holds -1"
    );
    let keys: Vec<String> = expected.iter().map(|i| format!("m{i:07}")).collect();
    assert_eq!(r[7], ok(json!(keys)));

    // Uncommitted put and clear hide committed elements.
    let r = run(
        &mut q,
        &[
            op("a", "list-put", json!({"vs": [7]})),
            op("a", "list-append", json!({"v": 8})),
            op("a", "list-get", json!({})),
            op("a", "map-clear", json!({})),
            op("a", "map-update", json!({"mk": "z", "v": 1})),
            op("a", "map-iter", json!({})),
        ],
    );
    assert_eq!(r[2], ok(json!([7, 8])));
    assert_eq!(r[5], ok(json!([["z", 1]])));
    q.reopen();
    let r = run(
        &mut q,
        &[
            op("a", "list-get", json!({})),
            op("a", "map-iter", json!({})),
            op("a", "list-clear", json!({})),
            op("a", "list-append", json!({"v": 9})),
            op("a", "list-get", json!({})),
        ],
    );
    assert_eq!(r[0], ok(json!([7, 8])));
    assert_eq!(r[1], ok(json!([["z", 1]])));
    assert_eq!(r[4], ok(json!([9])));
}

/// One of the few keys the random operations run on.
fn random_key(rng: &mut Rng) -> &'static str {
    const KEYS: [&str; 5] = ["a", "b", "c", "d", "e"];
    KEYS[rng.below(KEYS.len() as u64) as usize]
}

/// A random operation of the state-ops guest whose writes the host accepts (held writes that
/// fail would fail the batch instead of reporting the error), on one of a few keys.
fn random_op(rng: &mut Rng) -> Value {
    const USER_KEYS: [&str; 4] = ["p", "q", "r", "s"];
    let k = random_key(rng);
    let v = rng.below(100) as i64;
    let mk = USER_KEYS[rng.below(USER_KEYS.len() as u64) as usize];
    let vs: Vec<i64> = (0..rng.below(3)).map(|i| v + i as i64).collect();
    let (name, args) = match rng.below(26) {
        0..=2 => ("value-update", json!({"v": v})),
        3 => ("value-get", json!({})),
        4 => ("value-exists", json!({})),
        5 => ("value-clear", json!({})),
        6..=8 => ("list-append", json!({"v": v})),
        // An empty list is refused, though not held: the refusal is reported either way.
        9 => ("list-append-list", json!({ "vs": vs })),
        10 => ("list-put", json!({ "vs": vs })),
        11 => ("list-get", json!({})),
        12 => ("list-count", json!({})),
        13 => ("list-clear", json!({})),
        14..=16 => ("map-update", json!({"mk": mk, "v": v})),
        17 => ("map-get", json!({ "mk": mk })),
        18 => ("map-contains", json!({ "mk": mk })),
        19 => ("map-remove", json!({ "mk": mk })),
        20 => ("map-iter", json!({})),
        21 => ("map-fill", json!({"v": v, "n": 3})),
        22 => ("map-clear", json!({})),
        23 => ("iter-keep", json!({})),
        24 => ("iter-next", json!({})),
        _ => (
            "record-update",
            json!({"j": format!(r#"{{"name":"n{v}","visits":{v}}}"#)}),
        ),
    };
    op(k, name, args)
}

/// Writes held back and sent together (`state-ops-held`) give every operation the result it
/// gets when each write crosses into the host at once (`state-ops`): reads after writes of
/// the same key and variable, iterators over a list appended to meanwhile, refusals, and
/// what later batches and a restart read back.
#[test]
fn held_writes_give_the_results_of_writes_made_one_by_one() {
    let mut one_by_one = query();
    let mut held = EngineQuery::open(guests::STATE_OPS_HELD, "k", 1, Default::default());
    let mut rng = Rng::new(15);
    for batch in 0..8 {
        if batch == 5 {
            one_by_one.reopen();
            held.reopen();
        }
        let ops: Vec<Value> = (0..300).map(|_| random_op(&mut rng)).collect();
        // Rows come back key by key, each key's in order.
        let expected = one_by_one.batch(&ops);
        assert_eq!(expected.len(), ops.len());
        assert_eq!(held.batch(&ops), expected, "batch {batch}");
        // The operations reached state and refused what they should.
        let results: Vec<Value> = expected
            .iter()
            .map(|row| serde_json::from_str(row["result"].as_str().unwrap()).unwrap())
            .collect();
        assert!(
            results.iter().any(|r| r["err"] == "EmptyList"),
            "batch {batch}"
        );
        assert!(
            results
                .iter()
                .any(|r| r["ok"].as_array().is_some_and(|a| a.len() > 2)),
            "batch {batch}: {results:?}"
        );
    }
    let reads: Vec<Value> = ["a", "b", "c", "d", "e"]
        .iter()
        .flat_map(|k| {
            ["value-get", "list-get", "map-iter", "record-get"].map(|name| op(k, name, json!({})))
        })
        .collect();
    assert_eq!(held.batch(&reads), one_by_one.batch(&reads));
}

/// Timer registrations and deletions held back and sent together give every timer listing
/// the result it gets when each crosses into the host at once, in the batch and after a
/// restart. The timers lie far in the future, so none fires.
#[test]
fn held_timers_give_the_results_of_timers_set_one_by_one() {
    let mut one_by_one =
        EngineQuery::open_in_time_mode(guests::STATE_OPS, "k", TimeMode::ProcessingTime);
    let mut held =
        EngineQuery::open_in_time_mode(guests::STATE_OPS_HELD, "k", TimeMode::ProcessingTime);
    let mut rng = Rng::new(16);
    let mut timers_listed = 0;
    for batch in 0..6 {
        if batch == 4 {
            one_by_one.reopen();
            held.reopen();
        }
        let ops: Vec<Value> = (0..300)
            .map(|_| match rng.below(3) {
                0 => random_timer_op(&mut rng),
                _ => random_op(&mut rng),
            })
            .collect();
        let expected = one_by_one.batch(&ops);
        assert_eq!(held.batch(&ops), expected, "batch {batch}");
        // Some listings found timers: `{"ok":[…]}` with at least one.
        timers_listed += expected
            .iter()
            .filter(|row| row["op"] == "timer-list" && row["result"] != r#"{"ok":[]}"#)
            .count();
    }
    assert!(timers_listed > 10, "{timers_listed}");
}

/// A random timer operation of the state-ops guest, at one of four times in 2096 (which no
/// batch reaches), on one of a few keys.
fn random_timer_op(rng: &mut Rng) -> Value {
    const LATER: i64 = 4_000_000_000_000;
    let k = random_key(rng);
    let at = LATER + rng.below(4) as i64;
    match rng.below(5) {
        0..=1 => op(k, "timer-register", json!({ "v": at })),
        2..=3 => op(k, "timer-delete", json!({ "v": at })),
        _ => op(k, "timer-list", json!({})),
    }
}

/// A held write the host refuses fails its batch, naming the key it was made for, although
/// the guest's update returned `Ok`; nothing of the batch is kept.
#[test]
fn a_refused_held_write_fails_the_batch_naming_its_key() {
    let mut q = EngineQuery::open(guests::STATE_OPS_HELD, "k", 1, Default::default());
    run(&mut q, &[op("a", "value-update", json!({"v": 1}))]);
    let err = q
        .try_batch(&[
            op("a", "value-update", json!({"v": 2})),
            op("b", "map-update", json!({"mk": "p", "v": 3})),
            // No `v`: null, which a list refuses.
            op("b", "list-append", json!({})),
            op("c", "value-update", json!({"v": 4})),
        ])
        .unwrap_err()
        .to_string();
    for fragment in ["\"b\"", "null"] {
        assert!(err.contains(fragment), "`{fragment}` missing from: {err}");
    }
    // The failed file is read again by the next run: it now holds reads only.
    let reads = [
        op("a", "value-get", json!({})),
        op("b", "map-get", json!({"mk": "p"})),
        op("c", "value-get", json!({})),
    ];
    q.rewrite_last(&reads);
    let (_, rows) = q.run_available().unwrap();
    let r: Vec<Value> = rows
        .iter()
        .map(|row| serde_json::from_str(row["result"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(r, [ok(json!(1)), ok(Value::Null), ok(Value::Null)]);
}
