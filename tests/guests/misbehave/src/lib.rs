//! A processor that misbehaves on demand, so the end-to-end tests can check the sandbox
//! (SPEC §10) and the lifecycle rules (SPEC §1) against a real component.
//!
//! Grouped by `k`. Each input row `{"k": ..., "action": ...}` runs one action and most emit a
//! row `{"k", "action", "detail", "count"}`:
//!
//! | action | does |
//! |---|---|
//! | `ok` | adds one to the key's `count` value state and emits the new count |
//! | `loop` | spins forever |
//! | `oom` | allocates (and touches) memory until allocation fails |
//! | `recurse` | recurses without bound |
//! | `panic` | panics with a message containing `misbehave deliberately panicked` |
//! | `bad-output` | emits a row whose `count` is a string |
//! | `pretty-output` | emits a valid row as pretty-printed JSON, with line breaks |
//! | `huge-output` | emits 20 rows of 1 MiB each |
//! | `fail` | returns an error containing `misbehave deliberately failed` |
//! | `clock` | emits the guest's `SystemTime::now()` in ms (detail and count) |
//! | `random` | emits a number drawn from std's `RandomState` (detail and count) |
//! | `random-host` | emits a number drawn from the host's `wasi:random` (detail and count) |
//! | `read-file` | tries to read `/etc/passwd` and list `/` and `.`; emits what happened |
//! | `env` | emits the environment variables and arguments the guest sees |
//! | `declare` | declares a state variable and calls `delete-if-exists` outside `init` |
//! | `timer` | registers a timer |
//! | `use-key` | selects an entry past the batched call's (`use-key`), then reads `count` |
//! | `query-info` | emits the query id and run id (detail) and the batch id (count) |
//! | `init-report` | emits what happened when `init` touched state and timers, and declared `count` again (same schema, another schema, another kind) and a variable with an invalid schema |
//!
//! For `read-file`, `env`, `declare` and `timer` the `count` column is the number of
//! operations that succeeded, and `detail` says what each one returned.

use std::hash::{BuildHasher, Hasher};
use std::hint::black_box;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use statebox_sdk::prelude::*;

/// One input row.
#[derive(Debug, Deserialize)]
pub struct Row {
    /// The grouping key.
    pub k: String,
    /// What to do.
    pub action: String,
}

/// The misbehaving processor. See the [crate docs](crate).
pub struct Misbehave {
    count: ValueState<i64>,
    timers: Timers,
    query: statebox_sdk::Query,
    /// What touching state and timers inside `init` returned; emitted by `init-report`.
    init_report: String,
}

/// A row as raw JSON text, emitted exactly as written.
fn raw(row: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(row).expect("a JSON value serializes")
}

/// Describes the outcome of an SDK call for the `detail` column.
fn outcome<T: std::fmt::Debug>(result: Result<T>) -> (bool, String) {
    match result {
        Ok(v) => (true, format!("ok {v:?}")),
        Err(e) => (false, format!("{:?}: {}", e.kind(), e.message())),
    }
}

/// Recurses until the stack runs out. The result is used after the call returns, so the
/// compiler cannot turn the recursion into a loop, and the frame holds no array, so the
/// WebAssembly call stack (not the shadow stack in linear memory) overflows first.
#[inline(never)]
fn dig(depth: u64, limit: u64) -> u64 {
    if depth >= limit {
        return depth;
    }
    let below = dig(depth + 1, limit);
    below.rotate_left((depth % 63) as u32) ^ depth
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

/// Allocates 1 MiB blocks, touching every page, until allocation fails (which aborts).
fn exhaust_memory() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![0xA5; 1 << 20]);
        black_box(&hoard);
    }
}

impl Misbehave {
    fn row(k: &str, action: &str, detail: impl Into<String>, count: i64) -> Box<RawValue> {
        raw(&json!({"k": k, "action": action, "detail": detail.into(), "count": count}))
    }

    fn act(&mut self, row: &Row, out: &mut Emitter<Box<RawValue>>) -> Result<()> {
        let (k, action) = (row.k.as_str(), row.action.as_str());
        match action {
            "ok" => {
                let count = self.count.get()?.unwrap_or(0) + 1;
                self.count.update(&count)?;
                out.emit(Self::row(k, action, "", count))
            }
            "loop" => spin(),
            "oom" => exhaust_memory(),
            "recurse" => {
                let depth = dig(0, black_box(u64::MAX));
                out.emit(Self::row(k, action, "recursion ended", depth as i64))
            }
            "panic" => panic!("misbehave deliberately panicked for key {k}"),
            "bad-output" => out.emit(raw(&json!({
                "k": k, "action": action, "detail": "", "count": "not a number"
            }))),
            "pretty-output" => {
                let row = json!({"k": k, "action": action, "detail": "a\nb", "count": 1});
                let pretty = serde_json::to_string_pretty(&row)?;
                out.emit(RawValue::from_string(pretty)?)
            }
            "huge-output" => {
                let mib = "x".repeat(1 << 20);
                for i in 0..20 {
                    out.emit(Self::row(k, action, mib.clone(), i))?;
                }
                Ok(())
            }
            "fail" => statebox_sdk::bail!("misbehave deliberately failed for key {k}"),
            "clock" => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_err(|e| Error::msg(format!("clock before the epoch: {e}")))?;
                let ms = i64::try_from(now.as_millis())?;
                out.emit(Self::row(k, action, ms.to_string(), ms))
            }
            "random" => {
                let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
                hasher.write(b"misbehave");
                let n = hasher.finish() as i64;
                out.emit(Self::row(k, action, n.to_string(), n))
            }
            "random-host" => {
                // Straight from the host's `wasi:random`, not through std's cached keys.
                let n =
                    getrandom::u64().map_err(|e| statebox_sdk::Error::msg(e.to_string()))? as i64;
                out.emit(Self::row(k, action, n.to_string(), n))
            }
            "read-file" => {
                let attempts = [
                    outcome(
                        std::fs::read("/etc/passwd")
                            .map(|b| b.len())
                            .map_err(Error::from),
                    ),
                    outcome(
                        std::fs::read_dir("/")
                            .map(|d| d.count())
                            .map_err(Error::from),
                    ),
                    outcome(
                        std::fs::read_dir(".")
                            .map(|d| d.count())
                            .map_err(Error::from),
                    ),
                ];
                self.emit_attempts(k, action, &attempts, out)
            }
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(name, _)| name).collect();
                let args: Vec<String> = std::env::args().collect();
                let cwd = std::env::current_dir().map(|d| d.display().to_string());
                let detail = format!("vars={vars:?} args={args:?} cwd={cwd:?}");
                out.emit(Self::row(
                    k,
                    action,
                    detail,
                    (vars.len() + args.len()) as i64,
                ))
            }
            "declare" => {
                // A hostile guest can call the imports directly, whatever the SDK allows.
                use statebox_sdk::__private::bindings::statebox::processor::handle as raw;
                let declared = match raw::get_value_state("late", "long", None) {
                    Ok(_) => (true, "declared".to_owned()),
                    Err(e) => (false, format!("{:?}: {}", e.kind, e.message)),
                };
                let deleted = match raw::delete_if_exists("count") {
                    Ok(()) => (true, "deleted".to_owned()),
                    Err(e) => (false, format!("{:?}: {}", e.kind, e.message)),
                };
                self.emit_attempts(k, action, &[declared, deleted], out)
            }
            "timer" => {
                let attempts = [
                    outcome(self.timers.register(1_000)),
                    outcome(self.timers.list()),
                    outcome(self.timers.delete(1_000)),
                ];
                self.emit_attempts(k, action, &attempts, out)
            }
            "use-key" => {
                // Entries past the batched call's are refused; the guest stays on its key.
                use statebox_sdk::__private::bindings::statebox::processor::keys::use_key;
                let far = match use_key(u32::MAX) {
                    Ok(()) => (true, "selected".to_owned()),
                    Err(e) => (false, format!("{:?}: {}", e.kind, e.message)),
                };
                let count = outcome(self.count.get().map(|c| c.unwrap_or(0)));
                self.emit_attempts(k, action, &[far, count], out)
            }
            "query-info" => {
                let info = self.query.info();
                let detail = format!("{} {}", info.query_id, info.run_id);
                out.emit(Self::row(k, action, detail, info.batch_id as i64))
            }
            "init-report" => out.emit(Self::row(k, action, self.init_report.clone(), 0)),
            other => statebox_sdk::bail!("unknown action `{other}`"),
        }
    }

    fn emit_attempts(
        &self,
        k: &str,
        action: &str,
        attempts: &[(bool, String)],
        out: &mut Emitter<Box<RawValue>>,
    ) -> Result<()> {
        let succeeded = attempts.iter().filter(|(ok, _)| *ok).count() as i64;
        let detail: Vec<&str> = attempts.iter().map(|(_, d)| d.as_str()).collect();
        out.emit(Self::row(k, action, detail.join(" | "), succeeded))
    }
}

impl StatefulProcessor for Misbehave {
    type Input = Row;
    type Output = Box<RawValue>;
    type InitialState = NoInitialState;

    const NAME: &'static str = "misbehave";
    const OUTPUT_SCHEMA: &'static str = "k string, action string, detail string, count long";
    const INPUT_SCHEMA: Option<&'static str> = Some("k string, action string");

    fn init(handle: &mut Handle) -> Result<Self> {
        let count = handle.value_state("count", "long")?;
        let timers = handle.timers();
        // Touching state or timers in init must fail cleanly (SPEC §1), and a name may be
        // declared again only with the same kind and schema (SPEC §2); record what happened.
        let (_, state) = outcome(count.get());
        let (_, timer) = outcome(timers.list());
        let (_, again) = outcome(handle.value_state::<i64>("count", "long").map(drop));
        let (_, schema) = outcome(handle.value_state::<String>("count", "string").map(drop));
        let (_, kind) = outcome(handle.list_state::<i64>("count", "long").map(drop));
        let (_, invalid) = outcome(handle.value_state::<i64>("other", "lng").map(drop));
        Ok(Misbehave {
            count,
            timers,
            query: handle.query(),
            init_report: format!(
                "state: {state} | timers: {timer} | again: {again} | schema change: {schema} \
                 | kind change: {kind} | invalid schema: {invalid}"
            ),
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Row>,
        _timer_values: TimerValues,
        out: &mut Emitter<Box<RawValue>>,
    ) -> Result<()> {
        for row in &rows {
            self.act(row, out)?;
        }
        Ok(())
    }
}

statebox_sdk::export_processor!(Misbehave);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn row(k: &str, action: &str) -> Row {
        Row {
            k: k.to_owned(),
            action: action.to_owned(),
        }
    }

    #[test]
    fn ok_counts_per_key() {
        let mut h = TestHarness::<Misbehave>::new(TimeMode::None).unwrap();
        h.handle_input_rows("a", vec![row("a", "ok"), row("a", "ok")])
            .unwrap();
        let out = h.handle_input_rows("b", vec![row("b", "ok")]).unwrap();
        let out: Value = serde_json::from_str(out[0].get()).unwrap();
        assert_eq!(out["count"], 1);
        assert_eq!(h.value_state::<i64>("count", "a"), Some(2));
    }

    #[test]
    fn init_could_not_touch_state() {
        let mut h = TestHarness::<Misbehave>::new(TimeMode::ProcessingTime).unwrap();
        let out = h
            .handle_input_rows("a", vec![row("a", "init-report")])
            .unwrap();
        let out: Value = serde_json::from_str(out[0].get()).unwrap();
        let detail = out["detail"].as_str().unwrap();
        assert!(detail.contains("WrongPhase"), "{detail}");
    }

    #[test]
    fn fail_returns_the_message() {
        let mut h = TestHarness::<Misbehave>::new(TimeMode::None).unwrap();
        let err = h
            .handle_input_rows("a", vec![row("a", "fail")])
            .unwrap_err();
        assert!(
            err.message().contains("misbehave deliberately failed"),
            "{err}"
        );
    }
}
