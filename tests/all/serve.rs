//! `statebox serve` end to end (issue 6): the real binary on a free loopback port with a
//! temporary data directory, driven over HTTP. Authentication and tenant isolation, upload
//! validation, a counter pipeline giving the same output as `statebox run`, output paging,
//! stop/start, upgrades, state reads, quotas, hostile processors, and `kill -9` in the middle
//! of ingest and batches with exactly-once processing of every acknowledged row.
//!
//! (Long because it is the server's end-to-end suite; each test stands alone on its own
//! server, sharing only the helpers in `tests/src`.)

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use statebox_tests::{Scratch, component_cache, guests, interrupt, statebox_bin, wait_for};

pub(crate) const ADMIN: &str = "test-admin-token-0123456789abcdef";
const V1: &str = env!("STATEBOX_GUEST_USER_PROFILE_V1");
const V2: &str = env!("STATEBOX_GUEST_USER_PROFILE_V2");
const V3: &str = env!("STATEBOX_GUEST_USER_PROFILE_V3");

/// A running `statebox serve`.
pub(crate) struct Server {
    pub(crate) child: Option<Child>,
    pub(crate) base: String,
    pub(crate) log: PathBuf,
}

impl Server {
    /// Starts the server on `data` with extra arguments and waits until it listens.
    pub(crate) fn start(data: &Path, extra: &[&str]) -> Server {
        Server::start_with_env(data, extra, &[])
    }

    /// [`Server::start`] with extra environment variables (e.g. the engine's crash points).
    pub(crate) fn start_with_env(data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_within(data, extra, env, Duration::from_secs(120))
    }

    /// Starts the server and waits at most `limit` for it to listen; panics (killing it,
    /// with its log) if it does not.
    pub(crate) fn start_within(
        data: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
        limit: Duration,
    ) -> Server {
        std::fs::create_dir_all(data).unwrap();
        let log = data.with_extension("log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut child = Command::new(statebox_bin())
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("STATEBOX_ADMIN_TOKEN", ADMIN)
            .env("STATEBOX_CACHE_DIR", component_cache())
            .env("STATEBOX_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn statebox serve");
        // The first line names the address; read on a thread so that a server that never
        // listens fails the test after `limit` instead of hanging it.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(limit).unwrap_or_default();
        let Some(addr) = line.trim().strip_prefix("statebox serve listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the server did not listen within {limit:?}: {line}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Server {
            child: Some(child),
            base: addr.to_owned(),
            log,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `kill -9`.
    pub(crate) fn kill9(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGINT, which must stop the server cleanly.
    pub(crate) fn shut_down(mut self) -> String {
        interrupt(self.child.take().unwrap());
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A response: status and body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    #[track_caller]
    pub(crate) fn ok(self) -> Value {
        assert!(
            self.status < 300,
            "expected success, got {}: {}",
            self.status,
            self.body
        );
        self.json()
    }

    /// Asserts the status and that the error message mentions every fragment.
    #[track_caller]
    pub(crate) fn error(self, status: u16, fragments: &[&str]) -> Value {
        assert_eq!(self.status, status, "{}", self.body);
        let v = self.json();
        let message = v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        for f in fragments {
            assert!(
                message.contains(f),
                "the error should mention `{f}`: {message}"
            );
        }
        v
    }
}

pub(crate) fn try_request(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<(&str, &[u8])>,
) -> Result<Reply, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let mut req = agent.request(method, url);
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let result = match body {
        Some((content_type, bytes)) => req.set("Content-Type", content_type).send_bytes(bytes),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(e.to_string()),
    };
    let status = response.status();
    let body = response.into_string().map_err(|e| e.to_string())?;
    Ok(Reply { status, body })
}

#[track_caller]
pub(crate) fn request(
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<(&str, &[u8])>,
) -> Reply {
    try_request(method, url, token, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// A tenant's view of a server.
pub(crate) struct Api<'a> {
    pub(crate) server: &'a Server,
    pub(crate) token: String,
}

impl Api<'_> {
    pub(crate) fn get(&self, path: &str) -> Reply {
        request("GET", &self.server.url(path), Some(&self.token), None)
    }

    pub(crate) fn post(&self, path: &str, body: &Value) -> Reply {
        let bytes = body.to_string();
        request(
            "POST",
            &self.server.url(path),
            Some(&self.token),
            Some(("application/json", bytes.as_bytes())),
        )
    }

    pub(crate) fn put(&self, path: &str, body: &Value) -> Reply {
        let bytes = body.to_string();
        request(
            "PUT",
            &self.server.url(path),
            Some(&self.token),
            Some(("application/json", bytes.as_bytes())),
        )
    }

    pub(crate) fn delete(&self, path: &str) -> Reply {
        request("DELETE", &self.server.url(path), Some(&self.token), None)
    }

    pub(crate) fn upload(&self, wasm: &[u8]) -> Reply {
        request(
            "POST",
            &self.server.url("/v1/processors"),
            Some(&self.token),
            Some(("application/wasm", wasm)),
        )
    }

    /// Uploads a component file and returns its processor id.
    pub(crate) fn processor(&self, path: &str) -> String {
        let p = self.upload(&std::fs::read(path).unwrap()).ok();
        p["id"].as_str().unwrap().to_owned()
    }

    /// Creates a pipeline and returns its id.
    pub(crate) fn pipeline(&self, spec: Value) -> String {
        let p = self.post("/v1/pipelines", &spec).ok();
        p["id"].as_str().unwrap().to_owned()
    }

    pub(crate) fn rows(&self, pipeline: &str, rows: &[Value]) -> Reply {
        self.post(&format!("/v1/pipelines/{pipeline}/rows"), &json!(rows))
    }

    pub(crate) fn jsonl(&self, pipeline: &str, text: &str) -> Reply {
        request(
            "POST",
            &self.server.url(&format!("/v1/pipelines/{pipeline}/rows")),
            Some(&self.token),
            Some(("application/x-ndjson", text.as_bytes())),
        )
    }

    pub(crate) fn status(&self, pipeline: &str) -> Value {
        self.get(&format!("/v1/pipelines/{pipeline}")).ok()
    }

    /// Waits until the pipeline has committed every acknowledged row.
    #[track_caller]
    pub(crate) fn wait_processed(&self, pipeline: &str, rows: u64) -> Value {
        wait_for(
            "the pipeline to process its rows",
            Duration::from_secs(60),
            || {
                let s = self.status(pipeline);
                assert_ne!(s["status"]["state"], "failed", "{s}");
                (s["rows_processed"].as_u64() == Some(rows)).then_some(s)
            },
        )
    }

    /// Waits until the pipeline is marked failed; returns the reason.
    #[track_caller]
    pub(crate) fn wait_failed(&self, pipeline: &str) -> String {
        wait_for(
            "the pipeline to be marked failed",
            Duration::from_secs(90),
            || {
                let s = self.status(pipeline);
                (s["status"]["state"] == "failed")
                    .then(|| s["status"]["failure"].as_str().unwrap().to_owned())
            },
        )
    }

    /// Every committed output row, read page by page.
    pub(crate) fn output(&self, pipeline: &str, page: usize) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after = 0;
        loop {
            let p = self
                .get(&format!(
                    "/v1/pipelines/{pipeline}/output?after={after}&limit={page}"
                ))
                .ok();
            rows.extend(p["rows"].as_array().unwrap().iter().cloned());
            if p["end"] == true {
                return rows;
            }
            assert!(p["next"].as_u64().unwrap() > after, "paging advances: {p}");
            after = p["next"].as_u64().unwrap();
        }
    }
}

/// The admin creates a tenant; returns its API.
pub(crate) fn tenant<'a>(server: &'a Server, name: &str, quotas: Value) -> Api<'a> {
    let body = json!({"name": name, "quotas": quotas}).to_string();
    let t = request(
        "POST",
        &server.url("/v1/tenants"),
        Some(ADMIN),
        Some(("application/json", body.as_bytes())),
    )
    .ok();
    Api {
        server,
        token: t["token"].as_str().unwrap().to_owned(),
    }
}

pub(crate) fn data_dir(scratch: &Scratch) -> PathBuf {
    scratch.path().join("data")
}

#[test]
fn every_request_is_authenticated_and_tenants_see_only_their_own() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let url = server.url("/v1/pipelines");
    request("GET", &url, None, None).error(401, &["Authorization"]);
    request("GET", &url, Some("sbx_not-a-token"), None).error(401, &["invalid token"]);
    request("GET", &server.url("/v1/openapi.json"), None, None).error(401, &[]);

    let a = tenant(&server, "a", json!({}));
    let b = tenant(&server, "b", json!({}));
    a.get("/v1/tenants").error(403, &["admin"]);
    request("GET", &url, Some(ADMIN), None).error(403, &["tenant"]);
    // Tokens are not stored in the clear.
    let registry = std::fs::read_to_string(data_dir(&scratch).join("registry.json")).unwrap();
    assert!(!registry.contains(&a.token) && !registry.contains(ADMIN));

    let processor = a.processor(guests::COUNTER);
    let pipeline = a.pipeline(json!({"processor": processor, "key": "k"}));
    a.rows(&pipeline, &[json!({"k": "x"})]).ok();
    a.wait_processed(&pipeline, 1);

    // Another tenant's ids answer 404, whatever the endpoint.
    for path in [
        format!("/v1/processors/{processor}"),
        format!("/v1/pipelines/{pipeline}"),
        format!("/v1/pipelines/{pipeline}/output"),
        format!("/v1/pipelines/{pipeline}/progress"),
        format!("/v1/pipelines/{pipeline}/state?var=count"),
        format!("/v1/pipelines/{pipeline}/state/metadata"),
        format!("/v1/pipelines/{pipeline}/state/changes?var=count&from=0"),
    ] {
        b.get(&path).error(404, &[]);
    }
    b.rows(&pipeline, &[json!({"k": "x"})]).error(404, &[]);
    b.post(&format!("/v1/pipelines/{pipeline}/stop"), &json!({}))
        .error(404, &[]);
    b.delete(&format!("/v1/pipelines/{pipeline}"))
        .error(404, &[]);
    b.delete(&format!("/v1/processors/{processor}"))
        .error(404, &[]);
    b.post(
        "/v1/pipelines",
        &json!({"processor": processor, "key": "k"}),
    )
    .error(404, &[&processor]);
    assert_eq!(b.get("/v1/pipelines").ok()["pipelines"], json!([]));
    assert_eq!(b.get("/v1/processors").ok()["processors"], json!([]));
    assert_eq!(
        a.get("/v1/pipelines").ok()["pipelines"][0]["id"],
        json!(pipeline)
    );

    let doc = a.get("/v1/openapi.json").ok();
    assert!(doc["paths"]["/v1/pipelines/{id}/rows"].is_object());
    let metrics = request("GET", &server.url("/metrics"), Some(ADMIN), None);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains(&format!(
            "statebox_pipeline_input_rows_total{{tenant=\"{}\",pipeline=\"{pipeline}\"}} 1",
            a.get("/v1/tenant").ok()["id"].as_str().unwrap()
        )),
        "{}",
        metrics.body
    );
    assert!(metrics.body.contains("statebox_tenant_cpu_seconds_total"));
    assert!(
        metrics
            .body
            .contains("statebox_tenant_memory_high_water_bytes")
    );
    a.get("/metrics").error(403, &[]);
    let token = a.token.clone();
    drop(a);
    let log = server.shut_down();
    assert!(!log.contains(&token) && !log.contains(ADMIN), "{log}");
}

#[test]
fn uploads_are_validated_stored_by_hash_and_deleted_only_when_unused() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(
        &server,
        "a",
        json!({"max_upload_bytes": 4 << 20, "max_processors": 2}),
    );
    a.upload(b"definitely not wasm")
        .error(422, &["not WebAssembly"]);
    a.upload(b"\0asm\x01\0\0\0")
        .error(422, &["core WebAssembly module"]);
    a.upload(b"").error(400, &["empty"]);
    a.upload(&vec![0u8; 5 << 20]).error(413, &["limit"]);

    let counter = std::fs::read(guests::COUNTER).unwrap();
    let p = a.upload(&counter);
    assert_eq!(p.status, 201, "{}", p.body);
    let p = p.json();
    assert_eq!(p["name"], "counter");
    assert_eq!(p["output_schema"], "key string, count long");
    let vars: Vec<&str> = p["state_variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["count", "batchCounts", "stats"]);
    let id = p["id"].as_str().unwrap().to_owned();
    let hash = p["hash"].as_str().unwrap();
    assert!(
        data_dir(&scratch)
            .join("processors")
            .join(format!("{hash}.wasm"))
            .is_file()
    );
    // The same bytes again: the same processor.
    let again = a.upload(&counter);
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["id"], json!(id));
    a.get(&format!("/v1/processors/{id}")).ok();

    a.processor(guests::SCD1);
    a.upload(&std::fs::read(guests::MISBEHAVE).unwrap())
        .error(403, &["max_processors"]);

    let pipeline = a.pipeline(json!({"processor": id, "key": "k"}));
    a.delete(&format!("/v1/processors/{id}"))
        .error(409, &[&pipeline]);
    assert_eq!(a.delete(&format!("/v1/pipelines/{pipeline}")).status, 204);
    assert_eq!(a.delete(&format!("/v1/processors/{id}")).status, 204);
    a.get(&format!("/v1/processors/{id}")).error(404, &[]);
    assert!(
        !data_dir(&scratch)
            .join("processors")
            .join(format!("{hash}.wasm"))
            .exists()
    );

    // Bad pipeline definitions are refused with the reason.
    let scd1 = a.get("/v1/processors").ok()["processors"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    a.post("/v1/pipelines", &json!({"processor": scd1}))
        .error(400, &["key"]);
    a.post(
        "/v1/pipelines",
        &json!({"processor": scd1, "key": "user", "time_mode": "sometimes"}),
    )
    .error(400, &["time_mode"]);
    a.post(
        "/v1/pipelines",
        &json!({"processor": scd1, "key": "user", "time_mode": "event-time"}),
    )
    .error(400, &["event_time"]);
    a.post(
        "/v1/pipelines",
        &json!({"processor": scd1, "key": "user", "partitions": 0}),
    )
    .error(400, &["partitions"]);
}

/// Rows of the counter comparison, one request (and one batch) per group.
fn counter_batches() -> Vec<Vec<Value>> {
    (0..4)
        .map(|b| {
            (0..30)
                .map(|i| json!({"k": format!("key{}", (i * 7 + b) % 11), "i": i, "b": b}))
                .collect()
        })
        .collect()
}

#[test]
fn a_counter_pipeline_gives_the_output_of_statebox_run_and_pages_stop_start_and_state() {
    // The reference: `statebox run`, one input file per batch.
    let reference = Scratch::new();
    for (b, rows) in counter_batches().iter().enumerate() {
        reference.write_rows(&format!("{b:03}.jsonl"), rows);
    }
    reference.run_cmd(guests::COUNTER, "k").run().expect_ok();
    let expected = reference.output_rows();

    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({}));
    let processor = a.processor(guests::COUNTER);
    let pipeline = a.pipeline(json!({"processor": processor, "key": ["k"], "partitions": 4}));
    let mut sent = 0;
    for (b, rows) in counter_batches().iter().enumerate() {
        // A JSON array and JSON Lines are both accepted.
        let reply = if b % 2 == 0 {
            a.rows(&pipeline, rows)
        } else {
            let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
            a.jsonl(&pipeline, &text)
        };
        assert_eq!(reply.ok()["accepted"], rows.len());
        sent += rows.len() as u64;
        a.wait_processed(&pipeline, sent);
    }
    assert_eq!(a.output(&pipeline, 1000), expected);
    assert_eq!(a.output(&pipeline, 3), expected, "paging by offset");

    let out = |q: &str| a.get(&format!("/v1/pipelines/{pipeline}/output?{q}"));
    let committed = out("after=0").ok()["committed"].as_u64().unwrap();
    out("after=1").error(400, &["start of a row"]);
    out(&format!("after={}", committed + 1)).error(400, &["past the committed output"]);
    out("after=zero").error(400, &[]);
    let tail = out(&format!("after={committed}")).ok();
    assert_eq!(tail["rows"], json!([]));
    assert_eq!(tail["end"], true);

    // A bad row is refused with its index, and none of its request is kept.
    a.rows(&pipeline, &[json!({"k": "fine"}), json!({"nokey": 1})])
        .error(400, &["row 1", "`k`"]);
    a.jsonl(&pipeline, "{\"k\": \"a\"}\nnot json\n")
        .error(400, &["row 1"]);
    a.rows(&pipeline, &[json!(5)]).error(400, &["JSON object"]);

    // Stopped, the pipeline still acknowledges rows, and processes them when started.
    let stopped = a
        .post(&format!("/v1/pipelines/{pipeline}/stop"), &json!({}))
        .ok();
    assert_eq!(stopped["status"]["state"], "stopped");
    assert_eq!(stopped["desired"], "stopped");
    a.rows(&pipeline, &[json!({"k": "late"})]).ok();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(a.output(&pipeline, 1000).len(), expected.len());
    let started = a
        .post(&format!("/v1/pipelines/{pipeline}/start"), &json!({}))
        .ok();
    assert_eq!(started["desired"], "running");
    a.wait_processed(&pipeline, sent + 1);
    let rows = a.output(&pipeline, 1000);
    assert_eq!(rows.len(), expected.len() + 1);
    assert_eq!(rows.last().unwrap(), &json!({"key": "late", "count": 1}));

    // State reads mirror `statebox state`.
    let state = a
        .get(&format!("/v1/pipelines/{pipeline}/state?var=count"))
        .ok();
    let counts: BTreeMap<String, i64> = state["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"]["k"].as_str().unwrap().to_owned(),
                r["value"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts["late"], 1);
    assert_eq!(counts.values().sum::<i64>(), sent as i64 + 1);
    let metadata = a
        .get(&format!("/v1/pipelines/{pipeline}/state/metadata"))
        .ok();
    assert_eq!(metadata["num_partitions"], 4, "{metadata}");
    let changes = a
        .get(&format!(
            "/v1/pipelines/{pipeline}/state/changes?var=count&from=0"
        ))
        .ok();
    assert!(
        changes["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["change_type"] == "update")
    );
    let old = a
        .get(&format!(
            "/v1/pipelines/{pipeline}/state?var=count&batch_id=0"
        ))
        .ok();
    assert!(old["rows"].as_array().unwrap().len() < state["rows"].as_array().unwrap().len());
    a.get(&format!("/v1/pipelines/{pipeline}/state?var=nope"))
        .error(400, &["nope"]);
    a.get(&format!("/v1/pipelines/{pipeline}/state?var=count&limit=2"))
        .ok()["truncated"]
        .as_bool()
        .filter(|t| *t)
        .expect("a limited read says it was truncated");
    let progress = a
        .get(&format!("/v1/pipelines/{pipeline}/progress?last=2"))
        .ok();
    assert_eq!(progress["progress"].as_array().unwrap().len(), 2);
    server.shut_down();
}

#[test]
fn upgrades_are_checked_against_the_pipelines_state() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({}));
    let v1 = a.processor(V1);
    let v2 = a.processor(V2);
    let v3 = a.processor(V3);
    let pipeline = a.pipeline(json!({"processor": v1, "key": "user"}));
    a.rows(
        &pipeline,
        &[json!({"user": "a", "name": "Ann", "visits": 6})],
    )
    .ok();
    a.wait_processed(&pipeline, 1);

    // v3 is incompatible with v1's state: refused with the report, v1 keeps running.
    let refused = a
        .put(
            &format!("/v1/pipelines/{pipeline}/processor"),
            &json!({"processor": v3}),
        )
        .error(409, &["incompatible"]);
    let report = refused["error"]["report"].as_str().unwrap();
    assert!(report.contains("profile"), "{report}");
    assert_eq!(a.status(&pipeline)["processor"], json!(v1));

    let upgraded = a
        .put(
            &format!("/v1/pipelines/{pipeline}/processor"),
            &json!({"processor": v2}),
        )
        .ok();
    assert_eq!(upgraded["processor"], json!(v2));
    assert!(
        upgraded["upgrade_report"]
            .as_str()
            .unwrap()
            .contains("profile")
    );
    a.rows(
        &pipeline,
        &[json!({"user": "a", "name": "Ann Lee", "email": "ann@x", "visits": 1})],
    )
    .ok();
    a.wait_processed(&pipeline, 2);
    let rows = wait_for("v2's output", Duration::from_secs(30), || {
        let rows = a.output(&pipeline, 100);
        (rows.len() == 2).then_some(rows)
    });
    assert_eq!(rows[1]["display_name"], "Ann Lee");
    assert_eq!(rows[1]["visits"], 7, "v2 read v1's state: {}", rows[1]);
    a.put(
        &format!("/v1/pipelines/{pipeline}/processor"),
        &json!({"processor": "pr_missing"}),
    )
    .error(404, &["pr_missing"]);
    a.delete(&format!("/v1/processors/{v1}")).ok_status(204);
}

trait OkStatus {
    fn ok_status(self, status: u16);
}

impl OkStatus for Reply {
    #[track_caller]
    fn ok_status(self, status: u16) {
        assert_eq!(self.status, status, "{}", self.body);
    }
}

#[test]
fn quotas_answer_clear_errors() {
    let scratch = Scratch::new();
    let server = Server::start(
        &data_dir(&scratch),
        &["--max-attempts", "2", "--retry-backoff-ms", "50"],
    );
    let a = tenant(
        &server,
        "a",
        json!({"ingest_rows_per_s": 5, "max_ingest_request_bytes": 1000, "max_pipelines": 1}),
    );
    let processor = a.processor(guests::COUNTER);
    let pipeline = a.pipeline(json!({"processor": processor, "key": "k"}));
    a.post(
        "/v1/pipelines",
        &json!({"processor": processor, "key": "k"}),
    )
    .error(403, &["max_pipelines"]);
    let big: Vec<Value> = (0..100).map(|i| json!({"k": format!("k{i}")})).collect();
    a.rows(&pipeline, &big).error(413, &["1000 bytes"]);
    let five: Vec<Value> = (0..5).map(|i| json!({"k": format!("k{i}")})).collect();
    a.rows(&pipeline, &five).ok();
    let limited = a.rows(&pipeline, &five);
    assert_eq!(limited.status, 429, "{}", limited.body);
    assert!(limited.body.contains("ingest_rows_per_s"));
    // After a second, the bucket has refilled.
    std::thread::sleep(Duration::from_millis(1200));
    a.rows(&pipeline, &five).ok();
    a.wait_processed(&pipeline, 10);

    // Unknown quota names are refused; admins can change quotas.
    let tenant_id = a.get("/v1/tenant").ok()["id"].as_str().unwrap().to_owned();
    let patch = |q: Value| {
        let body = q.to_string();
        request(
            "PATCH",
            &server.url(&format!("/v1/tenants/{tenant_id}/quotas")),
            Some(ADMIN),
            Some(("application/json", body.as_bytes())),
        )
    };
    patch(json!({"max_pipelinez": 3})).error(400, &["max_pipelinez"]);
    patch(json!({"call_cpu_ms": 0})).error(400, &["call_cpu_ms"]);
    // A batch that would take the state over the quota fails the pipeline with the
    // reason before it commits, and ingest is refused from then on.
    let used = a.get("/v1/tenant").ok()["usage"]["state_bytes"]
        .as_u64()
        .unwrap();
    assert!(used > 0);
    patch(json!({"max_state_bytes": used, "ingest_rows_per_s": 1000})).ok();
    a.rows(&pipeline, &five[..1]).ok();
    let reason = a.wait_failed(&pipeline);
    assert!(reason.contains("max_state_bytes"), "{reason}");
    a.rows(&pipeline, &five[..1])
        .error(403, &["max_state_bytes"]);
    let usage = a.get("/v1/tenant").ok();
    assert!(usage["usage"]["state_bytes"].as_u64().unwrap() <= used);
    assert_eq!(usage["usage"]["pipelines"], 1);

    // The CPU budget of a whole batch: thousands of cheap calls add up past 1 ms.
    let b = tenant(&server, "b", json!({"batch_cpu_ms": 1}));
    let processor = b.processor(guests::COUNTER);
    let pipeline = b.pipeline(json!({"processor": processor, "key": "k", "partitions": 1}));
    let text: String = (0..20_000)
        .map(|i| format!("{}\n", json!({"k": format!("k{i}")})))
        .collect();
    b.jsonl(&pipeline, &text).ok();
    let reason = b.wait_failed(&pipeline);
    assert!(
        reason.contains("batch_cpu_ms") && reason.contains("failed 2 times"),
        "{reason}"
    );
    assert_eq!(
        b.output(&pipeline, 10).len(),
        0,
        "the batch committed nothing"
    );
}

#[test]
fn hostile_processors_fail_their_own_pipeline_and_nothing_else() {
    let scratch = Scratch::new();
    let server = Server::start(
        &data_dir(&scratch),
        &["--max-attempts", "3", "--retry-backoff-ms", "100"],
    );
    let good = tenant(&server, "good", json!({}));
    // 2 s per call: `loop` still ends at the CPU limit, while `huge-output` (serialising
    // 20 MiB in the guest) reaches the output limit first even on a loaded machine, where
    // 300 ms was sometimes not enough.
    let bad = tenant(
        &server,
        "bad",
        json!({"call_cpu_ms": 2000, "memory_bytes": 96 << 20, "output_bytes_per_call": 1 << 20}),
    );
    let counter = good.processor(guests::COUNTER);
    let steady =
        good.pipeline(json!({"processor": counter, "key": "k", "trigger_interval_ms": 50}));

    // The good tenant keeps sending throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(0u64));
    let feeder = {
        let (stop, sent) = (stop.clone(), sent.clone());
        let (url, token) = (
            server.url(&format!("/v1/pipelines/{steady}/rows")),
            good.token.clone(),
        );
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let body = json!([{"k": format!("k{}", i % 5)}]).to_string();
                let r = request(
                    "POST",
                    &url,
                    Some(&token),
                    Some(("application/json", body.as_bytes())),
                );
                assert_eq!(r.status, 200, "{}", r.body);
                *sent.lock().unwrap() += 1;
                i += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let misbehave = bad.processor(guests::MISBEHAVE);
    let cases = [
        ("loop", "CPU time limit"),
        ("oom", "memory limit"),
        ("huge-output", "output limit"),
        ("recurse", "stack overflow"),
        ("panic", "misbehave deliberately panicked"),
        ("fail", "misbehave deliberately failed"),
    ];
    let pipelines: Vec<(String, &str, &str)> = cases
        .iter()
        .map(|(action, reason)| {
            let id = bad.pipeline(json!({"processor": misbehave, "key": "k"}));
            bad.rows(&id, &[json!({"k": "fine", "action": "ok"})]).ok();
            bad.wait_processed(&id, 1);
            // The trap comes in the middle of a batch, after a good row of another key.
            bad.rows(
                &id,
                &[
                    json!({"k": "before", "action": "ok"}),
                    json!({"k": "evil", "action": action}),
                    json!({"k": "after", "action": "ok"}),
                ],
            )
            .ok();
            (id, *action, *reason)
        })
        .collect();
    for (id, action, reason) in &pipelines {
        let failure = bad.wait_failed(id);
        assert!(
            failure.contains(reason) && failure.contains("failed 3 times"),
            "{action}: {failure}"
        );
        // Only the first, good batch was ever committed.
        let out = bad.output(id, 100);
        assert_eq!(out.len(), 1, "{action}: {out:?}");
        assert_eq!(out[0]["action"], "ok");
        let s = bad.status(id);
        assert_eq!(s["status"]["last_progress"]["batch_id"], 0, "{action}: {s}");
        // The console's "Rows/s (last batch)" reads the batch's timing beside its record.
        assert!(
            s["status"]["last_progress"]["rows_per_s"].is_number()
                && s["status"]["last_progress"]["duration_ms"].is_u64(),
            "{action}: {s}"
        );
        // A failed pipeline can be started again; it fails again, the same way.
        if *action == "fail" {
            bad.post(&format!("/v1/pipelines/{id}/start"), &json!({}))
                .ok();
            let again = bad.wait_failed(id);
            assert!(again.contains(reason), "{again}");
        }
    }

    // The guest sees no files, environment or network, and a virtual clock.
    let probe = bad.pipeline(json!({"processor": misbehave, "key": "k"}));
    bad.rows(
        &probe,
        &[
            json!({"k": "f", "action": "read-file"}),
            json!({"k": "e", "action": "env"}),
            json!({"k": "c", "action": "clock"}),
            json!({"k": "r", "action": "random"}),
        ],
    )
    .ok();
    let status = bad.wait_processed(&probe, 4);
    let out = bad.output(&probe, 100);
    let by_action: BTreeMap<&str, &Value> = out
        .iter()
        .map(|r| (r["action"].as_str().unwrap(), r))
        .collect();
    assert_eq!(by_action["read-file"]["count"], 0, "{out:?}");
    assert_eq!(by_action["env"]["count"], 0, "{out:?}");
    assert_eq!(
        by_action["clock"]["count"], status["status"]["last_progress"]["timestamp_ms"],
        "the clock is the batch timestamp"
    );
    // Randomness depends only on the batch and the key: another pipeline's batch 0 draws
    // the same number for the same key, at another time.
    let twin = bad.pipeline(json!({"processor": misbehave, "key": "k"}));
    bad.rows(&twin, &[json!({"k": "r", "action": "random"})])
        .ok();
    bad.wait_processed(&twin, 1);
    assert_eq!(
        bad.output(&twin, 10)[0]["count"],
        by_action["random"]["count"]
    );

    stop.store(true, Ordering::SeqCst);
    feeder.join().unwrap();
    let total = *sent.lock().unwrap();
    good.wait_processed(&steady, total);
    assert!(total > 20, "the good tenant kept sending: {total}");
    let metrics = request("GET", &server.url("/metrics"), Some(ADMIN), None).body;
    assert!(metrics.contains("statebox_pipeline_batch_failures_total"));
    let failed = metrics
        .lines()
        .filter(|l| l.starts_with("statebox_pipeline_failed{") && l.ends_with(" 1"))
        .count();
    assert_eq!(failed, cases.len(), "{metrics}");
    server.shut_down();
}

#[test]
fn kill_9_mid_ingest_and_mid_batch_loses_and_repeats_no_acknowledged_row() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let mut server = Server::start(&data, &[]);
    let a = tenant(&server, "a", json!({}));
    let token = a.token.clone();
    let misbehave = a.processor(guests::MISBEHAVE);
    let pipeline = a.pipeline(json!({"processor": misbehave, "key": "k", "partitions": 3}));
    drop(a);

    // Every row has a key of its own: processed twice, its count would reach 2 or its row
    // would appear twice; lost, it would be missing.
    let acked: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut next_request = 0;
    for round in 0..3 {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..3)
            .map(|c| {
                let (stop, acked, token) = (stop.clone(), acked.clone(), token.clone());
                let url = server.url(&format!("/v1/pipelines/{pipeline}/rows"));
                let first = next_request + c * 100_000;
                std::thread::spawn(move || {
                    for r in first.. {
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        let keys: Vec<String> = (0..40).map(|i| format!("r{r}-{i}")).collect();
                        let body: String = keys
                            .iter()
                            .map(|k| format!("{}\n", json!({"k": k, "action": "ok"})))
                            .collect();
                        match try_request(
                            "POST",
                            &url,
                            Some(&token),
                            Some(("application/x-ndjson", body.as_bytes())),
                        ) {
                            Ok(reply) if reply.status == 200 => {
                                acked.lock().unwrap().extend(keys);
                            }
                            Ok(reply) => panic!("ingest refused: {} {}", reply.status, reply.body),
                            // The server was killed: this request may or may not be stored.
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        next_request += 1_000_000;
        let started = Instant::now();
        std::thread::sleep(Duration::from_millis(700 + 300 * round));
        server.kill9();
        let killed_after = started.elapsed();
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().unwrap();
        }
        eprintln!(
            "round {round}: killed after {killed_after:?}, {} rows acknowledged so far",
            acked.lock().unwrap().len()
        );
        server = Server::start(&data, &[]);
    }
    let log = std::fs::read_to_string(&server.log).unwrap_or_default();
    eprintln!(
        "batches re-run from their plan after a kill: {}",
        log.matches("re-running uncommitted batch").count()
    );
    let a = Api {
        server: &server,
        token,
    };
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 1000, "only {} rows acknowledged", acked.len());
    let out = wait_for(
        "every acknowledged row to be processed",
        Duration::from_secs(90),
        || {
            let out = a.output(&pipeline, 10_000);
            let seen: BTreeSet<&str> = out.iter().map(|r| r["k"].as_str().unwrap()).collect();
            acked
                .iter()
                .all(|k| seen.contains(k.as_str()))
                .then_some(out)
        },
    );
    let mut seen = BTreeSet::new();
    for row in &out {
        assert_eq!(row["count"], 1, "a row was processed twice: {row}");
        assert!(
            seen.insert(row["k"].as_str().unwrap().to_owned()),
            "a row was emitted twice: {row}"
        );
    }
    eprintln!(
        "{} acknowledged rows, {} processed (requests cut by a kill may or may not be kept)",
        acked.len(),
        out.len()
    );
    assert_eq!(a.status(&pipeline)["status"]["state"], "running");
    server.shut_down();
}

/// A tiny real HTTP/1.1 server on a loopback port for the capability tests: it answers every
/// request with `200` and a fixed body (or, `hang`ing, accepts connections and never
/// answers), and counts the requests that reached it.
pub(crate) struct TestHttp {
    pub(crate) addr: String,
    hits: Arc<std::sync::atomic::AtomicUsize>,
}

impl TestHttp {
    pub(crate) const BODY: &'static str = "hello from the test service";

    pub(crate) fn start(hang: bool) -> TestHttp {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        // The thread ends with the test process; it holds nothing but the listener.
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                counter.fetch_add(1, Ordering::SeqCst);
                if hang {
                    held.push(stream);
                    continue;
                }
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{}",
                    TestHttp::BODY.len(),
                    TestHttp::BODY
                );
                let _ = stream.write_all(response.as_bytes());
            }
        });
        TestHttp { addr, hits }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Connections that reached the server.
    pub(crate) fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Api<'_> {
    /// Waits until the pipeline's output has `n` rows; returns them.
    #[track_caller]
    fn wait_output(&self, pipeline: &str, n: usize) -> Vec<Value> {
        wait_for("the pipeline's output", Duration::from_secs(60), || {
            let s = self.status(pipeline);
            assert_ne!(s["status"]["state"], "failed", "{s}");
            let rows = self.output(pipeline, 1000);
            (rows.len() >= n).then_some(rows)
        })
    }
}

fn admin_put(server: &Server, path: &str, body: &Value) -> Reply {
    let bytes = body.to_string();
    request(
        "PUT",
        &server.url(path),
        Some(ADMIN),
        Some(("application/json", bytes.as_bytes())),
    )
}

/// `wasm` with a custom section appended: the same code as another component (another
/// digest, so another processor id).
fn with_custom_section(wasm: &[u8], payload: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"statebox-test";
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name);
    body.extend_from_slice(payload);
    let mut out = wasm.to_vec();
    out.push(0);
    leb128(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

/// Issue 12: an outbound-HTTP grant belongs to the component it was given for. A tenant
/// that upgrades its granted pipeline to another component (here the same code with one
/// more byte, the least a tenant could change) loses the grant until the admin grants
/// again; the grant does not come back by upgrading once more.
#[test]
fn an_http_grant_does_not_pass_to_an_upgraded_processor() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let t = tenant(&server, "caller", json!({}));
    let a = TestHttp::start(false);
    let wasm = std::fs::read(env!("STATEBOX_GUEST_HTTP_CALL")).unwrap();
    let granted_for = t.upload(&wasm).ok()["id"].as_str().unwrap().to_owned();
    let other = t
        .upload(&with_custom_section(&wasm, b"another component"))
        .ok()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(granted_for, other);
    let p = t.pipeline(json!({"processor": granted_for, "key": "k", "trigger_interval_ms": 50}));
    let path = format!("/v1/pipelines/{p}/capabilities");
    let granted = admin_put(&server, &path, &json!({"http_hosts": [a.addr]})).ok();
    assert_eq!(granted["http_hosts"], json!([a.addr]));
    assert!(granted["http_hosts_for"].is_string(), "{granted}");
    t.rows(&p, &[json!({"k": "before", "url": a.url("/")})])
        .ok();
    let out = t.wait_output(&p, 1);
    assert_eq!(out[0]["status"], 200, "{}", out[0]);
    assert_eq!(a.hits(), 1);

    // The attack: upgrade to another component, keep calling.
    let upgraded = t
        .put(
            &format!("/v1/pipelines/{p}/processor"),
            &json!({"processor": other}),
        )
        .ok();
    assert_eq!(upgraded["http_grant_dropped"], true, "{upgraded}");
    assert_eq!(upgraded["http_hosts"], json!([]));
    assert_eq!(t.status(&p)["http_hosts"], json!([]));
    t.rows(&p, &[json!({"k": "after", "url": a.url("/")})]).ok();
    let out = t.wait_output(&p, 2);
    assert_eq!(out[1]["k"], "after");
    assert_eq!(out[1]["status"], -1, "{}", out[1]);
    assert!(
        out[1]["error"]
            .as_str()
            .unwrap()
            .contains("HttpRequestDenied"),
        "{}",
        out[1]
    );
    assert_eq!(a.hits(), 1, "the upgraded processor reached the service");

    // Back to the component the grant was for: the grant is gone, not suspended.
    t.put(
        &format!("/v1/pipelines/{p}/processor"),
        &json!({"processor": granted_for}),
    )
    .ok();
    t.rows(&p, &[json!({"k": "back", "url": a.url("/")})]).ok();
    let out = t.wait_output(&p, 3);
    assert_eq!(out[2]["status"], -1, "{}", out[2]);
    assert_eq!(a.hits(), 1);

    // The admin grants again: the component running now gets it.
    admin_put(&server, &path, &json!({"http_hosts": [a.addr]})).ok();
    t.rows(&p, &[json!({"k": "regranted", "url": a.url("/")})])
        .ok();
    let out = t.wait_output(&p, 4);
    assert_eq!(out[3]["status"], 200, "{}", out[3]);
    assert_eq!(a.hits(), 2);
}

/// Issue 6 item 6: processors get no network by default; only the admin can grant a
/// pipeline outbound HTTP, to an allow-list of hosts, and a grant for one host does not
/// open another. A denied request is an error the guest sees, not a failed pipeline.
#[test]
fn outbound_http_is_denied_unless_the_admin_grants_the_host() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let t = tenant(&server, "caller", json!({}));
    let a = TestHttp::start(false);
    let b = TestHttp::start(false);
    let processor = t.processor(env!("STATEBOX_GUEST_HTTP_CALL"));
    let p = t.pipeline(json!({"processor": processor, "key": "k", "trigger_interval_ms": 50}));
    assert_eq!(t.status(&p)["http_hosts"], json!([]));
    let doc = t.get("/v1/openapi.json").ok();
    assert!(doc["paths"]["/v1/pipelines/{id}/capabilities"]["put"].is_object());

    // (a) Nothing granted: the request is denied inside the host and reaches nobody.
    t.rows(&p, &[json!({"k": "a1", "url": a.url("/x")})]).ok();
    let out = t.wait_output(&p, 1);
    assert_eq!(out[0]["k"], "a1");
    assert_eq!(out[0]["status"], -1, "{}", out[0]);
    assert!(
        out[0]["error"]
            .as_str()
            .unwrap()
            .contains("HttpRequestDenied"),
        "{}",
        out[0]
    );
    assert_eq!(out[0]["body"], Value::Null);
    assert_eq!(a.hits(), 0, "a denied request reached the service");

    // (d) A tenant cannot grant itself anything; nothing changed.
    let path = format!("/v1/pipelines/{p}/capabilities");
    t.put(&path, &json!({"http_hosts": [a.addr]}))
        .error(403, &["admin token"]);
    assert_eq!(t.status(&p)["http_hosts"], json!([]));
    // Invalid hosts and unknown pipelines are refused.
    admin_put(&server, &path, &json!({"http_hosts": ["http://x/"]}))
        .error(400, &["http_hosts[0]", "HOST:PORT"]);
    admin_put(
        &server,
        "/v1/pipelines/pl_nope/capabilities",
        &json!({"http_hosts": []}),
    )
    .error(404, &[]);

    // (b) The admin grants host A; the running pipeline restarts with it.
    let granted = admin_put(&server, &path, &json!({"http_hosts": [a.addr]})).ok();
    assert_eq!(granted["http_hosts"], json!([a.addr]));
    assert_eq!(granted["restarted"], true);
    assert_eq!(t.status(&p)["http_hosts"], json!([a.addr]));
    t.rows(&p, &[json!({"k": "a2", "url": a.url("/hello?q=1")})])
        .ok();
    let out = t.wait_output(&p, 2);
    assert_eq!(
        out[1],
        json!({"k": "a2", "status": 200, "body": TestHttp::BODY, "error": null})
    );
    assert_eq!(a.hits(), 1);

    // (c) The grant for A does not open B.
    t.rows(&p, &[json!({"k": "b1", "url": b.url("/x")})]).ok();
    let out = t.wait_output(&p, 3);
    assert_eq!(out[2]["k"], "b1");
    assert_eq!(out[2]["status"], -1, "{}", out[2]);
    assert!(
        out[2]["error"]
            .as_str()
            .unwrap()
            .contains("HttpRequestDenied"),
        "{}",
        out[2]
    );
    assert_eq!(b.hits(), 0, "a request to a host not granted reached it");

    // The grant survives a server restart; revoking it denies A again.
    let token = t.token.clone();
    server.shut_down();
    let server = Server::start(&data_dir(&scratch), &[]);
    let t = Api {
        server: &server,
        token,
    };
    assert_eq!(t.status(&p)["http_hosts"], json!([a.addr]));
    t.rows(&p, &[json!({"k": "a3", "url": a.url("/")})]).ok();
    let out = t.wait_output(&p, 4);
    assert_eq!(out[3]["status"], 200, "{}", out[3]);
    assert_eq!(a.hits(), 2);
    admin_put(&server, &path, &json!({"http_hosts": []})).ok();
    t.rows(&p, &[json!({"k": "a4", "url": a.url("/")})]).ok();
    let out = t.wait_output(&p, 5);
    assert_eq!(out[4]["status"], -1, "{}", out[4]);
    assert_eq!(a.hits(), 2);
}
