//! The web console of `statebox serve` (issue 18) in a real browser: Debian's chromium
//! driven by playwright-core (`tests/console/console.test.mjs`), against the real server
//! with real processors. The script logs in, uploads by drag and drop, creates pipelines,
//! ingests, watches the charts and the output update, browses state at an old batch, runs
//! SQL, is refused an incompatible upgrade, and checks that tenant B never sees tenant A's
//! objects; the admin grants a Kafka broker (a real one, tansu) and the tenant creates a
//! pipeline from a topic to a topic in the form, whose output topic then holds every
//! record counted once. The browser console must show no errors beyond the ones the steps
//! provoke.
//!
//! `tests/console/setup.sh` (run by `.ci/setup`) installs chromium and playwright-core.
//! `tests/console/screenshots.sh` reruns this test with `STATEBOX_SCREENSHOTS` set to
//! regenerate the PNGs in `docs/`.
//!
//! Also, over plain HTTP: the endpoints the console added keep tenants apart like the rest.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use statebox_tests::kafka::{Broker, counted_per_key, rows_per_key};
use statebox_tests::{Scratch, component_cache, guests, statebox_bin, wait_for};

const ADMIN: &str = "console-admin-token-0123456789abcdef";

/// A running `statebox serve` on a free loopback port, killed on drop.
struct Server {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Server {
    fn start(data: &Path) -> Server {
        std::fs::create_dir_all(data).unwrap();
        let log = data.with_extension("log");
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(statebox_bin())
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0"])
            .env("STATEBOX_ADMIN_TOKEN", ADMIN)
            .env("STATEBOX_CACHE_DIR", component_cache())
            .env("STATEBOX_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn statebox serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(addr) = line.trim().strip_prefix("statebox serve listening on ") else {
            let _ = child.kill();
            panic!(
                "the server did not start: {line}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Server {
            child,
            base: addr.to_owned(),
            log,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `tests/console` directory, with its installed node_modules.
fn console_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed in {}: run tests/console/setup.sh (.ci/setup does)",
        dir.display()
    );
    dir
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("STATEBOX_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.is_file(),
        "chromium is not installed at {}: run tests/console/setup.sh (.ci/setup does)",
        path.display()
    );
    path
}

#[test]
fn the_console_drives_tenants_pipelines_state_and_upgrades_in_a_real_browser() {
    let dir = console_dir();
    let chromium = chromium();
    let scratch = Scratch::new();
    let server = Server::start(&scratch.path().join("data"));
    // The rows a Kafka pipeline created in the form counts: waiting in their topic.
    let broker = Broker::start();
    broker.create_topic("clicks", 2);
    broker.create_topic("counts", 2);
    let rows: Vec<(String, Value)> = (0..300)
        .map(|n| {
            let user = format!("u{}", n % 17);
            (user.clone(), json!({"user": user, "n": n}))
        })
        .collect();
    broker.produce("clicks", &rows);
    // Another cluster: a pipeline of the form reads `clicks` above and writes here.
    let elsewhere = Broker::start();
    elsewhere.create_topic("counts", 2);
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("console.test.mjs"))
        .current_dir(&dir)
        .env("STATEBOX_URL", &server.base)
        .env("STATEBOX_ADMIN_TOKEN", ADMIN)
        .env("STATEBOX_CHROMIUM", &chromium)
        .env("STATEBOX_COUNTER_WASM", guests::COUNTER)
        .env("STATEBOX_KAFKA_BROKER", &broker.addr)
        .env("STATEBOX_KAFKA_BROKER2", &elsewhere.addr)
        .env("STATEBOX_KAFKA_ROWS", rows.len().to_string())
        .env(
            "STATEBOX_PROFILE_V1_WASM",
            env!("STATEBOX_GUEST_USER_PROFILE_V1"),
        )
        .env(
            "STATEBOX_PROFILE_V2_WASM",
            env!("STATEBOX_GUEST_USER_PROFILE_V2"),
        )
        .env(
            "STATEBOX_PROFILE_V3_WASM",
            env!("STATEBOX_GUEST_USER_PROFILE_V3"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(shots) = std::env::var_os("STATEBOX_SCREENSHOTS") {
        cmd.env("STATEBOX_SCREENSHOTS", shots);
    }
    let mut node = cmd.spawn().expect("spawn node (Node.js 20+ is needed)");
    // The script bounds each step; this bounds the whole run, so a hung browser fails the
    // test instead of hanging CI.
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = node.kill();
            break node.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    node.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    node.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    println!("{out}");
    assert!(
        status.success(),
        "the browser test failed ({status}):\n{out}\n{err}\nserver log:\n{}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    assert!(out.contains("ok: every step passed"), "{out}");
    // The pipeline the form created wrote each batch's counts to `counts`, in transactions.
    assert_eq!(
        counted_per_key(&broker.read_all("counts", "read_committed")),
        rows_per_key(&rows),
        "the Kafka pipeline created in the console did not count every record once"
    );
    // The second wrote to the other cluster, the same counts.
    assert_eq!(
        counted_per_key(&elsewhere.read_all("counts", "read_committed")),
        rows_per_key(&rows),
        "the pipeline writing to another cluster did not count every record once there"
    );
    // The credentials rotated in the settings tab: the second save left the password field
    // empty, which kept the password of the first.
    let registry: Value = serde_json::from_str(
        &std::fs::read_to_string(scratch.path().join("data").join("registry.json")).unwrap(),
    )
    .unwrap();
    let rotated: Vec<&Value> = registry["pipelines"]
        .as_object()
        .unwrap()
        .values()
        .map(|p| &p["source"]["kafka"]["options"])
        .filter(|o| o["sasl.username"] == "rotated-again")
        .collect();
    assert_eq!(rotated.len(), 1, "{registry}");
    assert_eq!(rotated[0]["sasl.password"], "p4ss-1", "{registry}");
}

/// A request: status and parsed body.
fn call(
    server: &Server,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let req = agent
        .request(method, &format!("{}{path}", server.base))
        .set("Authorization", &format!("Bearer {token}"));
    let result = match body {
        Some(b) => req
            .set("Content-Type", "application/json")
            .send_string(&b.to_string()),
        None => req.call(),
    };
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = response.status();
    let text = response.into_string().unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
    };
    (status, value)
}

#[test]
fn the_consoles_endpoints_answer_only_for_the_owner_and_page_back_exactly() {
    let scratch = Scratch::new();
    let server = Server::start(&scratch.path().join("data"));
    let tenant = |name: &str| {
        let (status, t) = call(
            &server,
            "POST",
            "/v1/tenants",
            ADMIN,
            Some(json!({"name": name})),
        );
        assert_eq!(status, 201, "{t}");
        t["token"].as_str().unwrap().to_owned()
    };
    let (a, b) = (tenant("a"), tenant("b"));

    // The console itself needs no token; its assets are embedded and locked down.
    let page = ureq::get(&format!("{}/", server.base)).call().unwrap();
    assert!(
        page.header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'")
    );
    assert!(page.into_string().unwrap().contains("/assets/app.js"));
    let js = ureq::get(&format!("{}/assets/vendor/uPlot.esm.js", server.base))
        .call()
        .unwrap();
    assert!(js.content_type().contains("javascript"));
    // Only the embedded files are served: nothing of the data directory, however asked for
    // (ureq resolves `..` itself, which lands on the authenticated API instead).
    for path in ["/assets/registry.json", "/assets/%2e%2e/registry.json"] {
        match ureq::get(&format!("{}{path}", server.base)).call() {
            Err(ureq::Error::Status(401 | 404, _)) => {}
            other => panic!("{path} must not be served: {other:?}"),
        }
    }

    assert_eq!(
        call(&server, "GET", "/v1/whoami", ADMIN, None).1["role"],
        "admin"
    );
    let me = call(&server, "GET", "/v1/whoami", &a, None).1;
    assert_eq!(
        (me["role"].as_str(), me["name"].as_str()),
        (Some("tenant"), Some("a"))
    );
    assert_eq!(call(&server, "GET", "/v1/whoami", "sbx_nope", None).0, 401);

    let counter = std::fs::read(guests::COUNTER).unwrap();
    let uploaded: Value = serde_json::from_str(
        &ureq::post(&format!("{}/v1/processors", server.base))
            .set("Authorization", &format!("Bearer {a}"))
            .set("Content-Type", "application/wasm")
            .send_bytes(&counter)
            .unwrap()
            .into_string()
            .unwrap(),
    )
    .unwrap();
    let processor = uploaded["id"].as_str().unwrap();
    let (_, p) = call(
        &server,
        "POST",
        "/v1/pipelines",
        &a,
        Some(json!({"processor": processor, "key": "k", "trigger_interval_ms": 50})),
    );
    let id = p["id"].as_str().unwrap().to_owned();
    // 25 rows of distinct keys in one batch: 25 output rows, in the order emitted.
    let rows: Vec<Value> = (0..25).map(|i| json!({"k": format!("k{i:02}")})).collect();
    assert_eq!(
        call(
            &server,
            "POST",
            &format!("/v1/pipelines/{id}/rows"),
            &a,
            Some(json!(rows))
        )
        .0,
        200
    );
    wait_for("the batch", Duration::from_secs(60), || {
        let (_, p) = call(&server, "GET", &format!("/v1/pipelines/{id}"), &a, None);
        (p["rows_processed"] == 25).then_some(())
    });

    // The tail pages back to the beginning and gives exactly what the forward reader gives.
    let forward = call(
        &server,
        "GET",
        &format!("/v1/pipelines/{id}/output?limit=1000"),
        &a,
        None,
    )
    .1;
    let mut backward: Vec<Value> = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let q = before.map_or(String::new(), |b| format!("&before={b}"));
        let (status, page) = call(
            &server,
            "GET",
            &format!("/v1/pipelines/{id}/output/tail?limit=10{q}"),
            &a,
            None,
        );
        assert_eq!(status, 200, "{page}");
        let mut rows = page["rows"].as_array().unwrap().clone();
        rows.extend(backward);
        backward = rows;
        if page["begin"] == true {
            break;
        }
        before = page["from"].as_u64();
    }
    assert_eq!(Value::Array(backward), forward["rows"]);
    let (status, e) = call(
        &server,
        "GET",
        &format!("/v1/pipelines/{id}/output/tail?before=3"),
        &a,
        None,
    );
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not at the end of a row")
    );

    // SQL over the state, in the query's column order.
    let (status, r) = call(
        &server,
        "POST",
        &format!("/v1/pipelines/{id}/sql"),
        &a,
        Some(
            json!({"sql": "SELECT value, key.k AS k FROM read_statestore(stateVarName => 'count') ORDER BY k", "limit": 3}),
        ),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["columns"], json!(["value", "k"]));
    assert_eq!(r["rows"][0], json!({"value": 1, "k": "k00"}));
    assert_eq!(
        (r["count"].as_u64(), r["truncated"].as_bool()),
        (Some(3), Some(true))
    );
    let (status, r) = call(
        &server,
        "POST",
        &format!("/v1/pipelines/{id}/sql"),
        &a,
        Some(json!({"sql": "DROP TABLE x"})),
    );
    assert_eq!(status, 400, "{r}");

    // The dry run of an upgrade: the report, nothing changed.
    let (status, r) = call(
        &server,
        "POST",
        &format!("/v1/pipelines/{id}/processor/check"),
        &a,
        Some(json!({"processor": processor})),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["compatible"], true);
    assert!(r["report"].as_str().unwrap().contains("count"), "{r}");

    // Tenant B gets 404 for every one of A's objects, the admin 403 on tenant endpoints,
    // and tenants 403 on the admin's usage.
    for (method, path, body) in [
        ("GET", format!("/v1/pipelines/{id}/output/tail"), None),
        (
            "POST",
            format!("/v1/pipelines/{id}/sql"),
            Some(json!({"sql": "SELECT 1"})),
        ),
        (
            "POST",
            format!("/v1/pipelines/{id}/processor/check"),
            Some(json!({"processor": processor})),
        ),
    ] {
        assert_eq!(
            call(&server, method, &path, &b, body.clone()).0,
            404,
            "{path}"
        );
        assert_eq!(call(&server, method, &path, ADMIN, body).0, 403, "{path}");
    }
    assert_eq!(call(&server, "GET", "/v1/usage", &a, None).0, 403);
    let usage = call(&server, "GET", "/v1/usage", ADMIN, None).1;
    let ta = usage["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "a")
        .unwrap();
    assert_eq!(ta["usage"]["pipelines"], 1);
    assert_eq!(ta["pipelines"][0]["id"], json!(id));
    assert!(ta["usage"]["cpu_seconds"].as_f64().unwrap() > 0.0, "{ta}");
}
