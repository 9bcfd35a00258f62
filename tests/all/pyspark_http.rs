//! The async documentation's aiohttp example, unchanged, on Statebox (issue 16): an
//! `AsyncStatefulProcessor` gathers one `aiohttp` request per row; inside the component the
//! SDK's aiohttp client sends them over `wasi:http` and the SDK's scheduler polls them all
//! at once, so a slow loopback service sees them in flight together. Without
//! `--allow-http` the host denies them and the error says how to grant the host.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use statebox_tests::{component_cache, parse_jsonl, statebox_bin};

/// How long the service takes to answer each request.
const DELAY: Duration = Duration::from_millis(200);

/// A loopback HTTP service answering every request after [`DELAY`] with
/// `{"n": N, "score": N / 10}`, N the number ending the path (`/7`, `/score/7`), one thread per connection; it records how many
/// requests were in flight at once. Stopped on drop.
struct SlowService {
    port: u16,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    spans: Arc<Mutex<Vec<(Instant, Instant)>>>,
}

impl SlowService {
    fn start() -> SlowService {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let port = listener.local_addr().expect("local address").port();
        let service = SlowService {
            port,
            stop: Arc::new(AtomicBool::new(false)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: Arc::new(AtomicUsize::new(0)),
            spans: Arc::new(Mutex::new(Vec::new())),
        };
        let (stop, in_flight, max_in_flight, spans) = (
            service.stop.clone(),
            service.in_flight.clone(),
            service.max_in_flight.clone(),
            service.spans.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (in_flight, max_in_flight, spans) =
                            (in_flight.clone(), max_in_flight.clone(), spans.clone());
                        std::thread::spawn(move || {
                            serve(stream, &in_flight, &max_in_flight, &spans);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        service
    }
}

impl Drop for SlowService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(
    mut stream: TcpStream,
    in_flight: &AtomicUsize,
    max_in_flight: &AtomicUsize,
    spans: &Mutex<Vec<(Instant, Instant)>>,
) {
    stream.set_nonblocking(false).ok();
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let started = Instant::now();
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    max_in_flight.fetch_max(now, Ordering::SeqCst);
    std::thread::sleep(DELAY);
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&request);
    let path = head.split_whitespace().nth(1).unwrap_or("/0");
    let n: i64 = path.rsplit('/').next().unwrap_or("0").parse().unwrap_or(0);
    let body = json!({ "n": n, "score": n as f64 / 10.0 }).to_string();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).ok();
    spans.lock().expect("spans").push((started, Instant::now()));
}

fn text(output: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs the documentation's enrichment processor over `rows` (one batch), granting
/// `allow` with `--allow-http` if given.
fn run(dir: &Path, rows: &[serde_json::Value], allow: Option<&str>) -> Output {
    let processor =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyspark/http-async/processor.py");
    let input = dir.join("input");
    std::fs::create_dir_all(&input).expect("create input/");
    let lines: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(input.join("000001.jsonl"), lines).expect("write input");
    let mut cmd = Command::new(statebox_bin());
    cmd.arg("run")
        .arg("--processor")
        .arg(&processor)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.join("out.jsonl"))
        .arg("--checkpoint")
        .arg(dir.join("checkpoint"))
        .args(["--key", "id"])
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null());
    if let Some(host) = allow {
        cmd.args(["--allow-http", host]);
    }
    cmd.output().expect("spawn statebox")
}

#[test]
fn the_aiohttp_example_sends_a_keys_requests_concurrently() {
    let service = SlowService::start();
    let dir = tempfile::tempdir().expect("create a temporary directory");
    const N: i64 = 8;
    let rows: Vec<_> = (1..=N)
        .map(|n| json!({"id": "a", "url": format!("http://127.0.0.1:{}/{n}", service.port)}))
        .collect();
    let allow = format!("127.0.0.1:{}", service.port);
    let out = run(dir.path(), &rows, Some(&allow));
    assert!(out.status.success(), "{}", text(&out));
    let emitted = parse_jsonl(&std::fs::read(dir.path().join("out.jsonl")).expect("output"));
    assert_eq!(
        emitted,
        vec![json!({
            "id": "a",
            "calls": N,
            "total": N * (N + 1) / 2,
            "statuses": vec!["200"; N as usize].join(","),
        })]
    );
    let spans = service.spans.lock().expect("spans").clone();
    assert_eq!(spans.len(), N as usize, "every request reached the service");
    let first = spans.iter().map(|s| s.0).min().expect("a request");
    let last = spans.iter().map(|s| s.1).max().expect("a request");
    let took = last - first;
    let max = service.max_in_flight.load(Ordering::SeqCst);
    println!(
        "{N} requests of {DELAY:?}: {took:?} from the first to the last, at most {max} in flight"
    );
    // One after another they would take N × 200 ms; gathered they overlap.
    assert!(
        took < DELAY * (N as u32) / 2,
        "{N} requests of {DELAY:?} took {took:?}: not concurrent"
    );
    assert!(
        max >= (N as usize) / 2,
        "at most {max} requests were in flight at once"
    );
}

#[test]
fn without_allow_http_the_request_is_denied_with_how_to_grant_it() {
    let service = SlowService::start();
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let rows = [json!({"id": "a", "url": format!("http://127.0.0.1:{}/1", service.port)})];
    let out = run(dir.path(), &rows, None);
    assert!(!out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ClientConnectorError") && stderr.contains("--allow-http 127.0.0.1:"),
        "{}",
        text(&out)
    );
    assert!(
        service.spans.lock().expect("spans").is_empty(),
        "nothing reached the service"
    );
}

/// Databricks' `asyncio.gather` example exactly as published (`docs-async-http/job.py`: the
/// processor pasted unchanged, with a minimal query around it): it asks
/// `https://api.example.com/score/{event_id}` for every row. The operator grants that host
/// and routes it to the slow loopback service (`--http-route`), so the file runs unchanged:
/// each user's requests are in flight together, the highest score is kept in state and
/// emitted.
#[test]
fn the_databricks_gather_example_runs_unchanged_against_a_routed_service() {
    let service = SlowService::start();
    let work = tempfile::tempdir().expect("create a temporary directory");
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/pyspark/docs-async-http/job.py");
    let input = work.path().join("input");
    std::fs::create_dir_all(&input).expect("create input/");
    let mut lines = String::new();
    for event_id in 1..=8 {
        lines.push_str(&format!(
            "{}\n",
            json!({"user_id": "u1", "event_id": event_id})
        ));
    }
    for event_id in [13, 11, 12] {
        lines.push_str(&format!(
            "{}\n",
            json!({"user_id": "u2", "event_id": event_id})
        ));
    }
    std::fs::write(input.join("000001.json"), lines).expect("write input");
    let route = format!("https://api.example.com=http://127.0.0.1:{}", service.port);
    let run = |extra: &[&str]| crate::pyspark_docs::run_job(work.path(), &job, extra);

    // A route grants nothing: without --allow-http for its origin the run stops, naming it.
    let refused = run(&["--http-route", &route]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("add --allow-http api.example.com:443"),
        "{}",
        text(&refused)
    );
    assert!(service.spans.lock().expect("spans").is_empty());

    let out = run(&["--allow-http", "api.example.com", "--http-route", &route]);
    assert!(out.status.success(), "{}", text(&out));
    let emitted = parse_jsonl(
        &std::fs::read(work.path().join("output/part-00000-statebox.json")).expect("output"),
    );
    let mut emitted = emitted;
    emitted.sort_by_key(|r| r["user_id"].as_str().unwrap_or_default().to_owned());
    assert_eq!(
        emitted,
        vec![
            json!({"user_id": "u1", "score": 0.8}),
            json!({"user_id": "u2", "score": 1.3}),
        ]
    );
    let spans = service.spans.lock().expect("spans").clone();
    assert_eq!(spans.len(), 11, "every row's request reached the service");
    let first = spans.iter().map(|s| s.0).min().expect("a request");
    let last = spans.iter().map(|s| s.1).max().expect("a request");
    let took = last - first;
    let max = service.max_in_flight.load(Ordering::SeqCst);
    println!(
        "11 requests of {DELAY:?}: {took:?} from the first to the last, at most {max} in flight"
    );
    assert!(
        took < DELAY * 11 / 2,
        "11 requests of {DELAY:?} took {took:?}: not concurrent"
    );
    assert!(max >= 4, "at most {max} requests were in flight at once");
}
