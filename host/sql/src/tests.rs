//! Unit tests of the JSON → Arrow conversion and of the printed formats. The table
//! functions over real checkpoints are tested end to end in `tests/all/sql.rs`.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{Field, Schema as ArrowSchema};
use serde_json::{Value, json};
use statebox_schema::Schema;

use crate::convert::RowBatcher;
use crate::output::{OutputFormat, Printer, write_json};
use crate::types::ColumnType;

fn spark(ddl: &str) -> ColumnType {
    ColumnType::from_spark(Schema::parse_ddl(ddl).unwrap().root())
}

/// Builds one batch of `rows` with `columns`.
fn batch(columns: &[(&str, ColumnType)], rows: &[Value]) -> RecordBatch {
    let columns: Vec<(String, ColumnType)> = columns
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let schema = Arc::new(ArrowSchema::new(
        columns
            .iter()
            .map(|(n, t)| Field::new(n, t.arrow_type(), true))
            .collect::<Vec<_>>(),
    ));
    let mut batcher = RowBatcher::new(schema, &columns);
    for row in rows {
        assert!(batcher.push(row).unwrap().is_none());
    }
    batcher.finish().unwrap()
}

/// The batch's rows back as JSON.
fn rows_of(batch: &RecordBatch) -> Vec<Value> {
    (0..batch.num_rows())
        .map(|row| {
            let mut object = serde_json::Map::new();
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                let mut text = Vec::new();
                write_json(&mut text, column.as_ref(), row).unwrap();
                object.insert(field.name().clone(), serde_json::from_slice(&text).unwrap());
            }
            Value::Object(object)
        })
        .collect()
}

fn print(format: OutputFormat, batch: &RecordBatch) -> String {
    let mut out = Vec::new();
    let mut printer = Printer::new(format, batch.schema());
    printer.batch(&mut out, batch.clone()).unwrap();
    printer.finish(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn every_spark_type_converts_and_prints_back_as_the_same_json() {
    let ty = spark(
        "b boolean, i int, l long, f float, d double, s string, bin binary, ts timestamp, \
         day date, tags array<string>, attrs map<string, long>, byid map<int, string>, \
         nested struct<city: string, zip: int>",
    );
    let full = json!({"v": {
        "b": true, "i": -7, "l": 9_007_199_254_740_993_i64, "f": 1.5, "d": 0.25, "s": "x",
        "bin": "aGk=", "ts": 1_700_000_000_123_i64, "day": "2024-02-29",
        "tags": ["a", null], "attrs": {"k": 1, "n": null}, "byid": {"2": "two", "10": "ten"},
        "nested": {"city": "Oslo", "zip": 150},
    }});
    let sparse = json!({"v": {"s": "only"}});
    let b = batch(&[("v", ty)], &[full, sparse, json!({"v": null})]);
    let back = rows_of(&b);
    assert_eq!(
        back[0],
        json!({"v": {
            "b": true, "i": -7, "l": 9_007_199_254_740_993_i64, "f": 1.5, "d": 0.25, "s": "x",
            "bin": "aGk=", "ts": "2023-11-14T22:13:20.123Z", "day": "2024-02-29",
            "tags": ["a", null], "attrs": {"k": 1, "n": null}, "byid": {"2": "two", "10": "ten"},
            "nested": {"city": "Oslo", "zip": 150},
        }})
    );
    // Absent fields are null; a null value is a null struct.
    assert_eq!(back[1]["v"]["s"], "only");
    assert_eq!(back[1]["v"]["tags"], Value::Null);
    assert_eq!(back[2], json!({"v": null}));
}

#[test]
fn timestamps_read_both_stored_forms_and_map_keys_their_text() {
    let b = batch(
        &[
            ("ts", ColumnType::Timestamp),
            ("m", spark("map<struct<name: string>, long>")),
            ("k", ColumnType::Json),
        ],
        &[
            json!({"ts": "2024-01-01T00:00:00+01:00", "m": {"{\"name\":\"calls\"}": 2},
                   "k": ["a", 1]}),
            json!({"ts": 0, "m": {}, "k": "a"}),
        ],
    );
    assert_eq!(
        rows_of(&b),
        [
            json!({"ts": "2023-12-31T23:00:00Z", "m": {"{\"name\":\"calls\"}": 2},
                   "k": "[\"a\",1]"}),
            json!({"ts": "1970-01-01T00:00:00Z", "m": {}, "k": "\"a\""}),
        ]
    );
}

#[test]
fn a_value_of_the_wrong_type_names_its_column() {
    let columns = vec![("value".to_owned(), spark("visits int, tags array<long>"))];
    let schema = Arc::new(ArrowSchema::new(vec![Field::new(
        "value",
        columns[0].1.arrow_type(),
        true,
    )]));
    let mut batcher = RowBatcher::new(schema, &columns);
    let err = batcher
        .push(&json!({"value": {"visits": 1, "tags": [1, "x"]}}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "column `value.tags[1]`: expected long, found \"x\""
    );
    let err = batcher
        .push(&json!({"value": {"visits": 3_000_000_000_i64}}))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "column `value.visits`: expected int, found 3000000000"
    );
}

#[test]
fn results_print_as_table_jsonl_and_csv() {
    let b = batch(
        &[
            (
                "key",
                ColumnType::Struct(vec![("u".into(), ColumnType::String)]),
            ),
            ("value", ColumnType::String),
            ("partition_id", ColumnType::Int),
        ],
        &[
            json!({"key": {"u": "a,b"}, "value": "say \"hi\"", "partition_id": 0}),
            json!({"key": {"u": "c"}, "value": null, "partition_id": 12}),
        ],
    );
    assert_eq!(
        print(OutputFormat::Csv, &b),
        "key,value,partition_id\n\
         \"{\"\"u\"\":\"\"a,b\"\"}\",\"say \"\"hi\"\"\",0\n\
         \"{\"\"u\"\":\"\"c\"\"}\",,12\n"
    );
    assert_eq!(
        print(OutputFormat::Jsonl, &b),
        "{\"key\":{\"u\":\"a,b\"},\"value\":\"say \\\"hi\\\"\",\"partition_id\":0}\n\
         {\"key\":{\"u\":\"c\"},\"value\":null,\"partition_id\":12}\n"
    );
    let table = print(OutputFormat::Table, &b);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 6, "{table}");
    assert!(lines[1].contains("| key"), "{table}");
    assert!(lines[3].contains("{u: a,b}"), "{table}");

    // An empty result still shows its columns.
    let empty = b.slice(0, 0);
    assert_eq!(print(OutputFormat::Csv, &empty), "key,value,partition_id\n");
    assert_eq!(print(OutputFormat::Jsonl, &empty), "");
    assert!(print(OutputFormat::Table, &empty).contains("partition_id"));
}
