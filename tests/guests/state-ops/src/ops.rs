//! The processor: one state operation per input row (see the crate docs).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use statebox_sdk::prelude::*;
use statebox_sdk::state::Iter;

/// One input row.
#[derive(Debug, Default, Deserialize)]
pub struct Op {
    /// The operation.
    pub op: String,
    /// A value operand.
    #[serde(default)]
    pub v: Option<i64>,
    /// A list operand.
    #[serde(default)]
    pub vs: Option<Vec<Option<i64>>>,
    /// A map user key.
    #[serde(default)]
    pub mk: Option<String>,
    /// A count.
    #[serde(default)]
    pub n: Option<i64>,
    /// Raw JSON text for `record-update`.
    #[serde(default)]
    pub j: Option<String>,
}

/// The row emitted per operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    /// The grouping key.
    pub k: String,
    /// The operation.
    pub op: String,
    /// `{"ok": ...}` or `{"err": ..., "message": ...}`, as JSON text.
    pub result: String,
}

/// The conformance processor. See the [crate docs](crate). With `HOLD` its writes are
/// held back and sent together ([`StatefulProcessor::HOLD_WRITES`]).
pub struct StateOps<const HOLD: bool = false> {
    value: ValueState<Option<i64>>,
    list: ListState<Option<i64>>,
    map: MapState<String, Option<i64>>,
    record: ValueState<Value>,
    timers: Timers,
    kept: Option<Iter<Option<i64>>>,
}

fn missing(what: &str, op: &str) -> Error {
    Error::msg(format!("operation `{op}` needs `{what}`"))
}

fn collect<T>(iter: impl Iterator<Item = Result<T>>) -> Result<Vec<T>> {
    iter.collect()
}

impl<const HOLD: bool> StateOps<HOLD> {
    fn kept(&mut self) -> Result<&mut Iter<Option<i64>>> {
        self.kept
            .as_mut()
            .ok_or_else(|| Error::msg("no iterator was kept"))
    }

    fn run(&mut self, op: &Op) -> Result<Value> {
        let v = || op.v;
        let vs = || op.vs.clone().ok_or_else(|| missing("vs", &op.op));
        let mk = || op.mk.clone().ok_or_else(|| missing("mk", &op.op));
        let n = || op.n.ok_or_else(|| missing("n", &op.op));
        Ok(match op.op.as_str() {
            "value-get" => json!(self.value.get()?.flatten()),
            "value-exists" => json!(self.value.exists()?),
            "value-update" => json!(self.value.update(&v())?),
            "value-clear" => json!(self.value.clear()?),

            "list-append" => json!(self.list.append_value(&v())?),
            "list-append-list" => json!(self.list.append_list(&vs()?)?),
            "list-put" => json!(self.list.put(&vs()?)?),
            "list-clear" => json!(self.list.clear()?),
            "list-exists" => json!(self.list.exists()?),
            "list-get" => json!(collect(self.list.get()?)?),
            "list-append-range" => {
                let first = v().ok_or_else(|| missing("v", &op.op))?;
                let values: Vec<Option<i64>> = (first..first + n()?).map(Some).collect();
                json!(self.list.append_list(&values)?)
            }
            "list-count" => {
                let (mut count, mut sum) = (0i64, 0i64);
                let (mut first, mut last) = (None, None);
                for item in self.list.get()? {
                    let item = item?;
                    count += 1;
                    sum += item.unwrap_or(0);
                    first = first.or(Some(item));
                    last = Some(item);
                }
                json!({"count": count, "sum": sum, "first": first.flatten(), "last": last.flatten()})
            }

            "map-update" => json!(self.map.update_value(&mk()?, &v())?),
            "map-get" => json!(self.map.get_value(mk()?.as_str())?.flatten()),
            "map-contains" => json!(self.map.contains_key(mk()?.as_str())?),
            "map-remove" => json!(self.map.remove_key(mk()?.as_str())?),
            "map-clear" => json!(self.map.clear()?),
            "map-exists" => json!(self.map.exists()?),
            "map-iter" => json!(collect(self.map.iter()?)?),
            "map-keys" => json!(collect(self.map.keys()?)?),
            "map-values" => json!(collect(self.map.values()?)?),
            "map-fill" => {
                let first = v().unwrap_or(0);
                for i in first..first + n()? {
                    self.map.update_value(&format!("m{i:07}"), &Some(i))?;
                }
                Value::Null
            }
            "map-remove-evens" => {
                let first = v().unwrap_or(0);
                for i in (first..first + n()?).filter(|i| i % 2 == 0) {
                    self.map.remove_key(&format!("m{i:07}"))?;
                }
                Value::Null
            }
            "map-count" => {
                let (mut count, mut sum) = (0i64, 0i64);
                for entry in self.map.iter()? {
                    let (_, value) = entry?;
                    count += 1;
                    sum += value.unwrap_or(0);
                }
                json!({"count": count, "sum": sum})
            }

            "record-update" => {
                let text = op.j.as_deref().ok_or_else(|| missing("j", &op.op))?;
                let value: Value = serde_json::from_str(text)?;
                json!(self.record.update(&value)?)
            }
            "record-get" => json!(self.record.get()?),

            "timer-register" => json!(self.timers.register(v().unwrap_or(0))?),
            "timer-delete" => json!(self.timers.delete(v().unwrap_or(0))?),
            "timer-list" => json!(self.timers.list()?),

            "iter-keep" => {
                self.kept = Some(self.list.get()?);
                Value::Null
            }
            "iter-next" => json!(self.kept()?.next().transpose()?),
            "iter-drain" => json!(collect(self.kept()?)?.len()),
            other => statebox_sdk::bail!("unknown operation `{other}`"),
        })
    }
}

impl<const HOLD: bool> StatefulProcessor for StateOps<HOLD> {
    type Input = Op;
    type Output = OpResult;
    type InitialState = NoInitialState;

    const NAME: &'static str = "state-ops";
    const OUTPUT_SCHEMA: &'static str = "k string, op string, result string";
    const HOLD_WRITES: bool = HOLD;

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(Self {
            value: handle.value_state("value", "long")?,
            list: handle.list_state("list", "long")?,
            map: handle.map_state("map", "string", "long")?,
            record: handle.value_state("record", "name string, visits int")?,
            timers: handle.timers(),
            kept: None,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Op>,
        _timer_values: TimerValues,
        out: &mut Emitter<OpResult>,
    ) -> Result<()> {
        let k = match key.as_str() {
            Some(k) => k.to_owned(),
            None => key.json().to_owned(),
        };
        for op in rows {
            let result = match self.run(&op) {
                Ok(value) => json!({ "ok": value }),
                Err(e) => json!({ "err": format!("{:?}", e.kind()), "message": e.message() }),
            };
            out.emit(OpResult {
                k: k.clone(),
                op: op.op,
                result: result.to_string(),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn op(name: &str, v: Option<i64>) -> Op {
        Op {
            op: name.to_owned(),
            v,
            ..Op::default()
        }
    }

    fn results(out: Vec<OpResult>) -> Vec<Value> {
        out.iter()
            .map(|r| serde_json::from_str(&r.result).unwrap())
            .collect()
    }

    #[test]
    fn value_round_trip_and_errors_are_reported_not_raised() {
        let mut h = TestHarness::<StateOps>::new(TimeMode::None).unwrap();
        let out = h
            .handle_input_rows(
                "a",
                vec![
                    op("value-update", Some(5)),
                    op("value-get", None),
                    op("list-append", None),
                    op("timer-list", None),
                ],
            )
            .unwrap();
        let r = results(out);
        assert_eq!(r[1], json!({"ok": 5}));
        assert_eq!(r[2]["err"], "NullElement");
        assert_eq!(r[3]["err"], "UnsupportedInTimeMode");
    }
}
