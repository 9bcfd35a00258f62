//! One query on several workers (`statebox run --group`): a real Kafka-protocol broker
//! (tansu) holds the input, the output and the consumer group; a real S3 server (moto) holds
//! the tasks' state snapshots and batch plans. Workers are separate `statebox` processes,
//! killed with SIGKILL, added and removed while records keep arriving.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use statebox_tests::kafka::{Broker, Record, counted_per_key, counts_in_state, produce_acked};
use statebox_tests::s3::S3;
use statebox_tests::{Rng, Scratch, StateboxRun, guests};

/// The partitions of the input topic: more tasks than workers, so every rebalance moves
/// some.
const PARTITIONS: i32 = 6;

/// A worker of group `g` with its own local directory.
struct Workers<'a> {
    broker: &'a Broker,
    s3: &'a S3,
    store: String,
    root: &'a Path,
}

impl Workers<'_> {
    fn local(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn start(&self, name: &str) -> Worker {
        let mut cmd = StateboxRun::new(guests::COUNTER)
            .args(["--input", &self.broker.url("clicks")])
            .args(["--output", &self.broker.url("counts")])
            .args(["--checkpoint".as_ref(), self.local(name).as_os_str()])
            .args(["--key", "user", "--output-key", "key"])
            .args(["--group", "g", "--member", name])
            .args(["--state-store", &self.store])
            .args(["--trigger", "interval=200ms", "--snapshot-interval", "3"])
            .args(["--max-records-per-batch", "400", "--session-timeout", "6s"])
            // tansu stalls on cooperative rebalances of three members, and never expires a
            // static member killed with -9 (see kafka_group.rs): eager, dynamic members.
            .args(["--group-assignment", "range", "--no-static-membership"])
            .command();
        for (k, v) in self.s3.env() {
            cmd.env(k, v);
        }
        let log = std::fs::File::create(self.root.join(format!("{name}.log"))).expect("a log");
        Worker(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .expect("start a worker"),
        )
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.root.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Runs a `statebox` command with the store's settings; its standard output.
    fn statebox(&self, args: &[&str]) -> String {
        let mut cmd = std::process::Command::new(statebox_tests::statebox_bin());
        cmd.args(args);
        for (k, v) in self.s3.env() {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run statebox");
        assert!(
            out.status.success(),
            "statebox {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8 output")
    }

    /// The partitions `name` last said it owns.
    fn owned(&self, name: &str) -> Vec<i32> {
        let log = self.log(name);
        let Some(line) = log.lines().rev().find(|l| l.contains(" owns partitions [")) else {
            return Vec::new();
        };
        let list = line
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map_or("", |(list, _)| list);
        list.split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect()
    }

    /// Waits until the live workers own every partition, each exactly once.
    fn wait_converged(&self, live: &[&str], limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            // With more partitions than workers, each live worker owns some.
            let each = live.iter().all(|w| !self.owned(w).is_empty());
            let mut all: Vec<i32> = live.iter().flat_map(|w| self.owned(w)).collect();
            all.sort_unstable();
            if each && all == (0..PARTITIONS).collect::<Vec<_>>() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the group did not give {live:?} every partition within {limit:?} (they own \
                 {all:?}); their logs:\n{}",
                live.iter()
                    .map(|w| format!("--- {w} ---\n{}", self.log(w)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A broker with the input and output topics, an S3 server with the `state` bucket, and a
/// scratch directory for the workers.
fn world() -> (Broker, S3, Scratch) {
    let broker = Broker::start();
    broker.create_topic("clicks", PARTITIONS);
    broker.create_topic("counts", PARTITIONS);
    let s3 = S3::start();
    s3.create_bucket("state");
    (broker, s3, Scratch::new())
}

/// A worker process, killed when dropped (a failing test leaves none running).
struct Worker(Child);

impl Deref for Worker {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends SIGINT (a clean stop after each task's batch) and waits for the exit.
fn stop(mut child: Worker) {
    let pid = child.id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().expect("poll a worker") {
            assert!(status.success(), "a worker stopped with {status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "a worker did not stop within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The committed output records (a correct `read_committed` consumer's view: tansu also
/// shows records of aborted transactions, which the raw log's markers tell apart).
fn committed_output(broker: &Broker) -> Vec<Record> {
    let (committed, _aborted) = broker.committed_offsets("counts", PARTITIONS);
    let committed: std::collections::BTreeSet<(i32, i64)> = committed.into_iter().collect();
    broker
        .read_all("counts", "read_committed")
        .into_iter()
        .filter(|r| committed.contains(&(r.partition, r.offset)))
        .collect()
}

/// For each task, the local checkpoint with the latest committed batch among the workers'.
fn latest_task_checkpoints(roots: &[PathBuf]) -> BTreeMap<String, PathBuf> {
    let mut best: BTreeMap<String, (u64, PathBuf)> = BTreeMap::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("tasks")) else {
            continue;
        };
        for entry in entries.flatten() {
            let dir = entry.path();
            let Ok(reader) = statebox_engine::StateReader::open(&dir) else {
                continue;
            };
            let Some(head) = reader.progress(1).ok().and_then(|p| p.last().cloned()) else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if best.get(&name).is_none_or(|(b, _)| head.batch_id > *b) {
                best.insert(name, (head.batch_id, dir));
            }
        }
    }
    best.into_iter().map(|(k, (_, d))| (k, d)).collect()
}

/// Three workers share a query; one is killed with -9 mid-batch, a fourth joins, two leave,
/// while records keep arriving. Every input record's effect is in the committed output
/// exactly once, and the tasks' final state equals one process's run over the same input.
#[test]
fn three_workers_killed_added_and_removed_count_every_record_exactly_once() {
    let (broker, s3, scratch) = world();
    broker.create_topic("single", PARTITIONS);
    let workers = Workers {
        broker: &broker,
        s3: &s3,
        store: "s3://state/query".into(),
        root: scratch.path(),
    };

    // Production: 120 rows every 50 ms (or as fast as the broker acknowledges them), keyed
    // by user, until told to stop.
    let done = Arc::new(AtomicBool::new(false));
    let producer = {
        let done = done.clone();
        let producer = broker.producer();
        std::thread::spawn(move || {
            let mut rng = Rng::new(11);
            let mut produced: BTreeMap<String, i64> = BTreeMap::new();
            let mut seq = 0u64;
            while !done.load(Ordering::SeqCst) {
                let rows: Vec<(String, serde_json::Value)> = (0..120)
                    .map(|_| {
                        seq += 1;
                        let user = format!("u{}", rng.below(300));
                        (user.clone(), json!({"user": user, "seq": seq}))
                    })
                    .collect();
                for (user, _) in &rows {
                    *produced.entry(user.clone()).or_default() += 1;
                }
                produce_acked(&producer, "clicks", &rows);
                std::thread::sleep(Duration::from_millis(50));
            }
            produced
        })
    };
    let logs = || {
        ["w1", "w2", "w3", "w4", "w5"]
            .iter()
            .map(|w| format!("--- {w} ---\n{}", workers.log(w)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let progress = |what: &str, want: usize, limit: Duration| {
        let deadline = Instant::now() + limit;
        loop {
            let n = committed_output(&broker).len();
            if n >= want {
                return n;
            }
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what} ({n} of {want} output records); the workers' logs:\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    let converge = Duration::from_secs(60);
    let w1 = workers.start("w1");
    let w2 = workers.start("w2");
    let w3 = workers.start("w3");
    workers.wait_converged(&["w1", "w2", "w3"], converge);
    let seen = progress("output from three workers", 200, Duration::from_secs(60));

    // Kill -9 one worker while its tasks run batches; its partitions move after the
    // session timeout, and their new owners restore from S3 and replay.
    let mut w2 = w2;
    w2.kill().expect("kill -9 a worker");
    w2.wait().expect("reap it");
    workers.wait_converged(&["w1", "w3"], converge);
    let seen = progress("output after the kill", seen + 400, Duration::from_secs(90));

    // A fourth worker joins and takes some tasks.
    let w4 = workers.start("w4");
    workers.wait_converged(&["w1", "w3", "w4"], converge);
    let seen = progress(
        "output with a fourth worker",
        seen + 400,
        Duration::from_secs(90),
    );

    // Two leave cleanly, one after the other (tansu's coordinator can lose a member that
    // leaves while a rebalance for another is under way); the one left takes everything.
    stop(w1);
    workers.wait_converged(&["w3", "w4"], converge);
    stop(w3);
    workers.wait_converged(&["w4"], converge);
    progress("output after two left", seen + 400, Duration::from_secs(90));

    done.store(true, Ordering::SeqCst);
    let produced = producer.join().expect("the producer");
    let input: i64 = produced.values().sum();

    // The remaining worker, and one more, catch up with everything produced.
    let w5 = workers.start("w5");
    workers.wait_converged(&["w4", "w5"], converge);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let counted: i64 = counted_per_key(&committed_output(&broker)).values().sum();
        assert!(
            counted <= input,
            "more counted ({counted}) than produced ({input}): a batch was delivered twice"
        );
        if counted == input {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{counted} of {input} records counted after 120 s; the workers' logs:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    stop(w4);
    stop(w5);

    // A worker's tasks share its state cache and memtable room: each task says, when it
    // opens, how many tasks share each then. Never more than the partitions; and w4, which
    // owned every partition for a while, ran several at once.
    let shares = |w: &str, what: &str| -> Vec<usize> {
        workers
            .log(w)
            .lines()
            .filter_map(|l| {
                let (head, _) = l.split_once(&format!(" tasks share the {what}"))?;
                head.rsplit_once("; ")?.1.parse().ok()
            })
            .collect()
    };
    for what in ["state cache's", "memtables of one database"] {
        for w in ["w1", "w2", "w3", "w4", "w5"] {
            let counts = shares(w, what);
            assert!(
                !counts.is_empty(),
                "{w} names no shared {what}:\n{}",
                logs()
            );
            assert!(
                counts
                    .iter()
                    .all(|&n| (1..=PARTITIONS as usize).contains(&n)),
                "{w}, {what}: {counts:?}"
            );
        }
        let w4 = shares("w4", what);
        assert!(w4.iter().any(|&n| n >= 2), "{what}: {w4:?}");
    }

    // Exactly once: per key, the committed output's counts add up to what was produced.
    let output = committed_output(&broker);
    assert_eq!(counted_per_key(&output), produced, "output per key");

    // The tasks' final state (each task's latest checkpoint among the workers) equals a
    // single process's run over the same input.
    let roots: Vec<PathBuf> = ["w1", "w2", "w3", "w4", "w5"]
        .iter()
        .map(|w| workers.local(w))
        .collect();
    let tasks = latest_task_checkpoints(&roots);
    assert_eq!(
        tasks.len(),
        PARTITIONS as usize,
        "tasks: {:?}",
        tasks.keys()
    );
    let mut group_state = BTreeMap::new();
    for dir in tasks.values() {
        for (key, count) in counts_in_state(dir) {
            assert!(
                group_state.insert(key.clone(), count).is_none(),
                "key {key} has state in two tasks"
            );
        }
    }
    let single = scratch.path().join("single");
    StateboxRun::new(guests::COUNTER)
        .args(["--input", &broker.url("clicks")])
        .args(["--output", &broker.url("single")])
        .args(["--checkpoint".as_ref(), single.as_os_str()])
        .args(["--key", "user", "--output-key", "key"])
        .run()
        .expect_ok();
    assert_eq!(group_state, counts_in_state(&single), "state per key");
    assert_eq!(group_state, produced);
    for w in ["w1", "w2", "w3", "w4", "w5"] {
        let log = workers.log(w);
        assert!(!log.contains("panicked"), "worker {w} panicked:\n{log}");
    }

    // `statebox group status`: every task, its owner generation, snapshot and lag (none
    // left: everything produced was planned), and the workers that ran.
    let status = workers.statebox(&[
        "group",
        "status",
        "--input",
        &broker.url("clicks"),
        "--group",
        "g",
        "--state-store",
        &workers.store,
    ]);
    let status: serde_json::Value = serde_json::from_str(&status).expect("status is JSON");
    let tasks_status = status["tasks"].as_array().expect("tasks");
    assert_eq!(tasks_status.len(), PARTITIONS as usize, "{status}");
    for t in tasks_status {
        assert!(t["owner_generation"].as_u64().unwrap_or(0) >= 1, "{t}");
        assert_eq!(t["lag"], 0, "{t}");
        assert!(t["last_snapshot_batch"].is_u64(), "{t}");
    }
    let members: Vec<&str> = status["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter_map(|w| w["member"].as_str())
        .collect();
    assert_eq!(members, ["w1", "w2", "w3", "w4", "w5"], "{status}");

    // `statebox state read` of a task in the store: its latest snapshot, a prefix of the
    // task's history, so every count is at most the final one.
    let task = format!("{}/tasks/clicks-0", workers.store);
    let rows = workers.statebox(&["state", "read", "--checkpoint", &task, "--var", "count"]);
    let mut read = 0;
    for line in rows.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON row");
        let key = row["key"]["user"].as_str().expect("a user key");
        let count = row["value"].as_i64().expect("a count");
        assert!(
            count >= 1 && count <= group_state[key],
            "snapshot count {count} of {key}, final {}",
            group_state[key]
        );
        read += 1;
    }
    assert!(read > 0, "the snapshot of clicks-0 holds no counts");
    let sql = workers.statebox(&[
        "sql",
        "--checkpoint",
        &task,
        "--format",
        "jsonl",
        "SELECT count(*) AS n FROM read_statestore(stateVarName => 'count')",
    ]);
    let n: serde_json::Value = serde_json::from_str(sql.trim()).expect("one JSON row");
    assert_eq!(n["n"], read, "statebox sql over the task's snapshot");
    eprintln!(
        "{input} records over {PARTITIONS} tasks, {} committed output records",
        output.len()
    );
}

/// A worker stopped (SIGSTOP) long enough for the group to give its tasks to another, then
/// woken with input waiting: it cannot write state or output for the tasks it lost. Its
/// producer was fenced by the new owner's, its owner generation by the new owner's claim;
/// every snapshot written after it stopped is the new owner's, and the output still counts
/// every record exactly once.
#[test]
fn a_stale_worker_woken_after_its_tasks_moved_writes_nothing() {
    let (broker, s3, scratch) = world();
    let workers = Workers {
        broker: &broker,
        s3: &s3,
        store: "s3://state/stale".into(),
        root: scratch.path(),
    };
    let mut rng = Rng::new(5);
    let mut produced: BTreeMap<String, i64> = BTreeMap::new();
    let mut produce = |n: usize| {
        let rows: Vec<(String, serde_json::Value)> = (0..n)
            .map(|i| {
                let user = format!("u{}", rng.below(50));
                (user.clone(), json!({"user": user, "i": i}))
            })
            .collect();
        for (user, _) in &rows {
            *produced.entry(user.clone()).or_default() += 1;
        }
        broker.produce("clicks", &rows);
    };
    let counted = || -> i64 { counted_per_key(&committed_output(&broker)).values().sum() };
    let wait_counted = |want: i64, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let n = counted();
            assert!(
                n <= want,
                "{n} counted, more than the {want} produced ({what})"
            );
            if n == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {n} of {want} counted; logs:\n--- w1 ---\n{}\n--- w2 ---\n{}",
                workers.log("w1"),
                workers.log("w2")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    produce(300);
    let w1 = workers.start("w1");
    workers.wait_converged(&["w1"], Duration::from_secs(60));
    wait_counted(300, "w1 alone");

    // w1 stops answering; the group gives its tasks to w2 after the session timeout.
    let pid = w1.id().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let stopped_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    produce(200);
    let w2 = workers.start("w2");
    workers.wait_converged(&["w2"], Duration::from_secs(60));
    wait_counted(500, "w2 after taking over");

    // Input waits for the stale worker when it wakes: its next batch is planned at once.
    produce(100);
    signal("-CONT");
    wait_counted(600, "after w1 woke");
    // Give w1 time to act on what it believes it owns, then stop both.
    std::thread::sleep(Duration::from_secs(3));
    stop(w2);
    let mut w1 = w1;
    let _ = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status();
    let deadline = Instant::now() + Duration::from_secs(60);
    while w1.try_wait().expect("poll w1").is_none() {
        assert!(Instant::now() < deadline, "w1 did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }

    assert_eq!(counted_per_key(&committed_output(&broker)), produced);
    let log = workers.log("w1");
    assert!(
        log.contains("fenced") || log.contains("owns partitions []"),
        "the stale worker neither saw itself fenced nor lost its partitions:\n{log}"
    );
    // Every snapshot taken after w1 stopped was taken by a later owner generation.
    let store = statebox_cluster::StateStore::open_with(&workers.store, s3.env()).unwrap();
    for p in 0..PARTITIONS {
        let task = store.task(&format!("clicks-{p}")).unwrap();
        for batch in task.snapshot_batches().unwrap() {
            let Some(m) = task.snapshot(batch).unwrap() else {
                continue;
            };
            if m.created_at_ms > stopped_at_ms {
                assert!(
                    m.generation >= 2,
                    "clicks-{p}: snapshot of batch {batch} by stale generation {}",
                    m.generation
                );
            }
        }
    }
}
