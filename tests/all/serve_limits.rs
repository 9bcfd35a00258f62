//! `statebox serve` under attack (issue 12, the server's half): each test performs one
//! attack with a purpose-built processor or request against the real binary, and checks
//! that the server stays up, that other tenants keep working, and that the failure names
//! its cause.
//!
//! (Long because it holds one test per attack of the issue; each stands alone.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use statebox_tests::{Scratch, guests, wait_for};

use crate::serve::{ADMIN, Api, Server, data_dir, request, tenant, try_request};

/// `tests/guests/hostile-upload`, whose mode is patched into its data.
const HOSTILE: &str = env!("STATEBOX_GUEST_HOSTILE_UPLOAD");

/// The hostile-upload component in `mode` (see its crate docs).
fn hostile(mode: &str) -> Vec<u8> {
    let mut wasm = std::fs::read(HOSTILE).unwrap();
    let marker = b"statebox-hostile-mode:normal";
    let at: Vec<usize> = wasm
        .windows(marker.len())
        .enumerate()
        .filter(|(_, w)| w == marker)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the mode marker appears once in the component");
    let mut patched = format!("statebox-hostile-mode:{mode}").into_bytes();
    assert!(patched.len() <= 48, "mode too long");
    patched.resize(48, b'.');
    wasm[at[0]..at[0] + 48].copy_from_slice(&patched);
    wasm
}

/// Runs `f` and returns its result with how long it took.
fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let t = f();
    (t, started.elapsed())
}

/// A value of the server process's `/proc/PID/status`, in KiB.
fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// How much the server's peak resident memory grows while `f` runs, in MiB: the peak is
/// reset first (`/proc/PID/clear_refs`), so only `f`'s requests count.
fn peak_growth_mib(server: &Server, f: impl FnOnce()) -> u64 {
    let pid = server.child.as_ref().unwrap().id();
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    let before = proc_status_kib(pid, "VmRSS:");
    f();
    let peak = proc_status_kib(pid, "VmHWM:");
    peak.saturating_sub(before) / 1024
}

/// Reads an HTTP response off `s` until its body is complete, the connection closes, or 30 s
/// pass.
fn read_answer(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    while started.elapsed() < Duration::from_secs(30) {
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn admin(server: &Server, method: &str, path: &str, body: Option<&Value>) -> crate::serve::Reply {
    let bytes = body.map(Value::to_string);
    request(
        method,
        &server.url(path),
        Some(ADMIN),
        bytes.as_ref().map(|b| ("application/json", b.as_bytes())),
    )
}

/// A well-behaved tenant's whole path, start to finish: upload, create, ingest, read.
fn good_tenant_works(good: &Api<'_>, rows: u64) {
    let counter = good.processor(guests::COUNTER);
    let p = good.pipeline(json!({"processor": counter, "key": "k", "trigger_interval_ms": 50}));
    let batch: Vec<Value> = (0..rows)
        .map(|i| json!({"k": format!("k{}", i % 3)}))
        .collect();
    good.rows(&p, &batch).ok();
    good.wait_processed(&p, rows);
    assert!(!good.output(&p, 100).is_empty());
}

#[test]
fn guests_that_never_return_hold_up_no_other_tenant_stop_or_restart() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let flags = ["--stop-wait-ms", "1000", "--open-wait-ms", "2000"];
    let server = Server::start(&data, &flags);
    // Calls may run for 90 s, longer than any request of this test may take (60 s): the
    // guests below spin until then, or until the server exits.
    let bad = tenant(
        &server,
        "bad",
        json!({"call_cpu_ms": 90_000, "batch_cpu_ms": 180_000}),
    );
    let good = tenant(&server, "good", json!({}));

    // An upload whose `init` spins: the upload waits, nobody else does.
    let spinning_upload = {
        let (url, token) = (server.url("/v1/processors"), bad.token.clone());
        std::thread::spawn(move || {
            let wasm = hostile("spin-init");
            let _ = try_request(
                "POST",
                &url,
                Some(&token),
                Some(("application/wasm", wasm.as_slice())),
            );
        })
    };
    // A processor whose `init` spins only in event time, so a pipeline never opens.
    let never_opens = bad.upload(&hostile("spin-event-time")).ok();
    let never_opens = never_opens["id"].as_str().unwrap().to_owned();
    let spinning_create = {
        let (url, token) = (server.url("/v1/pipelines"), bad.token.clone());
        let spec = json!({
            "processor": never_opens, "key": "k", "time_mode": "event-time",
            "event_time": {"column": "t"}
        })
        .to_string();
        std::thread::spawn(move || {
            try_request(
                "POST",
                &url,
                Some(&token),
                Some(("application/json", spec.as_bytes())),
            )
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Each of these requests would wait for the spinning guests if a lock were held.
    good_tenant_works(&good, 30);
    // The event-time pipeline was created (at the latest when the open wait ran out).
    let created = spinning_create
        .join()
        .unwrap()
        .expect("the create request answered");
    let stuck = created.ok();
    let stuck = stuck["id"].as_str().unwrap().to_owned();

    // A batch that spins: stop and delete answer at once, and the pipeline says why it
    // cannot start again yet.
    let misbehave = bad.processor(guests::MISBEHAVE);
    let spinning = bad.pipeline(json!({"processor": misbehave, "key": "k"}));
    bad.rows(&spinning, &[json!({"k": "a", "action": "loop"})])
        .ok();
    std::thread::sleep(Duration::from_secs(1));
    let (stopped, took) = timed(|| {
        bad.post(&format!("/v1/pipelines/{spinning}/stop"), &json!({}))
            .ok()
    });
    assert!(took < Duration::from_secs(50), "stop took {took:?}");
    assert_eq!(stopped["status"]["state"], "stopping", "{stopped}");
    bad.post(&format!("/v1/pipelines/{spinning}/start"), &json!({}))
        .error(409, &["still finishing its current batch"]);
    let (deleted, took) = timed(|| bad.delete(&format!("/v1/pipelines/{spinning}")));
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    assert!(took < Duration::from_secs(50), "delete took {took:?}");

    // Shutdown does not wait for the spinning guests: the process exits within 10 s.
    let (bad_token, good_token) = (bad.token.clone(), good.token.clone());
    drop((bad, good));
    let log = server.shut_down();
    assert!(log.contains("did not stop in time"), "{log}");
    drop(spinning_upload);

    // A restart answers requests while the stuck pipeline resumes in the background.
    let server = Server::start_within(&data, &flags, &[], Duration::from_secs(60));
    let bad = Api {
        server: &server,
        token: bad_token,
    };
    let good = Api {
        server: &server,
        token: good_token,
    };
    let state = bad.status(&stuck)["status"]["state"].clone();
    // Either is right: the pipeline is `starting` until its runner thread has opened the
    // checkpoint and loaded the processor, which races with this request (the point is
    // that the request is answered while the pipeline resumes, not which side won).
    assert!(state == "starting" || state == "running", "{state}");
    let listed = good.get("/v1/pipelines").ok();
    assert_eq!(listed["pipelines"].as_array().unwrap().len(), 1, "{listed}");
    good.get("/v1/tenant").ok();
}

#[test]
fn slow_clients_are_cut_off_and_large_bodies_are_not_buffered() {
    let scratch = Scratch::new();
    let server = Server::start(
        &data_dir(&scratch),
        &["--header-timeout-ms", "1000", "--body-timeout-ms", "1000"],
    );
    let a = tenant(&server, "a", json!({"max_ingest_request_bytes": 1 << 20}));
    let addr = server.base.trim_start_matches("http://").to_owned();

    // Slowloris: twenty connections sending their heads a byte at a time.
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /v1/tenant HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            s
        })
        .collect();
    let started = Instant::now();
    let mut closed = vec![false; slow.len()];
    while closed.iter().any(|c| !c) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{} slow connections still open after 30 s",
            closed.iter().filter(|c| !**c).count()
        );
        for (s, c) in slow.iter_mut().zip(closed.iter_mut()).filter(|(_, c)| !**c) {
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(0) => *c = true,
                Ok(_) => *c = true,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    // Still open: dribble one more header byte.
                    if s.write_all(b"x").is_err() {
                        *c = true;
                    }
                }
                Err(_) => *c = true,
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Meanwhile (and after) everyone else is served.
    a.get("/v1/tenant").ok();

    // A body that stops arriving is answered 408.
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "POST /v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\""
    )
    .unwrap();
    let answer = read_answer(&mut s);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("stopped arriving"), "{answer}");

    // A body over the limit is refused without being kept in memory.
    let counter = a.processor(guests::COUNTER);
    let p = a.pipeline(json!({"processor": counter, "key": "k"}));
    let line = format!("{{\"k\":\"{}\"}}\n", "x".repeat(1000));
    let body = line.repeat((60 << 20) / line.len());
    let grew = peak_growth_mib(&server, || {
        a.jsonl(&p, &body).error(413, &["1048576 bytes"]);
    });
    assert!(grew < 30, "refusing a 60 MiB body took {grew} MiB");
    a.get("/v1/tenant").ok();
}

#[test]
fn one_caller_cannot_take_every_request_slot() {
    let scratch = Scratch::new();
    let server = Server::start(
        &data_dir(&scratch),
        &[
            "--body-timeout-ms",
            "60000",
            "--max-in-flight-per-caller",
            "2",
        ],
    );
    let a = tenant(&server, "a", json!({}));
    let b = tenant(&server, "b", json!({}));
    let addr = server.base.trim_start_matches("http://").to_owned();
    // Two of a's requests whose bodies never finish take a's two slots. A probe can take a
    // slot before the second of them arrives, which is then refused: such a request is
    // answered at once, and is sent again until both hold their slots.
    let stall = || {
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/processors HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Length: 1000\r\n\r\n\0asm",
            a.token
        )
        .unwrap();
        s.set_nonblocking(true).unwrap();
        s
    };
    let answered = |s: &TcpStream| s.peek(&mut [0u8; 1]).is_ok();
    let mut stalled: Vec<TcpStream> = (0..2).map(|_| stall()).collect();
    let refused = wait_for(
        "a's third request to be refused",
        Duration::from_secs(30),
        || {
            for s in &mut stalled {
                if answered(s) {
                    *s = stall();
                }
            }
            let r = a.get("/v1/tenant");
            (r.status == 429).then_some(r)
        },
    );
    assert!(
        !stalled.iter().any(answered),
        "the stalled requests hold their slots"
    );
    refused.error(429, &["max_in_flight_per_caller"]);
    // Another tenant is not affected, and a gets its slots back once its requests end.
    b.get("/v1/tenant").ok();
    drop(stalled);
    wait_for("a's slots to free", Duration::from_secs(30), || {
        (a.get("/v1/tenant").status == 200).then_some(())
    });
}

#[test]
fn a_page_of_output_reads_at_most_a_page() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({"output_bytes_per_call": 32 << 20}));
    let misbehave = a.processor(guests::MISBEHAVE);
    let p = a.pipeline(json!({"processor": misbehave, "key": "k"}));
    // Five batches of 20 rows of 1 MiB: 100 MiB of output.
    for i in 0..5u64 {
        a.rows(
            &p,
            &[json!({"k": format!("k{i}"), "action": "huge-output"})],
        )
        .ok();
        a.wait_processed(&p, i + 1);
    }
    let committed = a.status(&p)["status"]["committed_output_bytes"]
        .as_u64()
        .unwrap();
    assert!(committed > 100 << 20, "{committed}");
    let mut page = Value::Null;
    let grew = peak_growth_mib(&server, || {
        page = a.get(&format!("/v1/pipelines/{p}/output?limit=1")).ok();
    });
    assert_eq!(page["count"], 1);
    let next = page["next"].as_u64().unwrap();
    assert!(next > 1 << 20 && next < 2 << 20, "one row of 1 MiB: {next}");
    assert!(grew < 40, "reading one row of 1 MiB took {grew} MiB");
    // A page without a limit stops at its byte size (8 MiB), on a row boundary.
    let page = a
        .get(&format!("/v1/pipelines/{p}/output?after={next}"))
        .ok();
    let count = page["count"].as_u64().unwrap();
    assert!((1..=8).contains(&count), "{count}");

    // The console's tail is bounded the same way: the most rows it may hold, and still
    // at most 8 MiB of them, read without the rest of the file.
    let mut tail = None;
    let grew = peak_growth_mib(&server, || {
        tail = Some(a.get(&format!("/v1/pipelines/{p}/output/tail?limit=1000")));
    });
    let tail = tail.unwrap();
    assert!(
        tail.body.len() < (8 << 20) + 4096,
        "{} bytes",
        tail.body.len()
    );
    let tail = tail.ok();
    let count = tail["count"].as_u64().unwrap();
    assert!((1..=8).contains(&count), "{count}");
    assert_eq!(tail["to"], committed);
    assert!(grew < 40, "a tail page of 8 MiB took {grew} MiB");
    // Paging back goes on where the page began.
    let from = tail["from"].as_u64().unwrap();
    let older = a
        .get(&format!(
            "/v1/pipelines/{p}/output/tail?before={from}&limit=2"
        ))
        .ok();
    assert_eq!(older["count"], 2);
    assert_eq!(older["to"], from);
}

#[test]
fn a_huge_processor_name_is_refused_before_it_is_stored() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let server = Server::start(&data, &[]);
    let bad = tenant(&server, "bad", json!({}));
    let good = tenant(&server, "good", json!({}));
    let uploading = {
        let (url, token) = (server.url("/v1/processors"), bad.token.clone());
        std::thread::spawn(move || {
            let wasm = hostile("huge-name");
            request(
                "POST",
                &url,
                Some(&token),
                Some(("application/wasm", wasm.as_slice())),
            )
        })
    };
    good_tenant_works(&good, 10);
    uploading.join().unwrap().error(422, &["name"]);
    bad.upload(&hostile("huge-var-name")).error(422, &[]);
    // Nothing of it reached the registry; a well-behaved processor uploads fine.
    let registry = std::fs::metadata(data.join("registry.json")).unwrap().len();
    assert!(registry < 64 << 10, "the registry holds {registry} bytes");
    bad.upload(&hostile("normal")).ok();
}

#[test]
fn a_backlog_is_worked_through_in_batches_of_bounded_bytes() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({"max_batch_bytes": 4096}));
    let misbehave = a.processor(guests::MISBEHAVE);
    let p = a.pipeline(json!({"processor": misbehave, "key": "k", "trigger_interval_ms": 50}));
    a.post(&format!("/v1/pipelines/{p}/stop"), &json!({})).ok();
    // A backlog acknowledged while the pipeline is stopped: 1000 rows of ~30 bytes.
    let rows: Vec<Value> = (0..1000)
        .map(|i| json!({"k": format!("k{}", i % 7), "action": "ok"}))
        .collect();
    for chunk in rows.chunks(250) {
        a.rows(&p, chunk).ok();
    }
    a.post(&format!("/v1/pipelines/{p}/start"), &json!({})).ok();
    a.wait_processed(&p, 1000);
    let progress = a.get(&format!("/v1/pipelines/{p}/progress?last=1000")).ok();
    let batches = progress["progress"].as_array().unwrap();
    let line = json!({"k": "k0", "action": "ok"}).to_string().len() as u64 + 1;
    let most = batches
        .iter()
        .map(|b| b["input_rows"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        most * line <= 4096,
        "a batch read {most} rows of {line} bytes"
    );
    assert!(
        batches.len() >= 1000 * line as usize / 4096,
        "{} batches",
        batches.len()
    );
    // Every row exactly once: each key's count reached its number of rows.
    let out = a.output(&p, 10_000);
    assert_eq!(out.len(), 1000);
    for k in 0..7 {
        let key = format!("k{k}");
        let max = out
            .iter()
            .filter(|r| r["k"] == key.as_str())
            .map(|r| r["count"].as_i64().unwrap())
            .max()
            .unwrap();
        assert_eq!(max as usize, (0..1000).filter(|i| i % 7 == k).count());
    }
}

#[test]
fn ingest_is_rate_limited_in_bytes_too() {
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({"ingest_bytes_per_s": 1000}));
    let counter = a.processor(guests::COUNTER);
    let p = a.pipeline(json!({"processor": counter, "key": "k"}));
    let rows: Vec<Value> = (0..20).map(|i| json!({"k": format!("{i:0>60}")})).collect();
    // A full bucket admits one request larger than it, then the tenant waits.
    a.rows(&p, &rows).ok();
    let refused = a
        .rows(&p, &rows)
        .error(429, &["1000 bytes/s", "ingest_bytes_per_s"]);
    assert_eq!(refused["error"]["code"], "rate_limited");
}

#[test]
fn tokens_are_revoked_and_tenants_deleted_with_everything_they_have() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let server = Server::start(&data, &[]);
    let doomed = tenant(&server, "doomed", json!({}));
    let other = tenant(&server, "other", json!({}));
    let me = doomed.get("/v1/tenant").ok();
    let id = me["id"].as_str().unwrap().to_owned();

    // A second token; the first is revoked.
    let second = admin(&server, "POST", &format!("/v1/tenants/{id}/tokens"), None).ok();
    let second = Api {
        server: &server,
        token: second["token"].as_str().unwrap().to_owned(),
    };
    let listed = admin(&server, "GET", &format!("/v1/tenants/{id}"), None).ok();
    let first_id = listed["tokens"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        admin(
            &server,
            "DELETE",
            &format!("/v1/tenants/{id}/tokens/{first_id}"),
            None
        )
        .status,
        204
    );
    doomed.get("/v1/tenant").error(401, &["invalid token"]);
    second.get("/v1/tenant").ok();
    admin(
        &server,
        "DELETE",
        &format!("/v1/tenants/{id}/tokens/tok_nope"),
        None,
    )
    .error(404, &["tok_nope"]);

    // The tenant goes with its pipeline, input, output, state and processors.
    let counter = second.processor(guests::COUNTER);
    let p = second.pipeline(json!({"processor": counter, "key": "k"}));
    second.rows(&p, &[json!({"k": "a"})]).ok();
    second.wait_processed(&p, 1);
    let kept = other.processor(guests::MISBEHAVE);
    let blobs = |d: &Path| std::fs::read_dir(d.join("processors")).unwrap().count();
    assert_eq!(blobs(&data), 2);
    assert_eq!(
        admin(&server, "DELETE", &format!("/v1/tenants/{id}"), None).status,
        204
    );
    second.get("/v1/tenant").error(401, &["invalid token"]);
    admin(&server, "GET", &format!("/v1/tenants/{id}"), None).error(404, &[&id]);
    wait_for(
        "the pipeline's directory to go",
        Duration::from_secs(30),
        || (!data.join("pipelines").join(&p).exists()).then_some(()),
    );
    assert_eq!(blobs(&data), 1);
    // The other tenant keeps everything.
    let still = other.get(&format!("/v1/processors/{kept}")).ok();
    assert_eq!(still["id"], kept.as_str());
    good_tenant_works(&other, 5);
}

#[test]
fn processed_input_is_reclaimed_and_disk_use_is_capped() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let server = Server::start(&data, &[]);
    let a = tenant(&server, "a", json!({}));
    // A processor that emits nothing and keeps no state: the disk holds only input.
    let quiet = a.upload(&hostile("normal")).ok()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let p = a.pipeline(json!({"processor": quiet, "key": "k", "trigger_interval_ms": 50}));
    a.post(&format!("/v1/pipelines/{p}/stop"), &json!({})).ok();
    let used = |a: &Api<'_>| {
        a.get("/v1/tenant").ok()["usage"]["disk_bytes"]
            .as_u64()
            .unwrap()
    };
    let base = used(&a);
    let me = a.get("/v1/tenant").ok()["id"].as_str().unwrap().to_owned();
    admin(
        &server,
        "PATCH",
        &format!("/v1/tenants/{me}/quotas"),
        Some(&json!({"max_disk_bytes": base + 1_000_000})),
    )
    .ok();
    // Requests of ~200 kB pile up while the pipeline is stopped, until the quota says no.
    let rows: Vec<Value> = (0..1000)
        .map(|i| json!({"k": format!("k{}", i % 5), "pad": "x".repeat(180)}))
        .collect();
    let mut accepted = 0;
    let refused = loop {
        let r = a.rows(&p, &rows);
        if r.status != 200 {
            break r;
        }
        accepted += 1000;
        assert!(accepted <= 20_000, "the quota never refused");
    };
    refused.error(403, &["max_disk_bytes"]);
    assert!(accepted >= 3000, "{accepted}");
    assert!(used(&a) > base + 600_000);
    // Processed input is reclaimed: the tenant may send again.
    a.post(&format!("/v1/pipelines/{p}/start"), &json!({})).ok();
    a.wait_processed(&p, accepted);
    wait_for(
        "processed input to be reclaimed",
        Duration::from_secs(30),
        || (used(&a) < base + 300_000).then_some(()),
    );
    let input: u64 = std::fs::read_dir(data.join("pipelines").join(&p).join("input"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(input, 0, "every processed segment is gone or empty");
    a.rows(&p, &rows).ok();
    a.wait_processed(&p, accepted + 1000);
    // Read exactly once across the reclaimed segments, also after a restart.
    let token = a.token.clone();
    drop(a);
    server.shut_down();
    let server = Server::start(&data, &[]);
    let a = Api {
        server: &server,
        token,
    };
    wait_for("the pipeline to resume", Duration::from_secs(60), || {
        (a.rows(&p, &rows[..10]).status == 200).then_some(())
    });
    let progress = wait_for(
        "the rows after the restart",
        Duration::from_secs(60),
        || {
            let pr = a.get(&format!("/v1/pipelines/{p}/progress?last=1000")).ok();
            let total: u64 = pr["progress"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b["input_rows"].as_u64().unwrap())
                .sum();
            (total >= accepted + 1010).then_some(total)
        },
    );
    assert_eq!(progress, accepted + 1010);
}

#[test]
fn the_state_quota_binds_before_a_batch_commits() {
    const HOSTILE_CALLS: &str = env!("STATEBOX_GUEST_HOSTILE_CALLS");
    let scratch = Scratch::new();
    let server = Server::start(&data_dir(&scratch), &[]);
    let a = tenant(&server, "a", json!({}));
    let other = tenant(&server, "other", json!({}));
    let processor = a.processor(HOSTILE_CALLS);
    let p = a.pipeline(json!({"processor": processor, "key": "k", "partitions": 1}));
    a.rows(
        &p,
        &[json!({"k": "small", "action": "write-flood", "n": 1})],
    )
    .ok();
    a.wait_processed(&p, 1);
    let before = a.status(&p);
    let output_before = before["status"]["committed_output_bytes"].as_u64().unwrap();
    let batch_before = before["status"]["last_progress"]["batch_id"].clone();
    let used = a.get("/v1/tenant").ok()["usage"]["state_bytes"]
        .as_u64()
        .unwrap();
    assert!(used > 1 << 20, "one value of 1 MiB is stored: {used}");
    let me = a.get("/v1/tenant").ok()["id"].as_str().unwrap().to_owned();
    let quota = used + (512 << 10);
    admin(
        &server,
        "PATCH",
        &format!("/v1/tenants/{me}/quotas"),
        Some(&json!({"max_state_bytes": quota})),
    )
    .ok();

    // The attack: one batch writes another MiB, past what is left of the quota.
    a.rows(&p, &[json!({"k": "big", "action": "write-flood", "n": 1})])
        .ok();
    let reason = a.wait_failed(&p);
    for fragment in [
        "max_state_bytes",
        &quota.to_string(),
        "nothing of the batch was committed",
    ] {
        assert!(reason.contains(fragment), "`{fragment}` in: {reason}");
    }
    // Nothing of the batch is visible: no output, no progress, no state, no bytes.
    let after = a.status(&p);
    assert_eq!(
        after["status"]["committed_output_bytes"].as_u64().unwrap(),
        output_before
    );
    assert_eq!(after["status"]["last_progress"]["batch_id"], batch_before);
    let usage = a.get("/v1/tenant").ok()["usage"]["state_bytes"]
        .as_u64()
        .unwrap();
    assert!(usage <= quota, "{usage} bytes of state, quota {quota}");
    let blobs = a.get(&format!("/v1/pipelines/{p}/state?var=blob")).ok();
    let keys: Vec<&str> = blobs["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"]["k"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["small"]);
    // Ingest says why; another tenant is untouched.
    a.rows(&p, &[json!({"k": "more", "action": "ok"})])
        .error(403, &["max_state_bytes"]);
    good_tenant_works(&other, 5);

    // With room, the same batch runs again and commits: it was refused, never lost.
    admin(
        &server,
        "PATCH",
        &format!("/v1/tenants/{me}/quotas"),
        Some(&json!({"max_state_bytes": used + (16 << 20)})),
    )
    .ok();
    a.post(&format!("/v1/pipelines/{p}/start"), &json!({})).ok();
    a.wait_processed(&p, 2);
    let out = a.output(&p, 100);
    assert_eq!(out.len(), 2);
    assert_eq!(out[1]["k"], "big");
    assert_eq!(out[1]["count"], 1);
}

#[test]
fn output_past_its_retention_is_dropped_and_its_disk_reclaimed() {
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    let server = Server::start(&data, &[]);
    // By bytes: 2 MB kept (segments of 256 kB), batches of about 1.1 MB of output from a
    // processor that keeps no state (`clock`).
    let a = tenant(&server, "a", json!({"output_retention_bytes": 2_000_000}));
    let misbehave = a.processor(guests::MISBEHAVE);
    let p = a.pipeline(json!({"processor": misbehave, "key": "k", "trigger_interval_ms": 50}));
    let pad = "p".repeat(1000);
    let batch = |i: usize| -> Vec<Value> {
        (0..1000)
            .map(|j| json!({"k": format!("b{i:02}-{j:04}-{pad}"), "action": "clock"}))
            .collect()
    };
    a.rows(&p, &batch(0)).ok();
    a.wait_processed(&p, 1000);
    // A reader's position inside the first batch, which retention will drop.
    let early = a.get(&format!("/v1/pipelines/{p}/output?limit=1")).ok();
    assert_eq!(early["start"], 0);
    let early = early["next"].as_u64().unwrap();
    let disk_bytes = |t: &Api<'_>| {
        t.get("/v1/tenant").ok()["usage"]["disk_bytes"]
            .as_u64()
            .unwrap()
    };
    let disk_after_one = disk_bytes(&a);
    for i in 1..10 {
        a.rows(&p, &batch(i)).ok();
        a.wait_processed(&p, 1000 * (i as u64 + 1));
    }
    let committed = a.status(&p)["status"]["committed_output_bytes"]
        .as_u64()
        .unwrap();
    assert!(committed > 10_000_000, "{committed}");

    // From the start: the newest rows, each batch whole, in order, none missing.
    // Retention runs right after the runner's batches, so a reader may see the last
    // batch's output before the drop it causes.
    let start = wait_for(
        "retention to drop what is past 2 MB",
        Duration::from_secs(60),
        || {
            let page = a.get(&format!("/v1/pipelines/{p}/output?limit=1")).ok();
            let start = page["start"].as_u64().unwrap();
            (committed - start <= 2_000_000).then_some(start)
        },
    );
    assert!(start > early, "nothing was dropped: start {start}");
    let kept = a.output(&p, 10_000);
    assert!(
        committed - start <= 2_000_000 + 1_200_000,
        "{} bytes kept",
        committed - start
    );
    assert_eq!(kept.len() % 1000, 0, "whole batches are kept");
    assert!(!kept.is_empty());
    let oldest = 10 - kept.len() / 1000;
    for (n, batch_rows) in kept.chunks(1000).enumerate() {
        let mut keys: Vec<String> = batch_rows
            .iter()
            .map(|r| r["k"].as_str().unwrap().to_owned())
            .collect();
        keys.sort();
        let i = oldest + n;
        let expected: Vec<String> = (0..1000).map(|j| format!("b{i:02}-{j:04}-{pad}")).collect();
        assert!(keys == expected, "batch {i} is not kept whole");
    }
    // A position that was dropped says so; the tail pages back to the start and stops.
    a.get(&format!("/v1/pipelines/{p}/output?after={early}"))
        .error(410, &["output_retention_bytes", &start.to_string()]);
    a.get(&format!("/v1/pipelines/{p}/output/tail?before={early}"))
        .error(410, &[&start.to_string()]);
    let mut before = committed;
    let mut tail_rows = 0;
    loop {
        let page = a
            .get(&format!(
                "/v1/pipelines/{p}/output/tail?before={before}&limit=1000"
            ))
            .ok();
        tail_rows += page["count"].as_u64().unwrap() as usize;
        before = page["from"].as_u64().unwrap();
        if page["begin"] == true {
            break;
        }
    }
    assert_eq!((before, tail_rows), (start, kept.len()));
    // The dropped bytes no longer take disk: not in the file's blocks, not in the usage.
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(data.join("pipelines").join(&p).join("output.jsonl")).unwrap();
    assert_eq!(file.len(), committed, "offsets are kept");
    assert!(
        file.blocks() * 512 < committed - start + 1_000_000,
        "{} bytes allocated",
        file.blocks() * 512
    );
    // Nine more batches of 1.1 MB took at most the retention's 2 MB (and a segment).
    let disk = disk_bytes(&a);
    assert!(
        disk < disk_after_one + 2_500_000,
        "{disk} bytes on disk, {disk_after_one} after the first batch"
    );

    // By age: rows older than 2 s go even when there are few, once the pipeline ticks.
    let b = tenant(&server, "b", json!({"output_retention_ms": 2000}));
    let misbehave = b.processor(guests::MISBEHAVE);
    let q = b.pipeline(json!({"processor": misbehave, "key": "k", "trigger_interval_ms": 50}));
    b.rows(&q, &[json!({"k": "old", "action": "ok"})]).ok();
    b.wait_processed(&q, 1);
    let committed = b.status(&q)["status"]["committed_output_bytes"].clone();
    let page = wait_for("the old row to expire", Duration::from_secs(60), || {
        let page = b.get(&format!("/v1/pipelines/{q}/output")).ok();
        (page["start"] == committed).then_some(page)
    });
    assert_eq!(page["count"], 0);
    b.rows(&q, &[json!({"k": "new", "action": "ok"})]).ok();
    b.wait_processed(&q, 2);
    let out = b.output(&q, 10);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["k"], "new");
}

/// A memory cgroup with a hard limit holding one process (cgroup v2, or v1's `memory`
/// hierarchy), removed on drop; `None` where the kernel offers neither to this user.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn new(limit: u64) -> Option<MemoryCgroup> {
        let name = format!("statebox-test-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup");
        let (dir, limit_file) = if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            (v2.join(name), "memory.max")
        } else {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        };
        std::fs::create_dir(&dir).ok()?;
        let group = MemoryCgroup { dir };
        std::fs::write(group.dir.join(limit_file), limit.to_string()).ok()?;
        Some(group)
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .expect("move the server into its memory cgroup");
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its processes have ended (the server is dropped first); a cgroup is removed empty.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn two_gib_of_backlog_is_worked_through_under_a_one_gib_memory_limit() {
    const GIB: u64 = 1 << 30;
    let scratch = Scratch::new();
    // The backlog is stored on disk before it is worked through: without room for it the
    // test would fail partway with "No space left on device", which names no cause.
    let free = free_bytes(scratch.path());
    assert!(
        free >= 5 * GIB / 2,
        "this test stores 2 GiB of backlog and needs about 2.5 GiB free in {}; {} MiB are free",
        scratch.path().display(),
        free >> 20
    );
    let cgroup = MemoryCgroup::new(GIB);
    let server = Server::start(&data_dir(&scratch), &[]);
    let pid = server.child.as_ref().unwrap().id();
    match &cgroup {
        Some(group) => group.add(pid),
        None => eprintln!("no memory cgroup available: the peak resident memory is the bound"),
    }
    let a = tenant(&server, "a", json!({}));
    let counter = a.processor(guests::COUNTER);
    let p = a.pipeline(json!({"processor": counter, "key": "k"}));
    a.post(&format!("/v1/pipelines/{p}/stop"), &json!({})).ok();
    // 2 GiB acknowledged while the pipeline is stopped: requests of 16 MiB of 1 KiB rows
    // over 64 keys.
    let pad = "x".repeat(1000);
    let rows_per_request = 16_000u64;
    let body: String = (0..rows_per_request)
        .map(|i| format!("{{\"k\":\"k{}\",\"pad\":\"{pad}\"}}\n", i % 64))
        .collect();
    let requests = (2 * GIB).div_ceil(body.len() as u64);
    // At the default ingest rate (256 MiB/s), some requests are told to retry.
    for _ in 0..requests {
        loop {
            let r = a.jsonl(&p, &body);
            if r.status != 429 {
                r.ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let rows = requests * rows_per_request;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
    a.post(&format!("/v1/pipelines/{p}/start"), &json!({})).ok();
    wait_for(
        "the backlog to be processed",
        Duration::from_secs(600),
        || {
            let s = a.status(&p);
            assert_ne!(s["status"]["state"], "failed", "{s}");
            (s["rows_processed"].as_u64() == Some(rows)).then_some(())
        },
    );
    let peak_mib = proc_status_kib(pid, "VmHWM:") / 1024;
    let limit = if cgroup.is_some() {
        "inside a 1 GiB memory cgroup"
    } else {
        "without a memory cgroup"
    };
    eprintln!("peak resident memory {peak_mib} MiB over {rows} rows, {limit}");
    assert!(
        peak_mib < 1024,
        "the server peaked at {peak_mib} MiB working through 2 GiB of backlog"
    );
    // In batches (64 MiB each by default), every row exactly once (the counter emits each
    // key's rows per call).
    let progress = a.get(&format!("/v1/pipelines/{p}/progress?last=1000")).ok();
    let batches = progress["progress"].as_array().unwrap().len() as u64;
    assert!(batches >= 2 * GIB / (64 << 20), "{batches} batches");
    let out = a.output(&p, 10_000);
    for k in 0..64u64 {
        let key = format!("k{k}");
        let count: u64 = out
            .iter()
            .filter(|r| r["key"] == key.as_str())
            .map(|r| r["count"].as_u64().unwrap())
            .sum();
        assert_eq!(count, rows / 64, "key {key}");
    }
    drop(server);
}

#[test]
fn the_data_directory_is_accessible_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let data = data_dir(&scratch);
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(&data, &[]);
    let a = tenant(&server, "a", json!({}));
    let counter = a.processor(guests::COUNTER);
    a.pipeline(json!({"processor": counter, "key": "k"}));
    // Every tenant's input, output and state and the registry lie under it.
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data directory's mode is {mode:o}");
    assert!(data.join("registry.json").is_file());
    assert!(data.join("pipelines").read_dir().unwrap().count() == 1);
}

/// Bytes free for an unprivileged user on the file system holding `path` (`df`).
fn free_bytes(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .expect("run df");
    assert!(out.status.success(), "df {}: {out:?}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("df {}: unexpected output {text:?}", path.display()))
}
