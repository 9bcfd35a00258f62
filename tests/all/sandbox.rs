//! The sandbox (SPEC §10) and the lifecycle rules (SPEC §1) against the `misbehave` guest:
//! every violation fails the batch cleanly, names processor, function, key and reason,
//! commits nothing, and the next run with good input works.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use statebox_engine::EngineError;
use statebox_runtime::{CallErrorKind, Function, Limits};
use statebox_tests::{EngineQuery, Scratch, guests, runtime};

fn act(k: &str, action: &str) -> Value {
    json!({"k": k, "action": action})
}

fn counted(k: &str, count: i64) -> Value {
    json!({"k": k, "action": "ok", "detail": "", "count": count})
}

fn sorted(mut rows: Vec<Value>) -> Vec<Value> {
    rows.sort_by_key(|r| r.to_string());
    rows
}

/// Batch 0 counts k1 and k2; batch 1 has k2 `ok` then k1 `action`, which must fail the
/// batch with an error naming the processor, the function, the key and `reason`. Nothing of
/// batch 1 may be committed: after the file is fixed, both keys count 2.
fn hostile(action: &str, limits: &[&str], reason: &[&str]) {
    let s = Scratch::new();
    s.write_rows("0.jsonl", &[act("k1", "ok"), act("k2", "ok")]);
    s.write_rows("1.jsonl", &[act("k2", "ok"), act("k1", action)]);
    let mut fragments = vec!["processor `misbehave`", "handle-input-rows", r#"["k1"]"#];
    fragments.extend_from_slice(reason);
    s.run_cmd(guests::MISBEHAVE, "k")
        .args(limits)
        .run()
        .expect_error(&fragments);
    let after_batch_0 = s.output_bytes();
    assert_eq!(
        sorted(s.output_rows()),
        sorted(vec![counted("k1", 1), counted("k2", 1)]),
        "only batch 0 is in the output"
    );

    s.write_rows("1.jsonl", &[act("k2", "ok"), act("k1", "ok")]);
    s.run_cmd(guests::MISBEHAVE, "k")
        .args(limits)
        .run()
        .expect_ok();
    let out = s.output_rows();
    assert_eq!(&s.output_bytes()[..after_batch_0.len()], &after_batch_0[..]);
    assert_eq!(
        sorted(out[2..].to_vec()),
        sorted(vec![counted("k1", 2), counted("k2", 2)]),
        "the failed batch committed nothing"
    );
}

#[test]
fn an_infinite_loop_hits_the_cpu_limit() {
    let started = Instant::now();
    hostile(
        "loop",
        &["--call-timeout-ms", "200"],
        &["CPU time limit", "200ms"],
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the 200 ms limit, not the 10 s default, stopped the loop"
    );
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    hostile(
        "oom",
        &["--memory-limit-mb", "32"],
        &["memory limit of 33554432 bytes"],
    );
}

#[test]
fn unbounded_recursion_is_a_stack_overflow() {
    hostile("recurse", &[], &["stack overflow"]);
}

#[test]
fn a_panic_message_reaches_the_error() {
    hostile(
        "panic",
        &[],
        &["trapped", "misbehave deliberately panicked for key k1"],
    );
}

#[test]
fn huge_output_hits_the_output_limit() {
    hostile("huge-output", &[], &["output limit of 16777216 bytes"]);
}

#[test]
fn a_processor_error_fails_the_batch() {
    hostile("fail", &[], &["misbehave deliberately failed for key k1"]);
}

#[test]
fn a_row_not_matching_the_output_schema_names_the_column() {
    hostile("bad-output", &[], &["output schema", "column `count`"]);
}

/// Runs one batch of misbehave rows through the CLI and returns the output rows by key.
fn run_actions(rows: &[Value], extra: &[&str]) -> Vec<Value> {
    let s = Scratch::new();
    s.write_rows("0.jsonl", rows);
    s.run_cmd(guests::MISBEHAVE, "k")
        .args(extra)
        .run()
        .expect_ok();
    let mut out = s.output_rows();
    out.sort_by_key(|r| r["k"].to_string());
    out
}

#[test]
fn the_guest_sees_no_files_environment_or_arguments() {
    let out = run_actions(&[act("e", "env"), act("f", "read-file")], &[]);
    let env = &out[0];
    assert_eq!(env["action"], "env");
    assert_eq!(env["count"], 0, "no variables or arguments: {env}");
    assert!(
        env["detail"]
            .as_str()
            .unwrap()
            .starts_with("vars=[] args=[]"),
        "{env}"
    );
    let files = &out[1];
    assert_eq!(files["action"], "read-file");
    assert_eq!(
        files["count"], 0,
        "every file system access failed: {files}"
    );
}

#[test]
fn state_and_timers_are_refused_outside_handlers() {
    let out = run_actions(
        &[
            act("d", "declare"),
            act("i", "init-report"),
            act("t", "timer"),
        ],
        &[],
    );
    let detail = |i: usize| out[i]["detail"].as_str().unwrap().to_owned();
    // Declaring state, or delete-if-exists, in a handler.
    assert_eq!(out[0]["count"], 0, "{}", out[0]);
    let declare = detail(0);
    assert!(
        declare.contains("WrongPhase") && declare.contains("must be declared in init"),
        "{declare}"
    );
    assert!(
        declare.contains("delete-if-exists(\"count\") is allowed only in init"),
        "{declare}"
    );
    // State touched in init; timers in time mode none.
    let init = detail(1);
    assert!(
        init.contains("state: WrongPhase") && init.contains("not allowed in init"),
        "{init}"
    );
    assert!(init.contains("timers: UnsupportedInTimeMode"), "{init}");
    // Declaring a name again: fine with the same kind and schema, refused otherwise.
    assert!(init.contains("again: ok ()"), "{init}");
    assert!(init.contains("schema change: InvalidUse"), "{init}");
    assert!(init.contains("kind change: InvalidUse"), "{init}");
    assert!(init.contains("invalid schema: InvalidSchema"), "{init}");
    for fragment in ["`count`", "`other`", "lng"] {
        assert!(init.contains(fragment), "names {fragment}: {init}");
    }
    assert_eq!(out[2]["count"], 0, "{}", out[2]);
    let timer = detail(2);
    assert_eq!(
        timer.matches("UnsupportedInTimeMode").count(),
        3,
        "register, list and delete all refused: {timer}"
    );
    assert!(timer.contains("time mode none"), "{timer}");

    // With a time mode, timers in init are refused for the phase.
    let out = run_actions(
        &[act("i", "init-report")],
        &["--time-mode", "processing-time"],
    );
    let init = out[0]["detail"].as_str().unwrap();
    assert!(init.contains("timers: WrongPhase"), "{init}");
}

/// The guest's clock is the batch timestamp and its randomness depends only on batch and
/// key, so two runs of the same batch see the same values.
#[test]
fn clock_and_randomness_are_virtual_and_deterministic() {
    let rows: Vec<Value> = ["a", "b", "c"]
        .iter()
        .flat_map(|k| [act(k, "clock"), act(k, "random")])
        .collect();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut q = EngineQuery::open(guests::MISBEHAVE, "k", 2, Default::default());
        let (reports, out) = q.try_batch(&rows).expect("batch runs");
        let timestamp = reports[0].commit.timestamp_ms;
        for row in out.iter().filter(|r| r["action"] == "clock") {
            assert_eq!(
                row["count"], timestamp,
                "clock is the batch timestamp: {row}"
            );
        }
        let random: Vec<(Value, Value)> = sorted(out)
            .into_iter()
            .filter(|r| r["action"] == "random")
            .map(|r| (r["k"].clone(), r["count"].clone()))
            .collect();
        assert_eq!(random.len(), 3);
        runs.push(random);
        // Make sure the second run gets another batch timestamp.
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(runs[0], runs[1], "same batch and key, same random numbers");
}

/// The SDK's processors take many keys per call; each key draws the same random numbers as
/// when it is called alone, however the keys of a call are interleaved.
#[test]
fn randomness_per_key_is_the_same_batched_or_key_by_key() {
    let rows: Vec<Value> = ["a", "b", "c", "d"]
        .iter()
        .flat_map(|k| [act(k, "random-host"), act(k, "random-host")])
        .collect();
    let draws = |per_key_calls: bool| {
        let runtime = statebox_runtime::Runtime::new(statebox_runtime::RuntimeConfig {
            per_key_calls,
            ..statebox_tests::runtime_config(Limits::default())
        })
        .expect("create a runtime");
        let mut q = EngineQuery::open_on(Arc::new(runtime), guests::MISBEHAVE, "k", 1);
        assert_eq!(q.processor().is_batched(), !per_key_calls);
        let (_, out) = q.try_batch(&rows).expect("batch runs");
        sorted(out)
            .into_iter()
            .map(|r| (r["k"].clone(), r["count"].clone()))
            .collect::<Vec<_>>()
    };
    let batched = draws(false);
    assert_eq!(batched.len(), 8);
    assert_ne!(batched[0].1, batched[1].1, "a key's stream advances");
    assert_eq!(batched, draws(true));
}

/// `get-query-info`: the query id is fixed by the checkpoint, the run id is new per start, and
/// the batch id is the batch in progress.
#[test]
fn query_info_names_the_query_the_run_and_the_batch() {
    let mut q = EngineQuery::open(guests::MISBEHAVE, "k", 2, Default::default());
    let seen = |out: Vec<Value>| {
        let row = &out[0];
        let detail = row["detail"].as_str().unwrap().to_owned();
        let (query, run) = detail.split_once(' ').expect("query id and run id");
        (
            query.to_owned(),
            run.to_owned(),
            row["count"].as_i64().unwrap(),
        )
    };
    let (query, run, batch) = seen(q.batch(&[act("a", "query-info")]));
    assert_eq!(batch, 0);
    assert_eq!(query.len(), 36, "a UUID: {query}");
    assert_ne!(query, run);
    let (query1, run1, batch1) = seen(q.batch(&[act("b", "query-info")]));
    assert_eq!(
        (query1.as_str(), run1.as_str(), batch1),
        (query.as_str(), run.as_str(), 1)
    );
    q.reopen();
    let (query2, run2, batch2) = seen(q.batch(&[act("a", "query-info")]));
    assert_eq!(query2, query, "the query id survives a restart");
    assert_ne!(run2, run, "each start is a new run");
    assert_eq!(batch2, 2);
}

/// In a batched call a guest names a key only by its index among the call's entries; an
/// index past them is refused and the selected key stays the same.
#[test]
fn a_guest_cannot_select_a_key_outside_its_batched_call() {
    let out = run_actions(
        &[act("k1", "ok"), act("k1", "ok"), act("k2", "use-key")],
        &[],
    );
    let k2 = &out[2];
    assert_eq!(k2["action"], "use-key", "{out:?}");
    let detail = k2["detail"].as_str().unwrap();
    assert!(
        detail.contains("InvalidUse") && detail.contains("use-key(4294967295)"),
        "{detail}"
    );
    // Still on k2, whose count is 0 (k1's is 2).
    assert!(detail.contains("ok 0"), "{detail}");
    assert_eq!(k2["count"], 1, "{k2}");
}

/// A batch that dies half way is re-run from its plan with the same timestamp, so the guest's
/// clock reads the same, and its randomness is that of a run never interrupted (SPEC §6).
#[test]
fn a_batch_replayed_after_kill_9_sees_the_same_clock_and_randomness() {
    // Batch 1 gets stuck on key `stuck`, after the other keys ran; the process is killed
    // there, after the batch was planned and before it committed.
    let stuck = r#"{"k":"stuck","action":"loop"}"#;
    let unstuck = r#"{"k":"stuck","action":  "ok"}"#;
    assert_eq!(
        stuck.len(),
        unstuck.len(),
        "the planned byte range stays valid"
    );
    let batch_1 = |last: &str| {
        let mut text: String = [
            act("a", "clock"),
            act("a", "random"),
            act("a", "ok"),
            act("b", "random"),
        ]
        .iter()
        .map(|r| format!("{r}\n"))
        .collect();
        text.push_str(last);
        text.push('\n');
        text
    };
    let limits = ["--partitions", "1", "--call-timeout-ms", "60000"];

    let s = Scratch::new();
    s.write_rows("0.jsonl", &[act("a", "ok")]);
    s.write_text("1.jsonl", &batch_1(stuck));
    let mut child = s
        .run_cmd(guests::MISBEHAVE, "k")
        .args(limits)
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statebox");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("batch 0:") {
        line.clear();
        let n = stderr.read_line(&mut line).unwrap();
        assert!(n > 0, "statebox ended before batch 0 committed");
    }
    // Batch 1 is planned right after batch 0 commits; give it ample time to reach `stuck`.
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().expect("kill -9 statebox");
    child.wait().unwrap();
    let killed_at = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(
        s.output_rows(),
        [counted("a", 1)],
        "batch 1 never committed"
    );
    std::thread::sleep(Duration::from_millis(20));

    s.write_text("1.jsonl", &batch_1(unstuck));
    s.run_cmd(guests::MISBEHAVE, "k")
        .args(limits)
        .run()
        .expect_ok();
    let out = s.output_rows();
    let clock = out[1]["count"].as_i64().unwrap();
    assert!(
        clock < killed_at,
        "the replay reads the planned batch timestamp {clock}, not a new time (killed at {killed_at})"
    );

    // The same input never interrupted: the same random numbers.
    let reference = Scratch::new();
    reference.write_rows("0.jsonl", &[act("a", "ok")]);
    reference.write_text("1.jsonl", &batch_1(unstuck));
    reference
        .run_cmd(guests::MISBEHAVE, "k")
        .args(limits)
        .run()
        .expect_ok();
    let expected = reference.output_rows();
    assert_eq!(out.len(), expected.len());
    for (got, want) in out.iter().zip(&expected) {
        if got["action"] == "clock" {
            continue;
        }
        assert_eq!(got, want);
    }
    assert_eq!(
        out[3],
        counted("a", 2),
        "state of the killed attempt was not kept"
    );
}

/// In one process, as a service runs queries, a failed batch leaves the query usable: a
/// trapped instance is replaced, an instance that returned an error is kept, and the fixed
/// input runs with nothing of the failed attempt kept, even state written by another key
/// of the same instance before the failure.
#[test]
fn a_query_recovers_in_process_after_a_trap_or_an_error() {
    let limits = Limits {
        call_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let mut q = EngineQuery::open(guests::MISBEHAVE, "k", 1, limits);
    q.batch(&[act("k1", "ok"), act("k2", "ok")]);
    let kind = |k: &CallErrorKind| match k {
        CallErrorKind::Trap(_) => "trap",
        CallErrorKind::Failed(_) => "failed",
        CallErrorKind::BadOutput(_) => "bad output",
        _ => "other",
    };
    let cases = [
        ("panic", "trap"),
        ("loop", "trap"),
        ("recurse", "trap"),
        ("fail", "failed"),
        ("bad-output", "bad output"),
    ];
    for (round, (action, expected_kind)) in cases.into_iter().enumerate() {
        match q.try_batch(&[act("k2", "ok"), act("k1", action)]) {
            Err(EngineError::Processor(e)) => {
                assert_eq!(e.processor, "misbehave");
                assert_eq!(e.function, Function::HandleInputRows);
                assert_eq!(e.key.as_deref(), Some(r#"["k1"]"#));
                assert_eq!(kind(&e.kind), expected_kind, "{action}: {e}");
            }
            Err(e) => panic!("{action}: expected a processor error, got {e}"),
            Ok(_) => panic!("{action}: the batch should fail"),
        }
        assert_eq!(q.new_rows(), Vec::<Value>::new(), "{action}: no output");
        q.rewrite_last(&[act("k2", "ok"), act("k1", "ok")]);
        let (_, out) = q.run_available().expect("the fixed batch runs");
        let n = round as i64 + 2;
        assert_eq!(out, [counted("k2", n), counted("k1", n)], "after {action}");
    }
}

/// Queries sharing one runtime: while one tenant's calls spin until the CPU limit or run out
/// of memory, another tenant's batches run and stay exact.
#[test]
fn a_hostile_tenant_does_not_disturb_another() {
    let rt = Arc::new(runtime(Limits {
        call_timeout: Duration::from_millis(300),
        memory_bytes: 32 << 20,
        ..Limits::default()
    }));
    let mut hostile = EngineQuery::open_on(rt.clone(), guests::MISBEHAVE, "k", 2);
    let mut good = EngineQuery::open_on(rt, guests::COUNTER, "k", 2);
    let attacker = std::thread::spawn(move || {
        let mut failures = 0;
        for action in ["loop", "oom", "recurse", "loop"] {
            let rows: Vec<Value> = (0..4).map(|i| act(&format!("h{i}"), action)).collect();
            if hostile.try_batch(&rows).is_err() {
                failures += 1;
            }
            hostile.rewrite_last(&[act("h0", "ok")]);
            hostile.run_available().expect("the fixed batch runs");
        }
        failures
    });
    let mut batches = 0;
    while !attacker.is_finished() || batches < 5 {
        batches += 1;
        let rows: Vec<Value> = (0..batches)
            .flat_map(|i| [json!({"k": format!("g{i}")}), json!({"k": "all"})])
            .collect();
        let mut out = good.batch(&rows);
        out.sort_by_key(|r| r["key"].to_string());
        let mut expected: Vec<Value> = (0..batches)
            .map(|i| json!({"key": format!("g{i}"), "count": 1}))
            .collect();
        expected.push(json!({"key": "all", "count": batches}));
        expected.sort_by_key(|r| r["key"].to_string());
        assert_eq!(out, expected, "batch {batches}");
    }
    assert_eq!(attacker.join().unwrap(), 4, "every hostile batch failed");
}

/// A row emitted as valid but pretty-printed JSON (line breaks between its tokens) must not
/// break the JSON Lines output: the host re-encodes it on one line.
#[test]
fn a_pretty_printed_row_does_not_break_the_output_lines() {
    let s = Scratch::new();
    s.write_rows("0.jsonl", &[act("a", "pretty-output"), act("b", "ok")]);
    s.run_cmd(guests::MISBEHAVE, "k").run().expect_ok();
    let text = String::from_utf8(s.output_bytes()).unwrap();
    assert_eq!(text.lines().count(), 2, "one line per row:\n{text}");
    for line in text.lines() {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "output line {line:?} is not a JSON row; the output is:\n{text}"
        );
    }
    assert_eq!(
        sorted(s.output_rows()),
        sorted(vec![
            json!({"k": "a", "action": "pretty-output", "detail": "a\nb", "count": 1}),
            counted("b", 1),
        ])
    );
}

/// `statebox run --allow-http HOST:PORT` lets processors call that service and nothing
/// else; without the flag every request is denied before it leaves the host. A denied
/// request is an error row of the guest, not a failed run.
#[test]
fn statebox_run_allows_http_only_to_the_hosts_given() {
    use crate::serve::TestHttp;
    const HTTP_CALL: &str = env!("STATEBOX_GUEST_HTTP_CALL");
    let a = TestHttp::start(false);
    let b = TestHttp::start(false);
    let rows = [
        json!({"k": "a", "url": a.url("/a")}),
        json!({"k": "b", "url": b.url("/b")}),
    ];
    let denied = |row: &Value, k: &str| {
        assert_eq!(row["k"], k);
        assert_eq!(row["status"], -1, "{row}");
        assert!(
            row["error"].as_str().unwrap().contains("HttpRequestDenied"),
            "{row}"
        );
    };

    let s = Scratch::new();
    s.write_rows("0.jsonl", &rows);
    s.run_cmd(HTTP_CALL, "k").run().expect_ok();
    let out = sorted(s.output_rows());
    denied(&out[0], "a");
    denied(&out[1], "b");
    assert_eq!(
        (a.hits(), b.hits()),
        (0, 0),
        "a denied request left the host"
    );

    let s = Scratch::new();
    s.write_rows("0.jsonl", &rows);
    s.run_cmd(HTTP_CALL, "k")
        .args(["--allow-http", &a.addr])
        .run()
        .expect_ok();
    let out = sorted(s.output_rows());
    assert_eq!(
        out[0],
        json!({"k": "a", "status": 200, "body": TestHttp::BODY, "error": null})
    );
    denied(&out[1], "b");
    assert_eq!((a.hits(), b.hits()), (1, 0));

    let bad = Scratch::new()
        .run_cmd(HTTP_CALL, "k")
        .args(["--allow-http", "http://x/"])
        .run();
    assert_eq!(bad.code, Some(2), "{}", bad.stderr);
    assert!(bad.stderr.contains("invalid HTTP host"), "{}", bad.stderr);
}

/// Host calls block and the epoch deadline cannot interrupt them: an allowed request to a
/// service that never answers must still end at the call's deadline instead of holding the
/// partition's thread.
#[test]
fn an_allowed_request_that_hangs_ends_at_the_call_deadline() {
    use crate::serve::TestHttp;
    let hang = TestHttp::start(true);
    let limits = Limits {
        call_timeout: Duration::from_millis(500),
        http_hosts: vec![hang.addr.clone()],
        ..Limits::default()
    };
    let mut q = EngineQuery::open(env!("STATEBOX_GUEST_HTTP_CALL"), "k", 1, limits);
    let started = Instant::now();
    let result = q.try_batch(&[json!({"k": "h", "url": hang.url("/")})]);
    let elapsed = started.elapsed();
    assert_eq!(hang.hits(), 1, "the allowed request reached the service");
    // Measured: the response future ends at the deadline (`HttpResponseTimeout` in the
    // guest, ~500 ms); whether the guest then finishes the call or traps first at the epoch
    // deadline is a race, and both are fine: what matters is that the thread is released.
    match result {
        Ok((_, rows)) => {
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert_eq!(rows[0]["status"], -1, "{rows:?}");
            assert!(
                rows[0]["error"].as_str().unwrap().contains("Timeout"),
                "{rows:?}"
            );
        }
        Err(err) => assert!(
            err.to_string().contains("CPU time limit"),
            "the call should fail at its deadline: {err}"
        ),
    }
    assert!(
        elapsed < Duration::from_secs(3),
        "a hanging service held the call for {elapsed:?} (deadline 500ms)"
    );
}
