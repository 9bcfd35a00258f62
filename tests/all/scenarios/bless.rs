//! Bless mode (`STATEBOX_BLESS=1`): a scenario's expectations rewritten from what a real
//! run did, for a reviewer to read in `git diff`.
//!
//! Only the failing steps change, and only their `expect` / `expect_error`: the rest of the
//! file keeps its text byte for byte (the files are laid out by hand, one row per line where
//! that reads better, keys in a meaningful order — a re-serialised file would lose that).
//! Expected rows that were emitted keep their text and their place; rows emitted but not
//! expected follow, their keys in the order the step's other rows (or the file's) use.

use serde_json::Value;

/// What one step of `statebox test --json` reported.
#[derive(Debug)]
pub(super) struct StepRun {
    pub(super) emitted: Vec<Value>,
    pub(super) error: Option<String>,
    pub(super) passed: bool,
}

impl StepRun {
    /// The step lines of `statebox test --json` output, in step order.
    pub(super) fn parse_all(stdout: &str) -> Result<Vec<StepRun>, String> {
        stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|line| {
                let v: Value = serde_json::from_str(line).map_err(|e| format!("`{line}`: {e}"))?;
                Ok(StepRun {
                    emitted: v["emitted"]
                        .as_array()
                        .ok_or_else(|| format!("no `emitted` in `{line}`"))?
                        .clone(),
                    error: v["error"].as_str().map(str::to_owned),
                    passed: v["passed"]
                        .as_bool()
                        .ok_or_else(|| format!("no `passed` in `{line}`"))?,
                })
            })
            .collect()
    }
}

/// The scenario `text` with the expectations of every failed step of `runs` rewritten
/// from what it did. `unstable` are directories no blessed error message may name (the
/// run's temporary files, this machine's build directories).
pub(super) fn bless(text: &str, runs: &[StepRun], unstable: &[&str]) -> Result<String, String> {
    let root = Parser::new(text).document()?;
    let steps = match root.member("steps").map(|m| &m.value.kind) {
        Some(Kind::Array(steps)) => steps,
        _ => return Err("the scenario has no `steps` array".into()),
    };
    if steps.len() != runs.len() {
        return Err(format!(
            "the scenario has {} steps but the run reported {}",
            steps.len(),
            runs.len()
        ));
    }
    let mut file_keys = Vec::new();
    collect_row_keys(&root, &mut file_keys);
    // Edits as (start, end, replacement), applied from the end so spans stay valid.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for (i, (step, run)) in steps.iter().zip(runs).enumerate() {
        if run.passed {
            continue;
        }
        let n = i + 1;
        let Kind::Object(members) = &step.kind else {
            return Err(format!("step {n} is not an object"));
        };
        let expect = step.member("expect");
        let expect_error = step.member("expect_error");
        match &run.error {
            Some(error) => {
                let error = Value::from(stable_error(error, unstable)).to_string();
                match (expect_error, expect) {
                    (Some(m), _) => edits.push((m.value.start, m.value.end, error)),
                    (None, Some(m)) => {
                        edits.push((
                            m.key_start,
                            m.value.end,
                            format!("\"expect_error\": {error}"),
                        ));
                    }
                    (None, None) => {
                        let last = members.last().ok_or(format!("step {n} is empty"))?;
                        edits.push((
                            last.value.end,
                            last.value.end,
                            format!(", \"expect_error\": {error}"),
                        ));
                    }
                }
            }
            None => {
                let indent = line_indent(text, step.start);
                let mut keys = Vec::new();
                if let Some(m) = expect {
                    collect_row_keys(&m.value, &mut keys);
                }
                if let Some(m) = step.member("batch") {
                    collect_row_keys(&m.value, &mut keys);
                }
                keys.extend(file_keys.iter().cloned());
                match (expect_error, expect) {
                    (Some(_), Some(_)) => {
                        return Err(format!(
                            "step {n} has both `expect` and `expect_error`; fix it by hand"
                        ));
                    }
                    (Some(m), None) => {
                        let column = m.key_start - line_start(text, m.key_start);
                        let rows = rows_text(text, None, &run.emitted, &keys, indent, column);
                        edits.push((m.key_start, m.value.end, format!("\"expect\": {rows}")));
                    }
                    (None, Some(m)) => {
                        let column = m.value.start - line_start(text, m.value.start);
                        let rows =
                            rows_text(text, Some(&m.value), &run.emitted, &keys, indent, column);
                        edits.push((m.value.start, m.value.end, rows));
                    }
                    // Without expectations a step that succeeded passes: nothing to bless.
                    (None, None) => {}
                }
            }
        }
    }
    let mut out = text.to_owned();
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (start, end, with) in edits {
        out.replace_range(start..end, &with);
    }
    serde_json::from_str::<Value>(&out).map_err(|e| format!("blessed text is not JSON: {e}"))?;
    Ok(out)
}

/// The longest tail of an error chain (`a: b: c`) that names no unstable path: what an
/// `expect_error` (a substring) can match on every run and machine. A reviewer may shorten
/// it further.
fn stable_error(error: &str, unstable: &[&str]) -> String {
    let mut tail = error;
    while unstable.iter().any(|dir| tail.contains(dir)) {
        match tail.split_once(": ") {
            Some((_, rest)) => tail = rest,
            None => break,
        }
    }
    tail.to_owned()
}

/// The `expect` array for `emitted`: old rows (text kept) in their order as far as they
/// were emitted, then the new ones; on one line if it fits and the old one was, else one
/// row per line indented under the step.
fn rows_text(
    text: &str,
    old: Option<&Node>,
    emitted: &[Value],
    keys: &[String],
    indent: usize,
    column: usize,
) -> String {
    let mut left: Vec<&Value> = emitted.iter().collect();
    let mut rows: Vec<String> = Vec::new();
    let mut was_multiline = false;
    if let Some(Node {
        kind: Kind::Array(items),
        start,
        end,
    }) = old
    {
        was_multiline = text[*start..*end].contains('\n');
        for item in items {
            let src = &text[item.start..item.end];
            let Ok(value) = serde_json::from_str::<Value>(src) else {
                continue;
            };
            if let Some(at) = left.iter().position(|v| **v == value) {
                left.remove(at);
                rows.push(src.to_owned());
            }
        }
    }
    rows.extend(left.into_iter().map(|v| format_value(v, keys)));
    if rows.is_empty() {
        return "[]".into();
    }
    let one_line = format!("[{}]", rows.join(", "));
    if !was_multiline && column + one_line.len() <= 100 && !one_line.contains('\n') {
        return one_line;
    }
    let pad = " ".repeat(indent + 3);
    format!(
        "[\n{pad}{}\n{}]",
        rows.join(&format!(",\n{pad}")),
        " ".repeat(indent + 1)
    )
}

/// A value in the files' style (`{"a": 1, "b": [2, 3]}`), object keys in `keys`' order
/// first, then sorted.
fn format_value(value: &Value, keys: &[String]) -> String {
    match value {
        Value::Object(map) => {
            let mut names: Vec<&String> = keys.iter().filter(|k| map.contains_key(*k)).collect();
            names.dedup();
            let mut seen = std::collections::BTreeSet::new();
            names.retain(|k| seen.insert(*k));
            names.extend(map.keys().filter(|k| !seen.contains(k)));
            let fields: Vec<String> = names
                .into_iter()
                .map(|k| {
                    format!(
                        "{}: {}",
                        Value::from(k.as_str()),
                        format_value(&map[k], keys)
                    )
                })
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|v| format_value(v, keys)).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The keys of every object in the rows of `node` (an array of rows), in order of first
/// appearance, appended to `keys`.
fn collect_row_keys(node: &Node, keys: &mut Vec<String>) {
    match &node.kind {
        Kind::Object(members) => {
            for m in members {
                if !keys.contains(&m.key) {
                    keys.push(m.key.clone());
                }
                collect_row_keys(&m.value, keys);
            }
        }
        Kind::Array(items) => {
            for item in items {
                collect_row_keys(item, keys);
            }
        }
        Kind::Scalar => {}
    }
}

fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// The leading spaces of the line holding byte `at`.
fn line_indent(text: &str, at: usize) -> usize {
    let start = line_start(text, at);
    text[start..].len() - text[start..].trim_start_matches(' ').len()
}

/// A JSON value and its byte span in the text.
#[derive(Debug)]
struct Node {
    start: usize,
    end: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Object(Vec<Member>),
    Array(Vec<Node>),
    Scalar,
}

#[derive(Debug)]
struct Member {
    key: String,
    key_start: usize,
    value: Node,
}

impl Node {
    fn member(&self, key: &str) -> Option<&Member> {
        match &self.kind {
            Kind::Object(members) => members.iter().find(|m| m.key == key),
            _ => None,
        }
    }
}

/// A JSON parser that keeps spans (serde_json keeps none, and the tests do not pull in a
/// crate for it). It accepts exactly what it needs to find the values; `bless` checks the
/// result with serde_json.
struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser { text, at: 0 }
    }

    fn document(mut self) -> Result<Node, String> {
        let node = self.value()?;
        self.skip_ws();
        match self.at == self.text.len() {
            true => Ok(node),
            false => Err(format!("text after the JSON value at byte {}", self.at)),
        }
    }

    fn skip_ws(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        self.skip_ws();
        match self.peek() == Some(byte) {
            true => {
                self.at += 1;
                Ok(())
            }
            false => Err(format!("expected `{}` at byte {}", byte as char, self.at)),
        }
    }

    fn value(&mut self) -> Result<Node, String> {
        self.skip_ws();
        let start = self.at;
        let kind = match self.peek() {
            Some(b'{') => {
                self.at += 1;
                let mut members = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                } else {
                    loop {
                        self.skip_ws();
                        let key_start = self.at;
                        let key = self.string()?;
                        self.expect(b':')?;
                        let value = self.value()?;
                        members.push(Member {
                            key,
                            key_start,
                            value,
                        });
                        self.skip_ws();
                        match self.peek() {
                            Some(b',') => self.at += 1,
                            Some(b'}') => {
                                self.at += 1;
                                break;
                            }
                            _ => return Err(format!("expected `,` or `}}` at byte {}", self.at)),
                        }
                    }
                }
                Kind::Object(members)
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.at += 1;
                } else {
                    loop {
                        items.push(self.value()?);
                        self.skip_ws();
                        match self.peek() {
                            Some(b',') => self.at += 1,
                            Some(b']') => {
                                self.at += 1;
                                break;
                            }
                            _ => return Err(format!("expected `,` or `]` at byte {}", self.at)),
                        }
                    }
                }
                Kind::Array(items)
            }
            Some(b'"') => {
                self.string()?;
                Kind::Scalar
            }
            Some(_) => {
                let rest = &self.text[self.at..];
                let len = rest
                    .find(|c: char| c == ',' || c == ']' || c == '}' || c.is_whitespace())
                    .unwrap_or(rest.len());
                if len == 0 {
                    return Err(format!("expected a value at byte {}", self.at));
                }
                self.at += len;
                Kind::Scalar
            }
            None => return Err("unexpected end of the text".into()),
        };
        Ok(Node {
            start,
            end: self.at,
            kind,
        })
    }

    /// A string literal at the cursor, decoded.
    fn string(&mut self) -> Result<String, String> {
        let start = self.at;
        if self.peek() != Some(b'"') {
            return Err(format!("expected a string at byte {start}"));
        }
        let bytes = self.text.as_bytes();
        let mut i = start + 1;
        while i < bytes.len() && bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        if i >= bytes.len() {
            return Err(format!("unterminated string at byte {start}"));
        }
        self.at = i + 1;
        serde_json::from_str(&self.text[start..self.at])
            .map_err(|e| format!("bad string at byte {start}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCENARIO: &str = r#"{
  "processor": "tests/guests/timer-ops",
  "key": ["k"],
  "steps": [
    {"batch": [{"k": "a", "op": "x"}], "at_ms": 1, "expect": [{"k": "a", "n": 1}]},
    {"no_data": true, "at_ms": 5000, "expect": [
       {"k": "b", "op": "fired", "ts": 1000},
       {"k": "a", "op": "fired", "ts": 1500}
     ]},
    {"batch": [{"k": "a"}], "expect_error": "old message"},
    {"batch": [{"k": "b"}], "expect": []},
    {"restart": true}
  ]
}
"#;

    fn run(emitted: Value, error: Option<&str>, passed: bool) -> StepRun {
        StepRun {
            emitted: emitted.as_array().expect("rows").clone(),
            error: error.map(str::to_owned),
            passed,
        }
    }

    #[test]
    fn only_failed_steps_change_and_kept_rows_keep_their_text() {
        let runs = [
            run(json!([{"k": "a", "n": 1}]), None, true),
            // One row kept, one gone, one new (keys ordered as the step's rows are).
            run(
                json!([{"ts": 2500, "op": "fired", "k": "c"}, {"ts": 1500, "op": "fired", "k": "a"}]),
                None,
                false,
            ),
            // Now succeeds.
            run(json!([{"k": "a", "n": 2}]), None, false),
            // Now fails, with a temporary path in the chain.
            run(json!([]), Some("cannot run /tmp/x/in: bad row 3"), false),
            // A restart that now fails.
            run(json!([]), Some("incompatible"), false),
        ];
        let blessed = bless(SCENARIO, &runs, &["/tmp/x"]).expect("blesses");
        let want = r#"{
  "processor": "tests/guests/timer-ops",
  "key": ["k"],
  "steps": [
    {"batch": [{"k": "a", "op": "x"}], "at_ms": 1, "expect": [{"k": "a", "n": 1}]},
    {"no_data": true, "at_ms": 5000, "expect": [
       {"k": "a", "op": "fired", "ts": 1500},
       {"k": "c", "op": "fired", "ts": 2500}
     ]},
    {"batch": [{"k": "a"}], "expect": [{"k": "a", "n": 2}]},
    {"batch": [{"k": "b"}], "expect_error": "bad row 3"},
    {"restart": true, "expect_error": "incompatible"}
  ]
}
"#;
        assert_eq!(blessed, want);
        // Blessing what the blessed file expects changes nothing.
        let passing: Vec<StepRun> = runs
            .into_iter()
            .map(|r| StepRun { passed: true, ..r })
            .collect();
        assert_eq!(bless(&blessed, &passing, &["/tmp/x"]).unwrap(), blessed);
    }

    #[test]
    fn long_rows_go_one_per_line_and_an_old_error_is_replaced() {
        let text = "{\"steps\": [\n    {\"batch\": [{\"k\": \"a\"}], \"expect_error\": \"old\"},\n    {\"batch\": [{\"k\": \"a\"}], \"expect\": []}\n]}";
        let long = "x".repeat(60);
        let runs = [
            run(json!([]), Some("new error"), false),
            run(
                json!([{"k": "a", "v": long}, {"k": "b", "v": long}]),
                None,
                false,
            ),
        ];
        let blessed = bless(text, &runs, &["/tmp/x"]).unwrap();
        let want = format!(
            "{{\"steps\": [\n    {{\"batch\": [{{\"k\": \"a\"}}], \"expect_error\": \"new error\"}},\n    {{\"batch\": [{{\"k\": \"a\"}}], \"expect\": [\n       {{\"k\": \"a\", \"v\": \"{long}\"}},\n       {{\"k\": \"b\", \"v\": \"{long}\"}}\n     ]}}\n]}}"
        );
        assert_eq!(blessed, want);
    }

    #[test]
    fn a_run_that_does_not_match_the_file_is_refused() {
        let runs = [run(json!([]), None, false)];
        let err = bless(SCENARIO, &runs, &["/tmp/x"]).unwrap_err();
        assert!(err.contains("5 steps but the run reported 1"), "{err}");
    }

    #[test]
    fn every_scenario_file_parses_with_spans() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let root = Parser::new(&text)
                .document()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // The spans are right: each step's text parses to what serde_json reads there.
            let whole: Value = serde_json::from_str(&text).unwrap();
            let Some(Kind::Array(steps)) = root.member("steps").map(|m| &m.value.kind) else {
                panic!("{}: no steps", path.display());
            };
            for (i, step) in steps.iter().enumerate() {
                let got: Value = serde_json::from_str(&text[step.start..step.end]).unwrap();
                assert_eq!(got, whole["steps"][i], "{} step {}", path.display(), i + 1);
            }
        }
    }
}
