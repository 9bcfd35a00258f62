//! Tests of the public API: DDL, validation, canonical encoding, row scanning, evolution.
//! (Long because it is one table-like list of cases per Spark type and rule.)

use crate::*;

fn schema(ddl: &str) -> Schema {
    Schema::parse_ddl(ddl).unwrap_or_else(|e| panic!("{e}"))
}

fn field(name: &str, data_type: DataType) -> Field {
    Field::new(name, data_type, true)
}

fn strukt(fields: Vec<Field>) -> DataType {
    DataType::Struct(StructType::new(fields))
}

fn ok(ddl: &str, json: &str) {
    if let Err(e) = schema(ddl).validate(json, Strictness::Strict) {
        panic!("{ddl} should accept {json}: {e}");
    }
}

/// Validates strictly and returns the error's Display text.
fn err(ddl: &str, json: &str) -> String {
    match schema(ddl).validate(json, Strictness::Strict) {
        Ok(()) => panic!("{ddl} should reject {json}"),
        Err(e) => e.to_string(),
    }
}

fn canon(ddl: &str, json: &str) -> String {
    schema(ddl)
        .canonicalize(json)
        .unwrap_or_else(|e| panic!("{ddl} / {json}: {e}"))
}

// ---------------------------------------------------------------------------------------
// DDL

#[test]
fn ddl_field_list_is_a_struct() {
    let s = schema("name string, visits int");
    assert!(s.is_struct());
    assert_eq!(
        s.root(),
        &strukt(vec![
            field("name", DataType::String),
            field("visits", DataType::Int)
        ])
    );
}

#[test]
fn ddl_single_types() {
    assert_eq!(schema("long").root(), &DataType::Long);
    assert_eq!(schema("  LONG ").root(), &DataType::Long);
    assert_eq!(
        schema("array<string>").root(),
        &DataType::array(DataType::String)
    );
    assert_eq!(
        schema("map<string,long>").root(),
        &DataType::map(DataType::String, DataType::Long)
    );
    assert_eq!(
        schema("struct<a: int, b: string>").root(),
        &strukt(vec![
            field("a", DataType::Int),
            field("b", DataType::String)
        ])
    );
    assert_eq!(
        schema("STRUCT < a INT >").root(),
        &strukt(vec![field("a", DataType::Int)])
    );
    assert_eq!(schema("struct<>").root(), &strukt(vec![]));
    assert!(!schema("long").is_struct());
}

#[test]
fn ddl_aliases_and_case() {
    let cases = [
        ("bool", DataType::Boolean),
        ("Boolean", DataType::Boolean),
        ("integer", DataType::Int),
        ("smallint", DataType::Int),
        ("short", DataType::Int),
        ("tinyint", DataType::Int),
        ("byte", DataType::Int),
        ("BIGINT", DataType::Long),
        ("real", DataType::Float),
        ("double", DataType::Double),
        ("varchar(10)", DataType::String),
        ("char ( 3 )", DataType::String),
        ("binary", DataType::Binary),
        ("timestamp", DataType::Timestamp),
        ("timestamp_ntz", DataType::Timestamp),
        ("TIMESTAMP_LTZ", DataType::Timestamp),
        ("date", DataType::Date),
    ];
    for (ddl, ty) in cases {
        assert_eq!(schema(ddl).root(), &ty, "{ddl}");
        assert_eq!(
            schema(&format!("x {ddl}")).root(),
            &strukt(vec![field("x", ty)]),
            "{ddl}"
        );
    }
}

#[test]
fn ddl_names_modifiers_and_nesting() {
    let s = schema(
        "`first name` STRING NOT NULL COMMENT 'the user''s name', \
         `we``ird` int comment \"x, y\", \
         Address struct<street: string, zip int not null, geo: struct<lat: double, lon: double>>, \
         tags array<array<string NOT NULL>> Not Null, \
         m map<int, map<string, struct<a: long>> NOT NULL>, \
         `array` array<int>",
    );
    let geo = strukt(vec![
        field("lat", DataType::Double),
        field("lon", DataType::Double),
    ]);
    let expected = strukt(vec![
        Field::new("first name", DataType::String, false),
        field("we`ird", DataType::Int),
        field(
            "Address",
            strukt(vec![
                field("street", DataType::String),
                Field::new("zip", DataType::Int, false),
                field("geo", geo),
            ]),
        ),
        Field::new(
            "tags",
            DataType::array(DataType::Array {
                element: Box::new(DataType::String),
                contains_null: false,
            }),
            false,
        ),
        // The NOT NULL belongs to the outer map's values (the inner maps).
        field(
            "m",
            DataType::Map {
                key: Box::new(DataType::Int),
                value: Box::new(DataType::map(
                    DataType::String,
                    strukt(vec![field("a", DataType::Long)]),
                )),
                value_contains_null: false,
            },
        ),
        field("array", DataType::array(DataType::Int)),
    ]);
    assert_eq!(s.root(), &expected);
}

#[test]
fn ddl_comment_quotes_and_escapes() {
    let s = schema(r"a int COMMENT 'it\'s, > fine', b string COMMENT 'isn''t', c int");
    assert_eq!(s.as_struct().map(|st| st.fields.len()), Some(3));
    let s = schema(r"a int COMMENT 'it\'s, > fine', b string");
    assert_eq!(s.as_struct().map(|st| st.fields.len()), Some(2));
}

#[test]
fn ddl_field_names_that_look_like_types() {
    let s = schema("long long, string string, struct int");
    let names: Vec<&str> = s
        .as_struct()
        .unwrap()
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["long", "string", "struct"]);
}

#[test]
fn ddl_errors_name_position_and_expectation() {
    let cases = [
        ("", 0, "empty"),
        ("   ", 3, "empty"),
        ("name strng", 5, "unknown type `strng`"),
        (
            "name string, visits",
            19,
            "expected a type name, found the end",
        ),
        ("a int,", 6, "expected a field name"),
        ("a int b int", 6, "expected `,` or the end"),
        ("a int, a long", 7, "duplicate field name `a`"),
        ("array<int", 9, "expected `>` to close `array<`"),
        ("array<>", 6, "expected a type name, found `>`"),
        (
            "map<string>",
            10,
            "expected `,` between the key and value types",
        ),
        ("struct<a int b int>", 13, "expected `,` or `>`"),
        ("a decimal(10,2)", 2, "`decimal` is not supported"),
        ("a int NOT", 9, "expected NULL after NOT"),
        ("a int NOT nul", 10, "expected NULL after NOT, found `nul`"),
        ("`a int", 0, "unterminated backquoted name"),
        ("`` int", 0, "may not be empty"),
        ("a int COMMENT", 13, "expected a quoted comment"),
        ("a int COMMENT 'x", 14, "unterminated comment"),
        ("varchar", 7, "expected `(`"),
        ("long extra", 5, "unknown type `extra`"),
        ("array<int> x", 11, "expected the end of the schema"),
        ("ä int", 0, "expected a field name, found `ä`"),
        ("`ä` strng", 4, "unknown type `strng`"),
    ];
    for (ddl, position, needle) in cases {
        let e = Schema::parse_ddl(ddl).expect_err(ddl);
        assert_eq!(e.position, position, "{ddl}: {e}");
        assert!(e.message.contains(needle), "{ddl}: {e}");
        assert!(
            e.to_string()
                .contains(&format!("at column {}", position + 1)),
            "{e}"
        );
    }
}

#[test]
fn ddl_nesting_is_bounded() {
    let deep = format!("{}int{}", "array<".repeat(100), ">".repeat(100));
    let e = Schema::parse_ddl(&deep).unwrap_err();
    assert!(e.message.contains("nest"), "{e}");
    let fine = format!("{}int{}", "array<".repeat(30), ">".repeat(30));
    schema(&fine);
}

#[test]
fn ddl_round_trips() {
    for ddl in [
        "name string, visits int",
        "long",
        "array<string>",
        "map<string, long>",
        "struct<>",
        "struct<a: int, b: string>",
        "a boolean NOT NULL, b long, c float, d double, e binary, f timestamp, g date",
        "`first name` string, `we``ird` int, `1st` int, `a.b` struct<`c d`: int NOT NULL>",
        "tags array<string NOT NULL>, m map<int, array<struct<x: double>> NOT NULL>",
        "long long, map map<string, string>",
        "array<map<string, struct<a: array<int>>>>",
    ] {
        let s = schema(ddl);
        let again = schema(&s.to_ddl());
        assert_eq!(again, s, "{ddl} -> {}", s.to_ddl());
    }
    assert_eq!(
        schema("Name STRING not null, VISITS integer").to_ddl(),
        "Name string NOT NULL, VISITS int"
    );
    assert_eq!(schema("struct<a int>").to_ddl(), "a int");
    assert_eq!(
        schema("map<string,array<int>>").to_ddl(),
        "map<string, array<int>>"
    );
    assert_eq!(Schema::new(strukt(vec![])).to_ddl(), "struct<>");
}

#[test]
fn schema_serde_is_ddl_text() {
    let s = schema("a int, b array<string>");
    let json = serde_json::to_string(&s).unwrap();
    assert_eq!(json, r#""a int, b array<string>""#);
    let back: Schema = serde_json::from_str(&json).unwrap();
    assert_eq!(back, s);
    assert!(serde_json::from_str::<Schema>(r#""a nope""#).is_err());
    assert_eq!("long".parse::<Schema>().unwrap().root(), &DataType::Long);
}

// ---------------------------------------------------------------------------------------
// Validation

#[test]
fn validate_scalars() {
    ok("boolean", "true");
    ok("boolean", " false ");
    ok("int", "0");
    ok("int", "-2147483648");
    ok("int", "2147483647");
    ok("long", "-9223372036854775808");
    ok("long", "9223372036854775807");
    ok("float", "1");
    ok("float", "1.5e10");
    ok("float", "-3.4028235e38");
    ok("double", "12");
    ok("double", "1e308");
    ok("double", "-0.0");
    ok("string", r#""""#);
    ok("string", r#""h\u00e9llo \"x\"""#);
    ok("binary", r#""aGVsbG8=""#);
    ok("binary", r#""""#);
    ok("timestamp", "1704067200000");
    ok("timestamp", "-1");
    ok("timestamp", r#""2024-01-01T00:00:00Z""#);
    ok("timestamp", r#""2024-01-01T00:00:00.123+02:00""#);
    ok("date", r#""2024-02-29""#);
}

#[test]
fn plain_integers_skip_the_parser_only_where_it_would_accept_them() {
    use crate::value::{plain_integer_fits, run};
    let texts = [
        "0",
        "5",
        "-5",
        "42",
        "-0",
        "05",
        "-05",
        "+5",
        " 5",
        "5 ",
        "",
        "-",
        "--5",
        "5-",
        "1e3",
        "1.0",
        "5a",
        "0x10",
        "\"5\"",
        "null",
        "2147483647",
        "2147483648",
        "-2147483648",
        "-2147483649",
        "123456789012345678",
        "-123456789012345678",
        "999999999999999999",
        "1234567890123456789",
        "9223372036854775807",
        "-9223372036854775808",
        "9223372036854775808",
        "\u{0660}",
    ];
    for ddl in [
        "int",
        "long",
        "timestamp",
        "double",
        "float",
        "string",
        "boolean",
    ] {
        let s = schema(ddl);
        for text in texts {
            let full = run(s.root(), text, Strictness::Strict, None);
            if plain_integer_fits(s.root(), text.as_bytes()) {
                assert!(
                    full.is_ok(),
                    "{ddl} / {text:?}: fast path accepts, full pass: {full:?}"
                );
            }
            assert_eq!(
                s.validate(text, Strictness::Strict),
                full,
                "{ddl} / {text:?}"
            );
        }
    }
    // It does take the writes it is for: integers within 18 digits, within the type's range.
    let (int, long) = (schema("int"), schema("long"));
    for text in ["0", "5", "-5", "2147483647", "-2147483648"] {
        assert!(
            plain_integer_fits(int.root(), text.as_bytes()),
            "int / {text}"
        );
    }
    for text in ["7", "-123456789012345678", "999999999999999999"] {
        assert!(
            plain_integer_fits(long.root(), text.as_bytes()),
            "long / {text}"
        );
    }
    for text in ["2147483648", "-2147483649", "-0", "05", "5 "] {
        assert!(
            !plain_integer_fits(int.root(), text.as_bytes()),
            "int / {text}"
        );
    }
    assert!(!plain_integer_fits(schema("double").root(), b"5"));
}

#[test]
fn plain_objects_skip_the_parser_only_where_it_would_accept_them() {
    use crate::value::{plain_fits, run};
    let schemas = [
        "key string, count long",
        "count long",
        "a int NOT NULL, b boolean, c string NOT NULL, d timestamp",
        "x double, y string, z long NOT NULL",
        "d date, b binary, s string",
        "m map<string, long>, n long",
    ];
    let names = [
        "key",
        "count",
        "a",
        "b",
        "c",
        "d",
        "x",
        "y",
        "z",
        "s",
        "m",
        "n",
        "zz",
        r"k\u0065y",
        "Count",
        "",
    ];
    let values = [
        "5",
        "-7",
        "0",
        "-0",
        "05",
        "2147483648",
        "-2147483649",
        "9223372036854775807",
        "99999999999999999999",
        "1.5",
        "1e3",
        r#""s""#,
        r#""a\"b""#,
        "\"tab\there\"",
        r#""é""#,
        r#""""#,
        "true",
        "false",
        "null",
        "{}",
        "[1,2]",
        r#"{"n":1}"#,
        r#""2024-01-01""#,
        r#""aGVsbG8=""#,
        r#""5""#,
        "tru",
        "nul",
        r#""bad\x""#,
        r#""a\\""#,
        r#""\ud800""#,
    ];
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut fast = 0;
    for round in 0..30_000 {
        let ddl = schemas[round % schemas.len()];
        let s = schema(ddl);
        let members = next(5);
        let mut text = String::from(["{", "{", "{", "{", " {", "["][next(6)]);
        for m in 0..members {
            if m > 0 {
                text.push_str([",", ",", ",", ",", ",", ", ", " ,", ",,"][next(8)]);
            }
            // Mostly the schema's own names with values of their types, so that many texts
            // are valid objects.
            let fields = &s.as_struct().expect("a struct").fields;
            let field = (next(4) > 0).then(|| &fields[next(fields.len())]);
            let name = field.map_or(names[next(names.len())], |f| f.name.as_str());
            let colon = [":", ":", ":", ":", " :", ": "][next(6)];
            text.push_str(&format!("\"{name}\"{colon}"));
            let typed = match field.map(|f| &f.data_type) {
                Some(DataType::String) => [r#""s""#, r#""é""#, r#""""#][next(3)],
                Some(DataType::Int | DataType::Long | DataType::Timestamp) => {
                    ["5", "-7", "0", "2147483648"][next(4)]
                }
                Some(DataType::Boolean) => ["true", "false"][next(2)],
                _ => "null",
            };
            text.push_str(if next(3) > 0 {
                typed
            } else {
                values[next(values.len())]
            });
        }
        text.push_str(["}", "}", "}", "}", "} ", "}}", ""][next(7)]);
        let full = run(s.root(), &text, Strictness::Strict, None);
        if plain_fits(s.root(), &text) {
            fast += 1;
            assert!(
                full.is_ok(),
                "{ddl} / {text}: fast path accepts, full pass: {full:?}"
            );
        }
        assert_eq!(
            s.validate(&text, Strictness::Strict),
            full,
            "{ddl} / {text}"
        );
    }
    assert!(fast > 500, "only {fast} texts took the fast path");
    // The rows and values it is for.
    for (ddl, text) in [
        ("key string, count long", r#"{"key":"k123","count":5}"#),
        ("key string, count long", r#"{"count":-5,"key":"é"}"#),
        ("key string, count long", r#"{"key":null}"#),
        ("count long", r#"{"count":7}"#),
        ("a int NOT NULL, b boolean", r#"{"b":true,"a":2147483647}"#),
    ] {
        assert!(plain_fits(schema(ddl).root(), text), "{ddl} / {text}");
    }
    for (ddl, text) in [
        ("key string, count long", r#"{"key":"k","key":"k"}"#),
        ("a int NOT NULL, b boolean", r#"{"b":true}"#),
        ("a int NOT NULL", r#"{"a":null}"#),
        ("count long", r#"{"count":7,"other":1}"#),
        ("count long", r#"{"count":7} "#),
        ("count long", r#"{"count":"7"}"#),
        ("key string, count long", "[]"),
    ] {
        assert!(!plain_fits(schema(ddl).root(), text), "{ddl} / {text}");
    }
    // A member name is compared as written: with an escape, it is not the field's name.
    let quoted = Schema::new(strukt(vec![field(r#"a\"b"#, DataType::Long)]));
    assert!(!plain_fits(quoted.root(), r#"{"a\"b":1}"#));
    assert!(
        quoted
            .validate(r#"{"a\"b":1}"#, Strictness::Strict)
            .is_err()
    );
}

#[test]
fn validate_scalar_rejections() {
    let cases = [
        (
            "int",
            "2147483648",
            "expected int, found number 2147483648: out of range",
        ),
        ("int", "-2147483649", "out of range"),
        (
            "int",
            "1.5",
            "expected int, found number 1.5: not an integer",
        ),
        ("long", "9223372036854775808", "out of range"),
        ("long", "-9223372036854775809", "out of range"),
        ("long", "18446744073709551616", "out of range"),
        ("long", "1.5", "not an integer"),
        (
            "long",
            "1.0",
            "found number 1.0: integers must be written without a decimal point",
        ),
        ("long", "1e3", "without a decimal point or exponent"),
        ("long", r#""5""#, r#"expected long, found string "5""#),
        ("long", "true", "expected long, found true"),
        ("float", "1e39", "out of range for float"),
        ("double", r#""1.5""#, "expected double, found string"),
        ("boolean", "1", "expected boolean, found number 1"),
        ("string", "5", "expected string, found number 5"),
        ("string", "[]", "expected string, found an array"),
        ("string", "{}", "expected string, found an object"),
        ("binary", r#""aGVsbG8""#, "padded"),
        ("binary", r#""aGVs*G8=""#, "may only hold"),
        ("binary", r#""aGVsbG9=""#, "non-zero padding bits"),
        (
            "binary",
            "12",
            "expected binary (a base64 string), found number 12",
        ),
        ("timestamp", "1.5", "not an integer"),
        ("timestamp", r#""2024-13-01T00:00:00Z""#, "ISO-8601"),
        (
            "timestamp",
            r#""2024-01-01T25:00:00Z""#,
            "time of day is out of range",
        ),
        ("timestamp", r#""tomorrow""#, r#"found string "tomorrow""#),
        ("timestamp", "true", "expected timestamp"),
        ("date", r#""2023-02-29""#, "day does not exist"),
        ("date", r#""2024-1-1""#, "YYYY-MM-DD"),
        ("date", r#""2024-01-01T00:00:00Z""#, "YYYY-MM-DD"),
        ("date", "20240101", "expected date"),
    ];
    for (ddl, json, needle) in cases {
        let e = err(ddl, json);
        assert!(e.contains(needle), "{ddl} / {json}: {e}");
    }
}

#[test]
fn validate_top_level_null_is_refused() {
    assert!(err("long", "null").contains("may not be null"));
    assert!(err("a int", "null").contains("may not be null"));
    assert!(err("array<int>", "null").contains("may not be null"));
}

#[test]
fn validate_struct_requires_object() {
    let e = err("name string, visits int", r#"["a", 1]"#);
    assert_eq!(e, "expected struct (a JSON object), found an array");
    assert!(err("a int", "5").contains("found number 5"));
}

#[test]
fn validate_struct_fields() {
    let ddl = "name string, visits int NOT NULL";
    ok(ddl, r#"{"name":"a","visits":1}"#);
    ok(ddl, r#"{"visits":1,"name":"a"}"#);
    ok(ddl, r#"{"visits":1}"#);
    ok(ddl, r#"{"name":null,"visits":1}"#);
    ok(ddl, r#" { "name" : "a" , "visits" : 1 } "#);
    assert_eq!(
        err(ddl, r#"{"name":"a","visits":"x"}"#),
        r#"column `visits`: expected int, found string "x""#
    );
    assert_eq!(
        err(ddl, r#"{"name":"a"}"#),
        "column `visits`: the field is NOT NULL but missing"
    );
    assert_eq!(
        err(ddl, r#"{"visits":null}"#),
        "column `visits`: expected int, found null: the field is NOT NULL"
    );
    assert_eq!(
        err(ddl, r#"{"visits":1,"extra":2}"#),
        "column `extra`: the field is not in the schema (fields: name, visits)"
    );
    assert_eq!(
        err(ddl, r#"{"visits":1,"visits":2}"#),
        "column `visits`: the field appears more than once"
    );
    // Field names are case-sensitive.
    assert!(
        err(ddl, r#"{"Visits":1}"#).contains("column `Visits`: the field is not in the schema")
    );
    // Escaped member names are matched after unescaping.
    ok(ddl, r#"{"vi\u0073its":1}"#);
}

#[test]
fn validate_ignores_unknown_fields_when_asked() {
    let s = schema("a int, b struct<c: int>");
    let json = r#"{"a":1,"x":{"deep":[1,{"y":null}]},"b":{"c":2,"z":"q"}}"#;
    assert!(s.validate(json, Strictness::Strict).is_err());
    s.validate(json, Strictness::IgnoreUnknownFields).unwrap();
    // Ignored members must still be well-formed JSON.
    let e = s
        .validate(r#"{"a":1,"x":[1,}"#, Strictness::IgnoreUnknownFields)
        .unwrap_err();
    assert!(e.message.starts_with("malformed JSON"), "{e}");
    // Ignoring unknown fields does not relax the known ones.
    let e = s
        .validate(r#"{"a":"1"}"#, Strictness::IgnoreUnknownFields)
        .unwrap_err();
    assert_eq!(e.path, "a");
}

#[test]
fn validate_error_paths() {
    let ddl = "name string, address struct<city: string, zip: int>, tags array<string NOT NULL>, \
               scores map<string, array<int>>, grid array<array<int>>";
    let cases = [
        (
            r#"{"address":{"city":"x","zip":"10115"}}"#,
            "address.zip",
            "expected int, found string \"10115\"",
        ),
        (
            r#"{"tags":["a","b","c",null]}"#,
            "tags[3]",
            "expected string, found null: array elements may not be null",
        ),
        (
            r#"{"tags":["a",5]}"#,
            "tags[1]",
            "expected string, found number 5",
        ),
        (
            r#"{"scores":{"math":[1,2,"3"]}}"#,
            "scores['math'][2]",
            "expected int",
        ),
        (
            r#"{"grid":[[1],[2,[3]]]}"#,
            "grid[1][1]",
            "expected int, found an array",
        ),
        (
            r#"{"address":{"city":"x","country":"y"}}"#,
            "address.country",
            "not in the schema",
        ),
        (
            r#"{"address":[1]}"#,
            "address",
            "expected struct (a JSON object), found an array",
        ),
    ];
    for (json, path, needle) in cases {
        let e = schema(ddl).validate(json, Strictness::Strict).unwrap_err();
        assert_eq!(e.path, path, "{json}: {e}");
        assert!(e.message.contains(needle), "{json}: {e}");
        assert_eq!(e.to_string(), format!("column `{}`: {}", e.path, e.message));
    }
    let e = schema("array<int>")
        .validate("[1,2,true]", Strictness::Strict)
        .unwrap_err();
    assert_eq!(e.to_string(), "element `[2]`: expected int, found true");
}

#[test]
fn validate_arrays() {
    ok("array<int>", "[]");
    ok("array<int>", "[1,null,3]");
    ok("array<int NOT NULL>", "[1,2,3]");
    ok("array<array<string>>", r#"[["a"],[],null]"#);
    assert!(
        err("array<int>", r#"{"a":1}"#)
            .contains("expected array<int> (a JSON array), found an object")
    );
    assert!(err("array<int NOT NULL>", "[null]").contains("array elements may not be null"));
}

#[test]
fn validate_maps() {
    ok("map<string, int>", r#"{"a":1,"b":null}"#);
    ok("map<int, string>", r#"{"1":"a","-2":"b"}"#);
    ok("map<long, string>", r#"{"9223372036854775807":"a"}"#);
    ok("map<boolean, int>", r#"{"true":1,"false":0}"#);
    ok("map<double, int>", r#"{"1.5":1,"-2e3":0}"#);
    ok("map<date, int>", r#"{"2024-01-01":1}"#);
    ok("map<timestamp, int>", r#"{"2024-01-01T00:00:00Z":1,"0":2}"#);
    ok("map<binary, int>", r#"{"aGk=":1}"#);
    ok("map<struct<a: int>, int>", r#"{"{\"a\":1}":1}"#);
    ok("map<array<int>, int>", r#"{"[1,2]":1}"#);
    let cases = [
        (
            "map<int, string>",
            r#"{"x":"a"}"#,
            "x",
            r#"the map key string "x" is not a valid int"#,
        ),
        (
            "map<int, string>",
            r#"{"2147483648":"a"}"#,
            "2147483648",
            "not a valid int",
        ),
        (
            "map<boolean, int>",
            r#"{"yes":1}"#,
            "yes",
            "\"true\" or \"false\"",
        ),
        (
            "map<double, int>",
            r#"{"NaN":1}"#,
            "NaN",
            "not a valid double",
        ),
        (
            "map<date, int>",
            r#"{"2024-02-30":1}"#,
            "2024-02-30",
            "day does not exist",
        ),
        (
            "map<struct<a: int>, int>",
            r#"{"{\"a\":\"x\"}":1}"#,
            r#"{"a":"x"}"#,
            "column `a`: expected int",
        ),
        (
            "map<string, int NOT NULL>",
            r#"{"k":null}"#,
            "k",
            "map values may not be null",
        ),
        (
            "map<string, int>",
            r#"{"k":"v"}"#,
            "k",
            "expected int, found string \"v\"",
        ),
        (
            "map<string, int>",
            "[1]",
            "",
            "expected map<string, int> (a JSON object), found an array",
        ),
    ];
    for (ddl, json, key, needle) in cases {
        let e = schema(ddl).validate(json, Strictness::Strict).unwrap_err();
        let path = if key.is_empty() {
            String::new()
        } else {
            format!("['{key}']")
        };
        assert_eq!(e.path, path, "{ddl} / {json}: {e}");
        assert!(e.message.contains(needle), "{ddl} / {json}: {e}");
    }
}

#[test]
fn validate_malformed_json() {
    for (json, path) in [
        ("", ""),
        ("{", ""),
        (r#"{"a":[1],}"#, ""),
        (r#"{"a":[1,2"#, "a[2]"),
        (r#"{"a":[1]} x"#, ""),
        (r#"{"a":01}"#, "a"),
        (r#"{"a":"\x"}"#, "a"),
        ("[1,2]", ""),
    ] {
        let e = schema("a array<int>").validate(json, Strictness::Strict);
        if json == "[1,2]" {
            assert!(e.unwrap_err().message.contains("expected struct"));
            continue;
        }
        let e = e.unwrap_err();
        assert!(e.message.starts_with("malformed JSON: "), "{json}: {e}");
        assert!(e.message.contains("line 1 column"), "{json}: {e}");
        if !path.is_empty() {
            assert_eq!(e.path, path, "{json}: {e}");
        }
    }
}

#[test]
fn validate_long_strings_are_cut_in_messages() {
    let long = "x".repeat(500);
    let e = err("int", &format!("\"{long}\""));
    assert!(e.len() < 100, "{e}");
    assert!(e.ends_with('…'), "{e}");
}

#[test]
fn validate_structs_with_many_fields() {
    let ddl: Vec<String> = (0..100).map(|i| format!("f{i} int")).collect();
    let ddl = format!("{}, last int NOT NULL", ddl.join(", "));
    let body: Vec<String> = (0..100).rev().map(|i| format!("\"f{i}\":{i}")).collect();
    ok(&ddl, &format!("{{{},\"last\":0}}", body.join(",")));
    let e = err(&ddl, &format!("{{{}}}", body.join(",")));
    assert_eq!(e, "column `last`: the field is NOT NULL but missing");
    let e = err(&ddl, r#"{"f70":1,"f70":2,"last":0}"#);
    assert_eq!(e, "column `f70`: the field appears more than once");
}

// ---------------------------------------------------------------------------------------
// Canonical encoding

#[test]
fn canonical_structs() {
    let ddl = "name string, visits int, extra struct<b: long, a: boolean>";
    let want = r#"{"name":"x","visits":3,"extra":{"b":1,"a":true}}"#;
    assert_eq!(canon(ddl, want), want);
    assert_eq!(
        canon(
            ddl,
            r#" { "extra" : { "a" : true , "b" : 1 } , "visits" : 3, "name" : "x" } "#
        ),
        want
    );
    // Absent and null nullable fields encode the same way: as explicit nulls.
    assert_eq!(
        canon(ddl, r#"{"visits":3}"#),
        r#"{"name":null,"visits":3,"extra":null}"#
    );
    assert_eq!(
        canon(ddl, r#"{"name":null,"visits":3,"extra":null}"#),
        r#"{"name":null,"visits":3,"extra":null}"#
    );
    assert_eq!(
        canon(ddl, r#"{"extra":{}}"#),
        r#"{"name":null,"visits":null,"extra":{"b":null,"a":null}}"#
    );
}

#[test]
fn canonical_scalars() {
    let cases = [
        ("int", " 7 ", "7"),
        ("int", "-0", "0"),
        ("long", "-9223372036854775808", "-9223372036854775808"),
        ("double", "5", "5.0"),
        ("double", "5.0", "5.0"),
        ("double", "5e0", "5.0"),
        ("double", "0.1", "0.1"),
        ("double", "-0.0", "0.0"),
        ("double", "1e300", "1e+300"),
        ("float", "0.1", "0.1"),
        ("float", "16777217", "16777216.0"),
        ("string", r#""\u0041\/\"\n""#, r#""A/\"\n""#),
        ("string", r#""é""#, r#""é""#),
        ("boolean", "false", "false"),
        ("binary", r#""aGk=""#, r#""aGk=""#),
        ("date", r#""2024-01-31""#, r#""2024-01-31""#),
        ("timestamp", "1704067200000", "1704067200000"),
        ("timestamp", r#""2024-01-01T00:00:00Z""#, "1704067200000"),
        (
            "timestamp",
            r#""2024-01-01T02:00:00.5+02:00""#,
            "1704067200500",
        ),
        ("array<double>", "[ 1 , 2.5 , null ]", "[1.0,2.5,null]"),
        ("array<int>", "[]", "[]"),
        ("array<int>", "[5]", "[5]"),
    ];
    for (ddl, json, want) in cases {
        assert_eq!(canon(ddl, json), want, "{ddl} / {json}");
    }
}

#[test]
fn canonical_maps_sort_and_normalise_keys() {
    assert_eq!(
        canon("map<string, int>", r#"{"b":2,"a":1,"c":null}"#),
        r#"{"a":1,"b":2,"c":null}"#
    );
    assert_eq!(
        canon("map<int, int>", r#"{"+5":1,"-1":2}"#),
        r#"{"-1":2,"5":1}"#
    );
    assert_eq!(canon("map<double, int>", r#"{"1":1}"#), r#"{"1.0":1}"#);
    assert_eq!(
        canon("map<timestamp, int>", r#"{"1970-01-01T00:00:01Z":1}"#),
        r#"{"1000":1}"#
    );
    assert_eq!(
        canon(
            "map<struct<b: int, a: int>, int>",
            r#"{"{ \"a\": 1, \"b\": 2 }":1}"#
        ),
        r#"{"{\"b\":2,\"a\":1}":1}"#
    );
    let e = schema("map<int, int>")
        .canonicalize(r#"{"1":1,"01":2}"#)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "map entry `['1']`: the map key appears more than once"
    );
    let e = schema("map<string, int>")
        .canonicalize(r#"{"a":1,"\u0061":2}"#)
        .unwrap_err();
    assert!(e.message.contains("more than once"), "{e}");
}

#[test]
fn canonical_forms_agree() {
    let s = schema("k struct<a: int, b: string>, t timestamp, m map<string, double>");
    let a = s
        .canonicalize(r#"{"k":{"a":1,"b":"x"},"t":0,"m":{"p":1,"q":2.5}}"#)
        .unwrap();
    let b = s
        .canonicalize(r#"{ "m": {"q": 2.50, "p": 1.0}, "t": "1970-01-01T00:00:00Z", "k": {"b": "x", "a": 1} }"#)
        .unwrap();
    assert_eq!(a, b);
    // The canonical form is itself valid and a fixed point.
    s.validate(&a, Strictness::Strict).unwrap();
    assert_eq!(s.canonicalize(&a).unwrap(), a);
}

#[test]
fn canonical_is_strict() {
    let e = schema("a int")
        .canonicalize(r#"{"a":1,"b":2}"#)
        .unwrap_err();
    assert_eq!(e.path, "b");
}

#[test]
fn timestamp_millis_reads_both_forms() {
    assert_eq!(timestamp_millis("1704067200000"), Ok(1_704_067_200_000));
    assert_eq!(
        timestamp_millis(r#""2024-01-01T00:00:00Z""#),
        Ok(1_704_067_200_000)
    );
    assert!(timestamp_millis("null").is_err());
    assert!(timestamp_millis(r#""soon""#).is_err());
    assert!(timestamp_millis("1.5").is_err());
}

// ---------------------------------------------------------------------------------------
// RowScanner

fn cols(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn texts(found: Vec<Option<&RawValue>>) -> Vec<Option<&str>> {
    found
        .into_iter()
        .map(|raw| raw.map(RawValue::get))
        .collect()
}

#[test]
fn scanner_captures_columns_without_schema() {
    let scanner = RowScanner::new(None, cols(&["user", "ts", "geo", "missing"]));
    let line = r#"{"ts": 1700000000123, "page":"/x","user":"a\"b\\c","geo":{"city":"B","zip":[1, 2]},"n":null}"#;
    let got = scanner.scan(line).unwrap();
    assert_eq!(
        texts(got),
        [
            Some(r#""a\"b\\c""#),
            Some("1700000000123"),
            Some(r#"{"city":"B","zip":[1, 2]}"#),
            None
        ]
    );
    assert_eq!(scanner.columns(), cols(&["user", "ts", "geo", "missing"]));
}

#[test]
fn scanner_captured_values_borrow_from_the_line() {
    let scanner = RowScanner::new(None, cols(&["k"]));
    let line = String::from(r#"{"k":"v"}"#);
    let got = scanner.scan(&line).unwrap();
    let raw = got[0].unwrap().get();
    let range = line.as_ptr() as usize..line.as_ptr() as usize + line.len();
    assert!(range.contains(&(raw.as_ptr() as usize)));
}

#[test]
fn scanner_validates_with_schema_and_ignores_unknown_fields() {
    let s = schema("user string NOT NULL, ts timestamp, n int, tags array<string>");
    let scanner = RowScanner::new(Some(s), cols(&["user", "ts", "other"]));
    let got = scanner
        .scan(r#"{"junk":[1,{"x":2}],"tags":["a"],"ts":"2024-01-01T00:00:00Z","user":"u1","other":5}"#)
        .unwrap();
    assert_eq!(
        texts(got),
        [
            Some(r#""u1""#),
            Some(r#""2024-01-01T00:00:00Z""#),
            Some("5")
        ]
    );

    let e = scanner.scan(r#"{"user":"u","n":"x"}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"column `n`: expected int, found string "x""#
    );
    // A captured column is validated too.
    let e = scanner.scan(r#"{"user":7}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "column `user`: expected string, found number 7"
    );
    let e = scanner.scan(r#"{"user":null}"#).unwrap_err();
    assert!(e.to_string().contains("the field is NOT NULL"), "{e}");
    let e = scanner.scan(r#"{"ts":5}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "column `user`: the field is NOT NULL but missing"
    );
    let e = scanner.scan(r#"{"user":"u","tags":["a",3]}"#).unwrap_err();
    assert_eq!(e.path, "tags[1]");
    let e = scanner.scan(r#"{"user":"u","user":"v"}"#).unwrap_err();
    assert_eq!(
        e.to_string(),
        "column `user`: the field appears more than once"
    );
}

#[test]
fn scanner_rejects_non_objects_and_bad_json() {
    let scanner = RowScanner::new(None, cols(&["k"]));
    for (line, needle) in [
        ("[1]", "expected a JSON object (one row), found an array"),
        ("5", "found a number"),
        ("\"k\"", "found a string"),
        ("null", "found null"),
        (
            "",
            "malformed JSON: EOF while parsing a value at line 1 column 0",
        ),
        (r#"{"k":1"#, "malformed JSON: EOF while parsing an object"),
        (r#"{"k":tru}"#, "malformed JSON"),
        (r#"{"k":1} {"k":2}"#, "malformed JSON: trailing characters"),
        (r#"{"a":[1,2,}"#, "malformed JSON"),
    ] {
        let e = scanner.scan(line).unwrap_err();
        assert!(e.message.contains(needle), "{line}: {e}");
    }
    let bad = RowScanner::new(Some(schema("long")), cols(&["k"]));
    assert!(
        bad.scan(r#"{"k":1}"#)
            .unwrap_err()
            .message
            .contains("must be a struct")
    );
}

#[test]
fn scanner_handles_repeated_and_escaped_column_names() {
    let scanner = RowScanner::new(Some(schema("`a b` int")), cols(&["a b", "x", "a b"]));
    let got = scanner.scan(r#"{"a\u0020b":1,"x":true}"#).unwrap();
    assert_eq!(texts(got), [Some("1"), Some("true"), Some("1")]);
}

#[test]
fn scanner_scan_into_reuses_the_buffer() {
    let scanner = RowScanner::new(None, cols(&["a", "b"]));
    let batch = [r#"{"a":1,"b":2}"#, r#"{"b":3}"#];
    let mut out = vec![None; 2];
    scanner.scan_into(batch[0], &mut out).unwrap();
    assert_eq!(out[0].map(RawValue::get), Some("1"));
    scanner.scan_into(batch[1], &mut out).unwrap();
    assert!(out[0].is_none());
    assert_eq!(out[1].map(RawValue::get), Some("3"));
}

/// Not a timing assertion: prints the per-row cost so regressions are visible in test logs.
#[test]
fn scanner_throughput() {
    const ROWS: usize = 100_000;
    let lines: Vec<String> = (0..ROWS)
        .map(|i| {
            format!(
                r#"{{"user":"user-{}","ts":{},"page":"/products/{}?ref=home","duration_ms":{}.5,"tags":["a","b\"c"],"geo":{{"city":"Berlin","zip":{}}},"premium":{}}}"#,
                i % 1000,
                1_700_000_000_000u64 + i as u64,
                i % 97,
                i % 5000,
                10_000 + i % 90_000,
                i % 2 == 0
            )
        })
        .collect();
    let bytes: usize = lines.iter().map(String::len).sum();
    let s = schema(
        "user string NOT NULL, ts timestamp NOT NULL, page string, duration_ms double, \
         tags array<string>, geo struct<city: string, zip: int>, premium boolean",
    );
    for (label, scanner) in [
        ("no schema", RowScanner::new(None, cols(&["user", "ts"]))),
        (
            "with schema",
            RowScanner::new(Some(s), cols(&["user", "ts"])),
        ),
    ] {
        let mut out = vec![None; 2];
        let start = std::time::Instant::now();
        let mut captured = 0;
        for line in &lines {
            scanner.scan_into(line, &mut out).unwrap();
            captured += out.iter().flatten().count();
        }
        let elapsed = start.elapsed();
        assert_eq!(captured, 2 * ROWS);
        println!(
            "RowScanner ({label}): {:.0} ns/row, {:.0} MB/s over {ROWS} rows of ~{} bytes",
            elapsed.as_nanos() as f64 / ROWS as f64,
            bytes as f64 / elapsed.as_secs_f64() / 1e6,
            bytes / ROWS
        );
    }
}

// ---------------------------------------------------------------------------------------
// Evolution

fn evolves(old: &str, new: &str) {
    if let Err(e) = check_evolution(&schema(old), &schema(new)) {
        panic!("{old} -> {new} should be allowed: {e}");
    }
}

fn refused(old: &str, new: &str) -> EvolutionError {
    match check_evolution(&schema(old), &schema(new)) {
        Ok(()) => panic!("{old} -> {new} should be refused"),
        Err(e) => e,
    }
}

#[test]
fn evolution_allowed() {
    evolves("a int, b string", "a int, b string");
    evolves("a int, b string", "b string, a int");
    evolves("a int, b string", "a int");
    evolves("a int", "a int, b string");
    evolves("a int NOT NULL", "a int");
    evolves("a int", "a long");
    evolves("a int", "a double");
    evolves("a long", "a double");
    evolves("a float", "a double");
    evolves("int", "long");
    evolves("s struct<x: int, y: int>", "s struct<y: long, z: string>");
    evolves("t array<int>", "t array<long>");
    evolves("t array<int NOT NULL>", "t array<int>");
    evolves(
        "m map<string, struct<a: int>>",
        "m map<string, struct<a: double, b: date>>",
    );
    evolves("a int", "renamed int");
}

#[test]
fn evolution_refused() {
    let cases = [
        ("a long", "a int", "a", "narrowing long to int"),
        ("a double", "a float", "a", "narrowing double to float"),
        (
            "a int",
            "a float",
            "a",
            "the type changed from int to float",
        ),
        (
            "a int",
            "a string",
            "a",
            "the type changed from int to string",
        ),
        (
            "a string",
            "a binary",
            "a",
            "the type changed from string to binary",
        ),
        ("a int", "a int, b int NOT NULL", "b", "must be nullable"),
        ("a int", "a int NOT NULL", "a", "now NOT NULL"),
        (
            "s struct<x: int>",
            "s struct<x: string>",
            "s.x",
            "int to string",
        ),
        (
            "s struct<x: int>",
            "s array<int>",
            "s",
            "struct<x: int> to array<int>",
        ),
        ("t array<long>", "t array<int>", "t.element", "narrowing"),
        (
            "t array<int>",
            "t array<int NOT NULL>",
            "t.element",
            "could be null",
        ),
        (
            "m map<int, string>",
            "m map<long, string>",
            "m.key",
            "map key types cannot change",
        ),
        (
            "m map<string, int>",
            "m map<string, string>",
            "m.value",
            "int to string",
        ),
        (
            "m map<string, int>",
            "m map<string, int NOT NULL>",
            "m.value",
            "could be null",
        ),
        ("long", "int", "", "narrowing"),
        ("a int", "int", "", "to int"),
    ];
    for (old, new, path, needle) in cases {
        let e = refused(old, new);
        assert_eq!(e.path, path, "{old} -> {new}: {e}");
        assert!(e.message.contains(needle), "{old} -> {new}: {e}");
        let text = e.to_string();
        assert!(
            text.contains(&schema(old).to_ddl()) && text.contains(&schema(new).to_ddl()),
            "{text}"
        );
    }
    assert_eq!(
        refused("a int, s struct<x: int>", "a int, s struct<x: string>").to_string(),
        "field `s.x`: the type changed from int to string, which is not an allowed widening \
         (int→long, int→double, long→double, float→double) \
         (old schema: `a int, s struct<x: int>`; new schema: `a int, s struct<x: string>`)"
    );
}

#[test]
fn evolve_json_rewrites_values() {
    let old = schema(
        "name string, visits int, gone string, s struct<x: int, y: float>, t array<int>, m map<string, long>",
    );
    let new = schema(
        "visits long, name string, s struct<y: double, z: string, x: double>, t array<double>, m map<string, double>, added boolean",
    );
    check_evolution(&old, &new).unwrap();
    let json = r#"{"name":"a","visits":5,"gone":"x","s":{"x":2,"y":0.5},"t":[1,null],"m":{"k":3}}"#;
    assert_eq!(
        evolve_json(&old, &new, json).unwrap(),
        r#"{"visits":5,"name":"a","s":{"y":0.5,"z":null,"x":2.0},"t":[1.0,null],"m":{"k":3.0},"added":null}"#
    );
    assert_eq!(
        evolve_json(&schema("int"), &schema("double"), "5").unwrap(),
        "5.0"
    );
    assert_eq!(
        evolve_json(&schema("int"), &schema("long"), "5").unwrap(),
        "5"
    );
    // A value that never matched the old schema is reported, not reshaped.
    let e = evolve_json(&old, &new, r#"{"visits":"5"}"#).unwrap_err();
    assert_eq!(e.path, "visits");
}

/// The scanner's fast path (flat rows, no schema) against its general path, over rows made
/// by mutating valid ones: each row is accepted by both with the same captures, or rejected
/// by both with the same error.
#[test]
fn scanner_fast_path_agrees_with_the_general_scan() {
    let scanners = [
        RowScanner::new(None, cols(&["key", "ts", "key"])),
        RowScanner::new(None, cols(&["a b", "v"])),
    ];
    let seeds = [
        r#"{"key":"k17","value":42}"#,
        r#" { "key" : "k1" , "ts" : -0.5e+3 , "v" : true } "#,
        r#"{"ts":1700000000123,"key":null,"f":false,"s":"x y","e":""}"#,
        r#"{"a b":1E2,"v":"é\u00e9","key":[1,{"x":2}]}"#,
        r#"{}"#,
        r#"{"key":"k","key":"again"}"#,
        r#"{"ts":{"a":[1,2.5,{"b":null}],"c":[]},"key":"a\"b\\c\u00e9\n","x":[[[]]]}"#,
        r#"{"key":"k","d":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
        r#"{"k\u0065y":"escaped name","v":{}}"#,
    ];
    let alphabet: Vec<char> = "\"\\{}[],: \t0123456789-+.eEtrunlfaskvbu/\u{1}\u{1f}\u{7f}é"
        .chars()
        .collect();
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut fast, mut rows) = (0, 0);
    for round in 0..40_000 {
        let mut row: Vec<char> = seeds[round % seeds.len()].chars().collect();
        for _ in 0..round % 4 {
            let at = next(row.len() + 1);
            match next(3) {
                0 => row.insert(at, alphabet[next(alphabet.len())]),
                1 if at < row.len() => {
                    row.remove(at);
                }
                _ if at < row.len() => row[at] = alphabet[next(alphabet.len())],
                _ => {}
            }
        }
        let line: String = row.into_iter().collect();
        for scanner in &scanners {
            rows += 1;
            let n = scanner.columns().len();
            let mut flat = vec![None; n];
            fast += usize::from(scanner.scan_flat(&line, &mut flat));
            let mut general = vec![None; n];
            let expected = scanner
                .scan_general(&line, &mut general)
                .map(|()| texts(general));
            let got = scanner.scan(&line).map(texts);
            match (got, expected) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{line}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{line}"),
                (a, b) => panic!("{line}: the fast path gave {a:?}, the general scan {b:?}"),
            }
        }
    }
    // Not vacuous: most unmutated and many mutated rows take the fast path.
    assert!(fast > rows / 4, "{fast} of {rows} rows took the fast path");
    let mut out = vec![None; 3];
    assert!(scanners[0].scan_flat(seeds[0], &mut out));
    assert_eq!(texts(out), [Some(r#""k17""#), None, None]);
}
