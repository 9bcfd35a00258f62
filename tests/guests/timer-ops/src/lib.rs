//! A conformance processor for time: each input row runs one timer, time or TTL'd state
//! operation, so the scenario files under `tests/scenarios/` can check SPEC §3 and §4 through
//! the real host, engine and RocksDB.
//!
//! Grouped by `k`. Input rows are
//! `{"k": string, "op": string, "ts": long, "then": long, "cancel": long, "v": string, "vs": [string], "mk": string, "out_ts": long}`
//! (only `k` and `op` are required; event-time scenarios add their event-time column, which
//! the processor ignores). Emitted rows are JSON objects with some of the columns of
//! [`OUTPUT_SCHEMA`](StatefulProcessor::OUTPUT_SCHEMA); each op says which.
//!
//! | variable | kind | TTL | schema | holds |
//! |---|---|---|---|---|
//! | `value` | value | [`TTL_MS`] | `string` | `set` / `get` |
//! | `list` | list | [`TTL_MS`] per element | `string` | `append` / `put` / `list-get` |
//! | `map` | map | [`TTL_MS`] per entry | key `string`, value `string` | `map-update` / `map-get` / `map-all` |
//! | `history` | list | — | `long` | the key's fired timers, in firing order |
//! | `chain` | map | — | key `long`, value `long` | timer → timer its handler registers |
//! | `cancel` | map | — | key `long`, value `long` | timer → timer its handler deletes |
//! | `trace` | value | — | `boolean` | whether fired rows carry `tp` and `wm` |
//! | `order` | value | — | `boolean` | whether fired rows carry `seq` |
//!
//! In time mode `none` the three TTL'd variables are declared without TTL (the host refuses
//! TTL there), so the timer rules of that mode can still be checked.
//!
//! Operations, run in the order of the key's rows:
//!
//! | op | does | emits |
//! |---|---|---|
//! | `register` (ts, then?, cancel?) | registers a timer at `ts`; with `then`, the handler of `ts` registers a timer at `then`; with `cancel`, it deletes the timer at `cancel` | — |
//! | `delete` (ts) | deletes the timer at `ts` | — |
//! | `list` | lists the key's timers | `{k, op, timers}` |
//! | `time` | reads the timer values | `{k, op, tp, wm}` |
//! | `trace` | makes the key's fired rows carry `tp` and `wm` | — |
//! | `order` | makes the key's fired rows carry `seq` | — |
//! | `event` | nothing (a row that only carries event time) | — |
//! | `emit` (out_ts) | emits a row with `out_ts` (the output event-time column of some scenarios) | `{k, op, out_ts}` |
//! | `set` (v) | `value.update` | — |
//! | `get` | `value.get` | `{k, op, value}` (null if none) |
//! | `append` (v or vs) | `list.append-value` / `append-list` | — |
//! | `put` (vs) | `list.put` | — |
//! | `list-get` | `list.get` | `{k, op, values}` |
//! | `map-update` (mk, v) | `map.update-value` | — |
//! | `map-get` (mk) | `map.get-value` | `{k, op, value}` (null if none) |
//! | `map-all` | `map.iterator` | `{k, op, values: ["mk=v", ...]}` |
//! | `exists` | `exists` of the three TTL'd variables | `{k, op, values: names of those that exist}` |
//! | `clear` | clears `value`, `list` and `map` of this key | — |
//!
//! When a timer fires the handler lists the key's timers, appends the timer to `history`,
//! registers the timer `chain` names for it and deletes the one `cancel` names (if any), and
//! emits
//! `{k, op: "fired", ts, timers, history}`: `timers` as listed on entry (so it includes the
//! firing timer), `history` including this one. For a `trace`d key the row also carries `tp`
//! and `wm`, the handler's timer values. For an `order`ed key it carries `seq`, the number of
//! timers of `order`ed keys this processor instance has fired so far (1 for the first), which
//! shows the firing order across the keys of one partition (use one partition, and mind that
//! the count restarts with the instance).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use statebox_sdk::prelude::*;

/// The TTL of `value`, `list` and `map`, in milliseconds.
pub const TTL_MS: u64 = 10_000;

/// One input row.
#[derive(Debug, Default, Deserialize)]
pub struct Op {
    /// The operation.
    pub op: String,
    /// A timer timestamp.
    #[serde(default)]
    pub ts: Option<i64>,
    /// The timer the handler of `ts` registers.
    #[serde(default)]
    pub then: Option<i64>,
    /// The timer the handler of `ts` deletes.
    #[serde(default)]
    pub cancel: Option<i64>,
    /// A value.
    #[serde(default)]
    pub v: Option<String>,
    /// Values.
    #[serde(default)]
    pub vs: Option<Vec<String>>,
    /// A map user key.
    #[serde(default)]
    pub mk: Option<String>,
    /// The output event time of `emit`.
    #[serde(default)]
    pub out_ts: Option<i64>,
}

/// The conformance processor. See the [crate docs](crate).
pub struct TimerOps {
    value: ValueState<String>,
    list: ListState<String>,
    map: MapState<String, String>,
    history: ListState<i64>,
    chain: MapState<i64, i64>,
    cancel: MapState<i64, i64>,
    trace: ValueState<bool>,
    order: ValueState<bool>,
    timers: Timers,
    /// Timers of `order`ed keys fired by this instance.
    fired: i64,
}

fn label(key: &Key) -> String {
    key.as_str()
        .map_or_else(|| key.json().to_owned(), str::to_owned)
}

fn need<T>(operand: Option<T>, op: &str, name: &str) -> Result<T> {
    match operand {
        Some(v) => Ok(v),
        None => statebox_sdk::bail!("op `{op}` needs `{name}`"),
    }
}

fn row(key: &Key, op: &str, fields: Value) -> Value {
    let mut out = Map::new();
    out.insert("k".into(), Value::String(label(key)));
    out.insert("op".into(), Value::String(op.to_owned()));
    if let Value::Object(fields) = fields {
        out.extend(fields);
    }
    Value::Object(out)
}

impl TimerOps {
    fn run(&mut self, key: &Key, op: Op, tv: TimerValues, out: &mut Emitter<Value>) -> Result<()> {
        let name = op.op.as_str();
        match name {
            "register" => {
                let ts = need(op.ts, name, "ts")?;
                self.timers.register(ts)?;
                if let Some(then) = op.then {
                    self.chain.update_value(&ts, &then)?;
                }
                if let Some(cancel) = op.cancel {
                    self.cancel.update_value(&ts, &cancel)?;
                }
            }
            "delete" => self.timers.delete(need(op.ts, name, "ts")?)?,
            "list" => out.emit(row(key, name, json!({ "timers": self.timers.list()? })))?,
            "time" => out.emit(row(
                key,
                name,
                json!({
                    "tp": tv.current_processing_time_ms(),
                    "wm": tv.current_watermark_ms(),
                }),
            ))?,
            "trace" => self.trace.update(&true)?,
            "order" => self.order.update(&true)?,
            "event" => {}
            "emit" => out.emit(row(
                key,
                name,
                json!({ "out_ts": need(op.out_ts, name, "out_ts")? }),
            ))?,
            "set" => self.value.update(&need(op.v, name, "v")?)?,
            "get" => out.emit(row(key, name, json!({ "value": self.value.get()? })))?,
            "append" => match (op.v, op.vs) {
                (Some(v), None) => self.list.append_value(&v)?,
                (None, Some(vs)) => self.list.append_list(&vs)?,
                _ => statebox_sdk::bail!("op `append` needs exactly one of `v` and `vs`"),
            },
            "put" => self.list.put(&need(op.vs, name, "vs")?)?,
            "list-get" => {
                let values = self.list.get()?.collect::<Result<Vec<_>>>()?;
                out.emit(row(key, name, json!({ "values": values })))?;
            }
            "map-update" => self
                .map
                .update_value(need(op.mk, name, "mk")?.as_str(), &need(op.v, name, "v")?)?,
            "map-get" => {
                let value = self.map.get_value(need(op.mk, name, "mk")?.as_str())?;
                out.emit(row(key, name, json!({ "value": value })))?;
            }
            "map-all" => {
                let values = self
                    .map
                    .iter()?
                    .map(|entry| entry.map(|(k, v)| format!("{k}={v}")))
                    .collect::<Result<Vec<_>>>()?;
                out.emit(row(key, name, json!({ "values": values })))?;
            }
            "exists" => {
                let mut values = Vec::new();
                for (var, exists) in [
                    ("value", self.value.exists()?),
                    ("list", self.list.exists()?),
                    ("map", self.map.exists()?),
                ] {
                    if exists {
                        values.push(var);
                    }
                }
                out.emit(row(key, name, json!({ "values": values })))?;
            }
            "clear" => {
                self.value.clear()?;
                self.list.clear()?;
                self.map.clear()?;
            }
            other => statebox_sdk::bail!("unknown op `{other}`"),
        }
        Ok(())
    }
}

impl StatefulProcessor for TimerOps {
    type Input = Op;
    type Output = Value;
    type InitialState = NoInitialState;

    const NAME: &'static str = "timer-ops";
    const OUTPUT_SCHEMA: &'static str = "k string, op string, ts long, timers array<long>, \
        history array<long>, seq long, tp long, wm long, value string, values array<string>, \
        out_ts long";

    fn init(handle: &mut Handle) -> Result<Self> {
        let ttl = Duration::from_millis(TTL_MS);
        let timed = handle.time_mode() != TimeMode::None;
        Ok(TimerOps {
            value: if timed {
                handle.value_state_with_ttl("value", "string", ttl)?
            } else {
                handle.value_state("value", "string")?
            },
            list: if timed {
                handle.list_state_with_ttl("list", "string", ttl)?
            } else {
                handle.list_state("list", "string")?
            },
            map: if timed {
                handle.map_state_with_ttl("map", "string", "string", ttl)?
            } else {
                handle.map_state("map", "string", "string")?
            },
            history: handle.list_state("history", "long")?,
            chain: handle.map_state("chain", "long", "long")?,
            cancel: handle.map_state("cancel", "long", "long")?,
            trace: handle.value_state("trace", "boolean")?,
            order: handle.value_state("order", "boolean")?,
            timers: handle.timers(),
            fired: 0,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Op>,
        timer_values: TimerValues,
        out: &mut Emitter<Value>,
    ) -> Result<()> {
        for op in rows {
            self.run(key, op, timer_values, out)?;
        }
        Ok(())
    }

    fn handle_expired_timer(
        &mut self,
        key: &Key,
        timer_values: TimerValues,
        info: ExpiredTimerInfo,
        out: &mut Emitter<Value>,
    ) -> Result<()> {
        let ts = info.expiry_time_ms();
        let timers = self.timers.list()?;
        self.history.append_value(&ts)?;
        let history = self.history.get()?.collect::<Result<Vec<_>>>()?;
        if let Some(then) = self.chain.get_value(&ts)? {
            self.chain.remove_key(&ts)?;
            self.timers.register(then)?;
        }
        if let Some(cancel) = self.cancel.get_value(&ts)? {
            self.cancel.remove_key(&ts)?;
            self.timers.delete(cancel)?;
        }
        let mut fired = row(
            key,
            "fired",
            json!({ "ts": ts, "timers": timers, "history": history }),
        );
        if self.order.get()?.unwrap_or(false) {
            self.fired += 1;
            fired["seq"] = json!(self.fired);
        }
        if self.trace.get()?.unwrap_or(false) {
            fired["tp"] = json!(timer_values.current_processing_time_ms());
            fired["wm"] = json!(timer_values.current_watermark_ms());
        }
        out.emit(fired)
    }
}

statebox_sdk::export_processor!(TimerOps);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn op(json: &str) -> Op {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn fired_rows_show_the_listed_timers_history_and_chain() {
        let mut h = TestHarness::<TimerOps>::new(TimeMode::ProcessingTime).unwrap();
        h.handle_input_rows(
            "a",
            vec![
                op(r#"{"op":"register","ts":2000,"then":5000}"#),
                op(r#"{"op":"register","ts":1000}"#),
            ],
        )
        .unwrap();
        h.set_processing_time(2_000);
        let fired = h.fire_expired_timers().unwrap();
        assert_eq!(
            fired,
            vec![
                json!({"k":"a","op":"fired","ts":1000,"timers":[1000,2000],"history":[1000]}),
                json!({"k":"a","op":"fired","ts":2000,"timers":[2000],"history":[1000,2000]}),
            ]
        );
        assert_eq!(h.timers("a"), vec![5_000]);
    }

    #[test]
    fn ttl_ops_read_back() {
        let mut h = TestHarness::<TimerOps>::new(TimeMode::ProcessingTime).unwrap();
        h.set_processing_time(1_000);
        let out = h
            .handle_input_rows(
                "a",
                vec![
                    op(r#"{"op":"set","v":"x"}"#),
                    op(r#"{"op":"append","vs":["p","q"]}"#),
                    op(r#"{"op":"map-update","mk":"m","v":"1"}"#),
                    op(r#"{"op":"exists"}"#),
                ],
            )
            .unwrap();
        assert_eq!(
            out,
            vec![json!({"k":"a","op":"exists","values":["value","list","map"]})]
        );
        h.set_processing_time(1_000 + TTL_MS as i64);
        let out = h
            .handle_input_rows("a", vec![op(r#"{"op":"get"}"#), op(r#"{"op":"list-get"}"#)])
            .unwrap();
        assert_eq!(
            out,
            vec![
                json!({"k":"a","op":"get","value":null}),
                json!({"k":"a","op":"list-get","values":[]}),
            ]
        );
    }

    #[test]
    fn time_mode_none_declares_no_ttl() {
        let mut h = TestHarness::<TimerOps>::new(TimeMode::None).unwrap();
        let out = h
            .handle_input_rows(
                "a",
                vec![op(r#"{"op":"set","v":"x"}"#), op(r#"{"op":"get"}"#)],
            )
            .unwrap();
        assert_eq!(out, vec![json!({"k":"a","op":"get","value":"x"})]);
        assert!(
            h.handle_input_rows("a", vec![op(r#"{"op":"register","ts":1}"#)])
                .is_err()
        );
    }
}
