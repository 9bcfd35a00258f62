//! Unit tests of the table functions' options and columns.

use serde_json::json;

use super::*;

/// A checkpoint's metadata as the reader gives it.
fn sample_metadata() -> Value {
    json!({
        "operator_id": 0, "operator_name": "op", "num_partitions": 4,
        "min_batch_id": 0, "max_batch_id": 2, "time_mode": "processing-time",
        "output_mode": "update", "key_columns": ["user"],
        "variables": [
            {"name": "count", "id": 0, "kind": "value", "ttl_enabled": false,
             "ttl_duration_ms": null, "key_schema": null, "value_schema": "BIGINT",
             "schema_id": 0, "value_schema_history": ["BIGINT"]},
            {"name": "seen", "id": 1, "kind": "map", "ttl_enabled": true,
             "ttl_duration_ms": 500, "key_schema": "STRING", "value_schema": "BIGINT",
             "schema_id": 1, "value_schema_history": ["INT", "BIGINT"]},
        ],
    })
}

fn lit(v: ScalarValue) -> Expr {
    Expr::Literal(v, None)
}

fn s(v: &str) -> Expr {
    lit(ScalarValue::Utf8(Some(v.into())))
}

fn parse(args: &[(&str, Expr)]) -> Result<StateStoreOptions, String> {
    let pairs: Vec<(String, &Expr)> = args.iter().map(|(n, v)| (n.to_string(), v)).collect();
    StateStoreOptions::parse(&pairs)
}

fn read(args: &[(&str, Expr)]) -> Result<Read, String> {
    parse(args)?.read("state variables: `a`")
}

#[test]
fn options_are_matched_case_insensitively_and_typed() {
    let got = read(&[
        ("STATEVARNAME", s("count")),
        ("batchid", lit(ScalarValue::Int64(Some(3)))),
        (
            "FlattenCollectionTypes",
            lit(ScalarValue::Boolean(Some(false))),
        ),
    ])
    .unwrap();
    assert_eq!(
        got,
        Read::State {
            var: "count".into(),
            flatten: false,
            at_batch: Some(3)
        }
    );
    // Spark's options are strings: those work too.
    let got = read(&[
        ("stateVarName", s("c")),
        ("readChangeFeed", s("TRUE")),
        ("changeStartBatchId", s("2")),
        ("changeEndBatchId", lit(ScalarValue::Int32(Some(4)))),
    ])
    .unwrap();
    assert_eq!(
        got,
        Read::Changes {
            var: "c".into(),
            from: 2,
            to: Some(4)
        }
    );
    assert_eq!(
        read(&[(
            "readRegisteredTimers",
            lit(ScalarValue::Boolean(Some(true)))
        )])
        .unwrap(),
        Read::Timers { at_batch: None }
    );
}

#[test]
fn bad_options_are_named() {
    let err = |args: &[(&str, Expr)]| read(args).unwrap_err();
    assert!(
        err(&[("stateVarName", s("a")), ("batch", s("1"))]).starts_with(
            "read_statestore: unknown option `batch` (options: stateVarName, batchId,"
        ),
    );
    assert_eq!(
        err(&[("stateVarName", s("a")), ("batchId", s("x"))]),
        "read_statestore: option `batchId` must be a non-negative integer, found 'x'"
    );
    assert_eq!(
        err(&[
            ("stateVarName", s("a")),
            ("batchId", lit(ScalarValue::Int64(Some(-1))))
        ]),
        "read_statestore: option `batchId` must be a non-negative integer, found -1"
    );
    assert_eq!(
        err(&[("stateVarName", lit(ScalarValue::Int64(Some(1))))]),
        "read_statestore: option `stateVarName` must be a string literal, found 1"
    );
    assert_eq!(
        err(&[
            ("stateVarName", s("a")),
            ("flattenCollectionTypes", s("no"))
        ]),
        "read_statestore: option `flattenCollectionTypes` must be true or false, found 'no'"
    );
    assert_eq!(
        err(&[("stateVarName", s("a")), ("STATEVARNAME", s("b"))]),
        "read_statestore: option `stateVarName` is given twice"
    );
    assert_eq!(
        err(&[("batchId", s("1"))]),
        "read_statestore: option `stateVarName` is missing: name the state variable to \
         read (state variables: `a`), or pass readRegisteredTimers => true"
    );
}

#[test]
fn conflicting_options_are_refused() {
    let t = || lit(ScalarValue::Boolean(Some(true)));
    let err = |args: &[(&str, Expr)]| read(args).unwrap_err();
    assert!(
        err(&[("readRegisteredTimers", t()), ("stateVarName", s("a"))])
            .contains("cannot be combined with `stateVarName`")
    );
    assert!(
        err(&[("stateVarName", s("a")), ("changeStartBatchId", s("1"))])
            .contains("option `changeStartBatchId` needs readChangeFeed => true")
    );
    assert!(
        err(&[("stateVarName", s("a")), ("readChangeFeed", t())])
            .contains("readChangeFeed => true needs changeStartBatchId => N")
    );
    assert!(
        err(&[
            ("stateVarName", s("a")),
            ("readChangeFeed", t()),
            ("changeStartBatchId", s("1")),
            ("batchId", s("1")),
        ])
        .contains("cannot be combined with `batchId`")
    );
    assert!(
        err(&[("stateVarName", s("a")), ("operatorId", s("1"))]).contains("there is no operator 1")
    );
    assert_eq!(
        read(&[("stateVarName", s("a")), ("operatorId", s("0"))]).unwrap(),
        Read::State {
            var: "a".into(),
            flatten: true,
            at_batch: None
        }
    );
}

#[test]
fn metadata_has_one_row_per_variable() {
    let rows = metadata_rows(&sample_metadata());
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["state_var_name"], "seen");
    assert_eq!(rows[1]["user_map_key_schema"], "STRING");
    assert_eq!(rows[1]["operator_name"], "op");
    assert_eq!(rows[1]["value_schema_history"], json!(["INT", "BIGINT"]));
    let columns = metadata_columns();
    let schema = schema_of(&columns);
    let mut batcher = RowBatcher::new(schema, &columns);
    for row in &rows {
        assert!(batcher.push(row).unwrap().is_none());
    }
    let batch = batcher.finish().unwrap();
    assert_eq!((batch.num_rows(), batch.num_columns()), (2, 17));
}
