//! The test harness keeps the host's state, timer and TTL semantics.

use std::cell::Cell;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use statebox_sdk::ErrorKind;
use statebox_sdk::prelude::*;
use statebox_sdk::testing::TestHarness;

/// One operation for the [`Scripted`] processor to run.
#[derive(Debug, Clone, Deserialize)]
enum Op {
    SetValue(i64),
    ClearValue,
    GetValue,
    Append(Vec<Option<String>>),
    AppendOne(Option<String>),
    Put(Vec<Option<String>>),
    ClearList,
    GetList,
    MapSet(String, i64),
    MapRemove(String),
    MapClear,
    GetMap,
    Register(i64),
    Delete(i64),
    ListTimers,
}

/// What the [`Scripted`] processor observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind")]
enum Seen {
    Value {
        value: Option<i64>,
        exists: bool,
    },
    List {
        items: Vec<String>,
        exists: bool,
    },
    Map {
        entries: Vec<(String, i64)>,
        keys: Vec<String>,
        values: Vec<i64>,
        exists: bool,
    },
    Timers {
        at: Vec<i64>,
    },
    Fired {
        at: i64,
        timers: Vec<i64>,
    },
}

thread_local! {
    /// Makes the next `init` of [`Scripted`] drop the variable `v` first.
    static DELETE_V_ON_INIT: Cell<bool> = const { Cell::new(false) };
}

/// Runs the operations it is given as input rows and emits what it saw. Its variables have a
/// TTL of 100 ms whenever the time mode allows one.
struct Scripted {
    value: ValueState<i64>,
    list: ListState<Option<String>>,
    map: MapState<String, i64>,
    timers: Timers,
}

impl StatefulProcessor for Scripted {
    type Input = Op;
    type Output = Seen;
    type InitialState = i64;

    const NAME: &'static str = "scripted";
    const OUTPUT_SCHEMA: &'static str = "kind string";

    fn init(handle: &mut Handle) -> Result<Self> {
        if DELETE_V_ON_INIT.with(Cell::take) {
            handle.delete_if_exists("v")?;
        }
        let ttl = Duration::from_millis(100);
        let with_ttl = handle.time_mode() != TimeMode::None;
        Ok(Scripted {
            value: if with_ttl {
                handle.value_state_with_ttl("v", "long", ttl)?
            } else {
                handle.value_state("v", "long")?
            },
            list: if with_ttl {
                handle.list_state_with_ttl("l", "string", ttl)?
            } else {
                handle.list_state("l", "string")?
            },
            map: if with_ttl {
                handle.map_state_with_ttl("m", "string", "long", ttl)?
            } else {
                handle.map_state("m", "string", "long")?
            },
            timers: handle.timers(),
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Op>,
        _timer_values: TimerValues,
        out: &mut Emitter<Seen>,
    ) -> Result<()> {
        for op in rows {
            match op {
                Op::SetValue(v) => self.value.update(&v)?,
                Op::ClearValue => self.value.clear()?,
                Op::GetValue => out.emit(Seen::Value {
                    value: self.value.get()?,
                    exists: self.value.exists()?,
                })?,
                Op::Append(items) => self.list.append_list(&items)?,
                Op::AppendOne(item) => self.list.append_value(&item)?,
                Op::Put(items) => self.list.put(&items)?,
                Op::ClearList => self.list.clear()?,
                Op::GetList => {
                    let items = self.list.get()?.map(|item| Ok(item?.unwrap_or_default()));
                    let items = items.collect::<Result<_>>()?;
                    out.emit(Seen::List {
                        items,
                        exists: self.list.exists()?,
                    })?;
                }
                Op::MapSet(k, v) => self.map.update_value(k.as_str(), &v)?,
                Op::MapRemove(k) => self.map.remove_key(k.as_str())?,
                Op::MapClear => self.map.clear()?,
                Op::GetMap => {
                    let entries = self.map.iter()?.collect::<Result<Vec<_>>>()?;
                    for (k, v) in &entries {
                        assert!(self.map.contains_key(k.as_str())?);
                        assert_eq!(self.map.get_value(k.as_str())?, Some(*v));
                    }
                    out.emit(Seen::Map {
                        keys: self.map.keys()?.collect::<Result<_>>()?,
                        values: self.map.values()?.collect::<Result<_>>()?,
                        exists: self.map.exists()?,
                        entries,
                    })?;
                }
                Op::Register(at) => self.timers.register(at)?,
                Op::Delete(at) => self.timers.delete(at)?,
                Op::ListTimers => out.emit(Seen::Timers {
                    at: self.timers.list()?,
                })?,
            }
        }
        Ok(())
    }

    fn handle_expired_timer(
        &mut self,
        _key: &Key,
        _timer_values: TimerValues,
        info: ExpiredTimerInfo,
        out: &mut Emitter<Seen>,
    ) -> Result<()> {
        out.emit(Seen::Fired {
            at: info.expiry_time_ms(),
            timers: self.timers.list()?,
        })
    }

    fn handle_initial_state(
        &mut self,
        _key: &Key,
        row: i64,
        _timer_values: TimerValues,
    ) -> Result<()> {
        self.value.update(&row)
    }
}

fn harness(mode: TimeMode) -> TestHarness<Scripted> {
    TestHarness::new(mode).unwrap()
}

fn run(h: &mut TestHarness<Scripted>, key: &str, ops: Vec<Op>) -> Result<Vec<Seen>> {
    h.handle_input_rows(key, ops)
}

fn strings(items: &[&str]) -> Vec<Option<String>> {
    items.iter().map(|s| Some((*s).to_owned())).collect()
}

fn list_seen(items: &[&str]) -> Seen {
    Seen::List {
        items: items.iter().map(|s| (*s).to_owned()).collect(),
        exists: !items.is_empty(),
    }
}

#[test]
fn value_state_round_trips_per_key() {
    let mut h = harness(TimeMode::None);
    assert_eq!(
        run(&mut h, "a", vec![Op::GetValue]).unwrap(),
        vec![Seen::Value {
            value: None,
            exists: false
        }]
    );
    run(&mut h, "a", vec![Op::SetValue(5)]).unwrap();
    run(&mut h, "b", vec![Op::SetValue(6)]).unwrap();
    assert_eq!(h.value_state::<i64>("v", "a"), Some(5));
    run(&mut h, "a", vec![Op::ClearValue]).unwrap();
    assert_eq!(h.value_state::<i64>("v", "a"), None);
    assert_eq!(h.value_state::<i64>("v", "b"), Some(6));
}

#[test]
fn list_state_keeps_insertion_order() {
    let mut h = harness(TimeMode::None);
    let seen = run(
        &mut h,
        "a",
        vec![
            Op::Append(strings(&["x", "y"])),
            Op::AppendOne(Some("z".into())),
            Op::GetList,
            Op::Put(strings(&["p"])),
            Op::AppendOne(Some("q".into())),
            Op::GetList,
        ],
    )
    .unwrap();
    assert_eq!(
        seen,
        vec![list_seen(&["x", "y", "z"]), list_seen(&["p", "q"])]
    );
    run(&mut h, "b", vec![Op::Append(strings(&["other"]))]).unwrap();
    run(&mut h, "a", vec![Op::ClearList]).unwrap();
    assert_eq!(h.list_state::<String>("l", "a"), Vec::<String>::new());
    assert_eq!(h.list_state::<String>("l", "b"), vec!["other".to_owned()]);
}

#[test]
fn list_state_rejects_empty_lists_and_null_elements() {
    let mut h = harness(TimeMode::None);
    let err = run(&mut h, "a", vec![Op::Put(vec![])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::EmptyList);
    let err = run(&mut h, "a", vec![Op::Append(vec![])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::EmptyList);
    let err = run(&mut h, "a", vec![Op::Append(vec![Some("x".into()), None])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NullElement);
    let err = run(&mut h, "a", vec![Op::AppendOne(None)]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NullElement);
    assert!(
        h.list_state::<String>("l", "a").is_empty(),
        "a rejected write stores nothing"
    );
}

#[test]
fn long_lists_iterate_completely() {
    let mut h = harness(TimeMode::None);
    let items: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    let seen = run(&mut h, "a", vec![Op::Put(strings(&refs)), Op::GetList]).unwrap();
    assert_eq!(seen, vec![list_seen(&refs)]);
}

#[test]
fn map_state_iterates_in_key_order_per_key() {
    let mut h = harness(TimeMode::None);
    let seen = run(
        &mut h,
        "a",
        vec![
            Op::MapSet("b".into(), 2),
            Op::MapSet("c".into(), 3),
            Op::MapSet("a".into(), 1),
            Op::MapSet("b".into(), 20),
            Op::MapRemove("c".into()),
            Op::MapRemove("missing".into()),
            Op::GetMap,
        ],
    )
    .unwrap();
    assert_eq!(
        seen,
        vec![Seen::Map {
            entries: vec![("a".into(), 1), ("b".into(), 20)],
            keys: vec!["a".into(), "b".into()],
            values: vec![1, 20],
            exists: true,
        }]
    );
    run(&mut h, "z", vec![Op::MapSet("a".into(), 9)]).unwrap();
    run(&mut h, "a", vec![Op::MapClear]).unwrap();
    assert!(h.map_state::<String, i64>("m", "a").is_empty());
    assert_eq!(
        h.map_state::<String, i64>("m", "z"),
        vec![("a".to_owned(), 9)]
    );
}

#[test]
fn ttl_expires_values_entries_and_elements_separately() {
    let mut h = harness(TimeMode::ProcessingTime);
    run(
        &mut h,
        "a",
        vec![
            Op::SetValue(1),
            Op::AppendOne(Some("old".into())),
            Op::MapSet("old".into(), 1),
        ],
    )
    .unwrap();
    h.set_processing_time(50);
    run(
        &mut h,
        "a",
        vec![
            Op::AppendOne(Some("new".into())),
            Op::MapSet("new".into(), 2),
        ],
    )
    .unwrap();
    h.set_processing_time(99);
    assert_eq!(h.value_state::<i64>("v", "a"), Some(1));
    assert_eq!(
        h.list_state::<String>("l", "a"),
        vec!["old".to_owned(), "new".to_owned()]
    );

    h.set_processing_time(100);
    let seen = run(&mut h, "a", vec![Op::GetValue, Op::GetList]).unwrap();
    assert_eq!(
        seen,
        vec![
            Seen::Value {
                value: None,
                exists: false
            },
            list_seen(&["new"])
        ]
    );
    assert_eq!(
        h.map_state::<String, i64>("m", "a"),
        vec![("new".to_owned(), 2)]
    );

    // An update restarts the value's TTL; `put` restamps every element.
    run(
        &mut h,
        "a",
        vec![Op::SetValue(2), Op::Put(strings(&["x", "y"]))],
    )
    .unwrap();
    h.set_processing_time(199);
    assert_eq!(h.value_state::<i64>("v", "a"), Some(2));
    assert_eq!(h.list_state::<String>("l", "a").len(), 2);
    h.advance_processing_time(1);
    assert_eq!(h.value_state::<i64>("v", "a"), None);
    assert!(h.list_state::<String>("l", "a").is_empty());
}

#[test]
fn ttl_follows_the_watermark_in_event_time() {
    let mut h = harness(TimeMode::EventTime);
    run(&mut h, "a", vec![Op::SetValue(1)]).unwrap();
    h.set_processing_time(1_000);
    assert_eq!(h.value_state::<i64>("v", "a"), Some(1));
    h.set_watermark(100);
    assert_eq!(h.value_state::<i64>("v", "a"), None);
}

#[test]
fn ttl_needs_a_time_mode() {
    struct TtlInNone;
    impl StatefulProcessor for TtlInNone {
        type Input = ();
        type Output = Seen;
        type InitialState = NoInitialState;
        const NAME: &'static str = "ttl-in-none";
        const OUTPUT_SCHEMA: &'static str = "kind string";
        fn init(handle: &mut Handle) -> Result<Self> {
            handle.value_state_with_ttl::<i64>("v", "long", Duration::from_secs(1))?;
            Ok(TtlInNone)
        }
        fn handle_input_rows(
            &mut self,
            _: &Key,
            _: Vec<()>,
            _: TimerValues,
            _: &mut Emitter<Seen>,
        ) -> Result<()> {
            Ok(())
        }
    }
    let err = TestHarness::<TtlInNone>::new(TimeMode::None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::UnsupportedInTimeMode);
    assert!(TestHarness::<TtlInNone>::new(TimeMode::ProcessingTime).is_ok());
}

#[test]
fn timers_fire_in_ascending_order_for_any_key() {
    let mut h = harness(TimeMode::ProcessingTime);
    run(
        &mut h,
        "b",
        vec![Op::Register(200), Op::Register(200), Op::Register(300)],
    )
    .unwrap();
    run(
        &mut h,
        "a",
        vec![Op::Register(250), Op::Register(100), Op::Delete(7)],
    )
    .unwrap();
    assert_eq!(
        run(&mut h, "a", vec![Op::ListTimers]).unwrap(),
        vec![Seen::Timers { at: vec![100, 250] }]
    );
    assert_eq!(h.timers("b"), vec![200, 300]);

    h.advance_processing_time(250);
    assert_eq!(h.timer_values(), TimerValues::new(250, -1));
    let fired = h.fire_expired_timers().unwrap();
    // The firing timer is still listed inside its handler.
    assert_eq!(
        fired,
        vec![
            Seen::Fired {
                at: 100,
                timers: vec![100, 250]
            },
            Seen::Fired {
                at: 200,
                timers: vec![200, 300]
            },
            Seen::Fired {
                at: 250,
                timers: vec![250]
            },
        ]
    );
    assert!(h.timers("a").is_empty());
    assert_eq!(h.timers("b"), vec![300]);
    assert!(h.fire_expired_timers().unwrap().is_empty());
}

#[test]
fn event_time_timers_follow_the_watermark() {
    let mut h = harness(TimeMode::EventTime);
    run(&mut h, "a", vec![Op::Register(50)]).unwrap();
    h.set_processing_time(1_000);
    assert!(h.fire_expired_timers().unwrap().is_empty());
    h.set_watermark(50);
    assert_eq!(
        h.fire_expired_timers().unwrap(),
        vec![Seen::Fired {
            at: 50,
            timers: vec![50]
        }]
    );
}

#[test]
fn timers_are_refused_in_time_mode_none() {
    let mut h = harness(TimeMode::None);
    let err = run(&mut h, "a", vec![Op::Register(1)]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedInTimeMode);
    assert_eq!(h.timer_values(), TimerValues::new(-1, -1));
}

#[test]
fn state_and_timers_are_refused_outside_handlers() {
    struct UsesStateInInit;
    impl StatefulProcessor for UsesStateInInit {
        type Input = ();
        type Output = Seen;
        type InitialState = NoInitialState;
        const NAME: &'static str = "uses-state-in-init";
        const OUTPUT_SCHEMA: &'static str = "kind string";
        fn init(handle: &mut Handle) -> Result<Self> {
            let value = handle.value_state::<i64>("v", "long")?;
            assert_eq!(value.get().unwrap_err().kind(), ErrorKind::WrongPhase);
            assert_eq!(
                handle.timers().list().unwrap_err().kind(),
                ErrorKind::WrongPhase
            );
            Err(Error::msg("checked"))
        }
        fn handle_input_rows(
            &mut self,
            _: &Key,
            _: Vec<()>,
            _: TimerValues,
            _: &mut Emitter<Seen>,
        ) -> Result<()> {
            Ok(())
        }
    }
    let err = TestHarness::<UsesStateInInit>::new(TimeMode::ProcessingTime)
        .err()
        .unwrap();
    assert_eq!(err.to_string(), "checked");
}

#[test]
fn redeclaring_with_another_schema_is_refused() {
    struct Twice;
    impl StatefulProcessor for Twice {
        type Input = ();
        type Output = Seen;
        type InitialState = NoInitialState;
        const NAME: &'static str = "twice";
        const OUTPUT_SCHEMA: &'static str = "kind string";
        fn init(handle: &mut Handle) -> Result<Self> {
            handle.value_state::<i64>("v", "long")?;
            handle.value_state::<i64>("v", "long")?;
            let err = handle.value_state::<i32>("v", "int").err().unwrap();
            assert_eq!(err.kind(), ErrorKind::InvalidUse);
            let err = handle.list_state::<i64>("v", "long").err().unwrap();
            assert_eq!(err.kind(), ErrorKind::InvalidUse);
            Ok(Twice)
        }
        fn handle_input_rows(
            &mut self,
            _: &Key,
            _: Vec<()>,
            _: TimerValues,
            _: &mut Emitter<Seen>,
        ) -> Result<()> {
            Ok(())
        }
    }
    TestHarness::<Twice>::new(TimeMode::None).unwrap();
}

#[test]
fn restart_keeps_state_and_delete_if_exists_drops_it() {
    let mut h = harness(TimeMode::ProcessingTime);
    run(
        &mut h,
        "a",
        vec![
            Op::SetValue(1),
            Op::AppendOne(Some("x".into())),
            Op::Register(10),
        ],
    )
    .unwrap();
    h.restart().unwrap();
    assert_eq!(h.value_state::<i64>("v", "a"), Some(1));
    assert_eq!(h.timers("a"), vec![10]);

    DELETE_V_ON_INIT.with(|flag| flag.set(true));
    h.restart().unwrap();
    assert_eq!(h.value_state::<i64>("v", "a"), None);
    assert_eq!(h.list_state::<String>("l", "a"), vec!["x".to_owned()]);

    h.close().unwrap();
    assert_eq!(
        run(&mut h, "a", vec![]).unwrap_err().kind(),
        ErrorKind::WrongPhase
    );
}

#[test]
fn initial_state_rows_reach_the_processor() {
    let mut h = harness(TimeMode::None);
    h.handle_initial_state("a", 41).unwrap();
    h.handle_initial_state_json("b", "7").unwrap();
    assert_eq!(h.value_state::<i64>("v", "a"), Some(41));
    assert_eq!(h.value_state::<i64>("v", "b"), Some(7));
    let err = h.handle_initial_state_json("c", r#""x""#).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Json);
}

#[test]
fn processors_without_initial_state_refuse_it() {
    let err = serde_json::from_str::<NoInitialState>("{}").unwrap_err();
    assert!(err.to_string().contains("does not accept initial state"));
}

#[test]
fn json_rows_decode_like_in_a_component() {
    let mut h = harness(TimeMode::None);
    let seen = h
        .handle_input_json("a", &[r#"{"SetValue":3}"#, r#""GetValue""#])
        .unwrap();
    assert_eq!(
        seen,
        vec![Seen::Value {
            value: Some(3),
            exists: true
        }]
    );
    let err = h
        .handle_input_json("a", &[r#""GetValue""#, r#"{"Nope":1}"#])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
}

#[test]
fn keys_can_have_several_columns() {
    struct KeyEcho;
    #[derive(Serialize, Debug, PartialEq)]
    struct Echo {
        user: String,
        n: i64,
        json: String,
    }
    impl StatefulProcessor for KeyEcho {
        type Input = ();
        type Output = Echo;
        type InitialState = NoInitialState;
        const NAME: &'static str = "key-echo";
        const OUTPUT_SCHEMA: &'static str = "user string, n long, json string";
        fn init(_: &mut Handle) -> Result<Self> {
            Ok(KeyEcho)
        }
        fn handle_input_rows(
            &mut self,
            key: &Key,
            _: Vec<()>,
            _: TimerValues,
            out: &mut Emitter<Echo>,
        ) -> Result<()> {
            let (user, n): (String, i64) = key.to()?;
            assert_eq!(key.get::<i64>(1)?, n);
            assert_eq!(key.as_str(), None);
            out.emit(Echo {
                user,
                n,
                json: key.json().to_owned(),
            })
        }
    }
    let mut h = TestHarness::<KeyEcho>::new(TimeMode::None).unwrap();
    let out = h.handle_input_rows(("u1", 7), vec![()]).unwrap();
    assert_eq!(
        out,
        vec![Echo {
            user: "u1".into(),
            n: 7,
            json: r#"["u1",7]"#.into()
        }]
    );
    let key = Key::from_json(r#"["u2",8]"#);
    assert_eq!(h.handle_input_rows(&key, vec![]).unwrap()[0].n, 8);
}

#[test]
fn output_rows_must_be_objects() {
    struct EmitsScalar;
    impl StatefulProcessor for EmitsScalar {
        type Input = ();
        type Output = i64;
        type InitialState = NoInitialState;
        const NAME: &'static str = "emits-scalar";
        const OUTPUT_SCHEMA: &'static str = "n long";
        fn init(_: &mut Handle) -> Result<Self> {
            Ok(EmitsScalar)
        }
        fn handle_input_rows(
            &mut self,
            _: &Key,
            _: Vec<()>,
            _: TimerValues,
            out: &mut Emitter<i64>,
        ) -> Result<()> {
            out.emit(1)
        }
    }
    let mut h = TestHarness::<EmitsScalar>::new(TimeMode::None).unwrap();
    assert_eq!(
        h.handle_input_rows("a", vec![()]).unwrap_err().kind(),
        ErrorKind::Json
    );
}

/// Emits the query info it sees, for [`query_info_reports_the_harness_batch`].
struct QueryEcho {
    query: statebox_sdk::Query,
}

impl StatefulProcessor for QueryEcho {
    const NAME: &'static str = "query-echo";
    const OUTPUT_SCHEMA: &'static str = "query_id string, run_id string, batch_id long";
    type Input = serde_json::Value;
    type Output = serde_json::Value;
    type InitialState = NoInitialState;

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(QueryEcho {
            query: handle.query(),
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        _rows: Vec<Self::Input>,
        _timer_values: TimerValues,
        out: &mut Emitter<Self::Output>,
    ) -> Result<()> {
        let info = self.query.info();
        out.emit(serde_json::json!({
            "query_id": info.query_id,
            "run_id": info.run_id,
            "batch_id": info.batch_id,
        }))
    }
}

#[test]
fn query_info_reports_the_harness_batch() {
    let mut h = TestHarness::<QueryEcho>::new(TimeMode::None).unwrap();
    let out = h
        .handle_input_rows("k", vec![serde_json::json!({})])
        .unwrap();
    assert_eq!(out[0]["batch_id"], 0);
    assert_eq!(out[0]["query_id"], "harness-query");
    h.set_batch_id(7);
    let out = h
        .handle_input_rows("k", vec![serde_json::json!({})])
        .unwrap();
    assert_eq!(out[0]["batch_id"], 7);
    assert_eq!(out[0]["run_id"], "harness-run");
}
