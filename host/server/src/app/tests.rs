//! The domain operations of the [`App`], without HTTP: over a temporary data directory,
//! with the real runtime and the counter plugin's component.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use super::pipelines::PipelineSpec;
use super::{App, AppError};
use crate::auth::Caller;
use crate::pipeline::RunState;
use crate::registry::Desired;
use crate::{HttpLimits, Quotas, ServerConfig};

/// An app over a fresh data directory (dropped with it). Compiled components go to one
/// cache shared by the tests, so the counter compiles once.
struct TestApp {
    app: Arc<App>,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TestApp {
    type Target = Arc<App>;
    fn deref(&self) -> &Arc<App> {
        &self.app
    }
}

/// `<target>/`, from the test binary's path (`<target>/<profile>/deps/<binary>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("the target directory")
        .to_owned()
}

fn test_app(default_quotas: Quotas) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let cache = target_dir().join("server-unit-tests-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let app = App::open(ServerConfig {
        data_dir: dir.path().to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_token: "adm_0123456789abcdef".into(),
        cache_dir: Some(cache),
        default_quotas,
        max_attempts: 3,
        retry_backoff: Duration::from_millis(50),
        http: HttpLimits::default(),
    })
    .unwrap();
    TestApp { app, _dir: dir }
}

/// The counter plugin's component, built for `wasm32-wasip2` the way `tests/build.rs`
/// builds the guests, into the same directory (so after a build of the tests it is there
/// already and cargo has nothing to do).
fn counter_wasm() -> Vec<u8> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let path = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .expect("the workspace root")
            .to_owned();
        let target = target_dir().join("wasm-guests");
        let mut cmd =
            std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(&root)
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "-p",
                "counter",
            ])
            .arg("--target-dir")
            .arg(&target);
        // Flags meant for the host build must not leak into the guest build.
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            cmd.env_remove(var);
        }
        let status = cmd.status().expect("run cargo to build the counter plugin");
        assert!(
            status.success(),
            "building plugins/counter for wasm32-wasip2 failed"
        );
        target.join("wasm32-wasip2/release/counter.wasm")
    });
    std::fs::read(path).expect("the counter component")
}

/// A runtime for the app's async operations (ingest, reads) in a test thread.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn bad_input(e: AppError) -> String {
    match e {
        AppError::BadInput(m) => m,
        other => panic!("expected bad input, got {other:?}"),
    }
}

#[test]
fn tenants_are_created_with_a_token_patched_and_deleted() {
    let app = test_app(Quotas::default());
    let (tenant, token) = app
        .create_tenant("acme".into(), Some(json!({"max_pipelines": 2})))
        .unwrap();
    assert_eq!(tenant.quotas.max_pipelines, 2);
    assert_eq!(
        tenant.quotas.max_processors,
        Quotas::default().max_processors
    );
    assert_eq!(
        app.authenticate(&token),
        Some(Caller::Tenant(tenant.id.clone()))
    );
    assert_eq!(
        app.authenticate("adm_0123456789abcdef"),
        Some(Caller::Admin)
    );
    assert_eq!(app.authenticate("sbx_guess"), None);

    // Bad input names the field at fault.
    let e = bad_input(app.create_tenant("  ".into(), None).unwrap_err());
    assert_eq!(e, "`name` must not be empty");
    let e = bad_input(app.create_tenant("x".repeat(300), None).unwrap_err());
    assert!(e.starts_with("`name` is 300 bytes long"), "{e}");
    let e = bad_input(app.create_tenant("a".into(), Some(json!(3))).unwrap_err());
    assert_eq!(e, "`quotas` must be a JSON object");
    let e = bad_input(
        app.create_tenant("a".into(), Some(json!({"max_pipelinez": 1})))
            .unwrap_err(),
    );
    assert!(e.contains("max_pipelinez"), "{e}");
    let e = bad_input(
        app.patch_quotas(&tenant.id, json!({"max_workers": 0}))
            .unwrap_err(),
    );
    assert_eq!(e, "quota `max_workers` must be positive");
    assert_eq!(app.tenants().len(), 1, "a refused tenant is not stored");

    let patched = app
        .patch_quotas(&tenant.id, json!({"ingest_rows_per_s": 5}))
        .unwrap();
    assert_eq!(patched.quotas.ingest_rows_per_s, 5);
    assert_eq!(patched.quotas.max_pipelines, 2, "other fields are kept");

    // A second token works until it is revoked; the first keeps working.
    let (record, second) = app.issue_token(&tenant.id).unwrap();
    assert_eq!(
        app.authenticate(&second),
        Some(Caller::Tenant(tenant.id.clone()))
    );
    app.revoke_token(&tenant.id, &record.id).unwrap();
    assert_eq!(app.authenticate(&second), None);
    assert!(app.authenticate(&token).is_some());
    assert!(matches!(
        app.revoke_token(&tenant.id, &record.id),
        Err(AppError::NotFound { what: "token", .. })
    ));

    let usage = app.tenant_usage(&tenant.id).unwrap();
    assert_eq!((usage.processors, usage.pipelines), (0, 0));

    // The tenant and its tokens are gone, also for a server opened on the directory again.
    app.delete_tenant(&tenant.id).unwrap();
    assert_eq!(app.authenticate(&token), None);
    assert!(matches!(
        app.tenant(&tenant.id),
        Err(AppError::NotFound { what: "tenant", .. })
    ));
    assert!(matches!(
        app.delete_tenant(&tenant.id),
        Err(AppError::NotFound { .. })
    ));
}

#[test]
fn uploads_that_are_not_processors_or_over_quota_are_refused() {
    let app = test_app(Quotas::default());
    let (tenant, _) = app
        .create_tenant("t".into(), Some(json!({"max_disk_bytes": 100})))
        .unwrap();
    let e = bad_input(app.upload_processor(&tenant.id, b"").unwrap_err());
    assert!(e.starts_with("the request body is empty"), "{e}");
    // Over the disk quota before anything is compiled.
    match app.upload_processor(&tenant.id, &[0u8; 200]).unwrap_err() {
        AppError::Quota(m) => assert!(m.contains("`max_disk_bytes`"), "{m}"),
        other => panic!("expected a quota refusal, got {other:?}"),
    }
    app.patch_quotas(&tenant.id, json!({"max_disk_bytes": 1 << 30}))
        .unwrap();
    match app
        .upload_processor(&tenant.id, b"\0asm not a component")
        .unwrap_err()
    {
        AppError::InvalidProcessor(m) => assert!(!m.is_empty()),
        other => panic!("expected an invalid processor, got {other:?}"),
    }
    assert!(app.processors(&tenant.id).is_empty());
    assert!(matches!(
        app.processor(&tenant.id, "pr_missing"),
        Err(AppError::NotFound {
            what: "processor",
            ..
        })
    ));
}

#[test]
fn pipeline_settings_are_checked_naming_the_field() {
    let app = test_app(Quotas::default());
    let (tenant, _) = app.create_tenant("t".into(), None).unwrap();
    let create = |f: &dyn Fn(&mut PipelineSpec)| {
        let mut spec = PipelineSpec::new("pr_missing", "k");
        f(&mut spec);
        app.create_pipeline(&tenant.id, spec).unwrap_err()
    };
    let e = bad_input(create(&|s| {
        s.key = super::pipelines::KeyColumns::One(",".into())
    }));
    assert!(e.starts_with("`key` must name"), "{e}");
    let e = bad_input(create(&|s| s.partitions = Some(0)));
    assert_eq!(e, "`partitions` must be between 1 and 1024");
    let e = bad_input(create(&|s| s.trigger_interval_ms = Some(1)));
    assert_eq!(e, "`trigger_interval_ms` must be between 10 and 86400000");
    let e = bad_input(create(&|s| {
        s.time_mode = Some(statebox_engine::TimeMode::EventTime)
    }));
    assert!(e.starts_with("`event_time`"), "{e}");
    let e = bad_input(create(&|s| s.name = Some("n".repeat(1000))));
    assert!(e.starts_with("`name` is longer"), "{e}");
    let e = bad_input(create(&|s| {
        s.source =
            serde_json::from_value(json!({"kafka": {"brokers": "h", "topics": "t"}})).unwrap()
    }));
    assert!(e.starts_with("`source.kafka.brokers`"), "{e}");
    // A broker the admin did not grant the tenant.
    match create(&|s| {
        s.source =
            serde_json::from_value(json!({"kafka": {"brokers": "h:9092", "topics": "t"}})).unwrap()
    }) {
        AppError::KafkaBrokerNotGranted(m) => assert!(m.contains("`h:9092`"), "{m}"),
        other => panic!("expected a broker refusal, got {other:?}"),
    }
    // All settings right, but no such processor.
    assert!(matches!(
        create(&|_| {}),
        AppError::NotFound {
            what: "processor",
            ..
        }
    ));
    assert!(app.pipelines_of(&tenant.id).is_empty());
}

/// Waits until the pipeline has processed `rows` rows.
fn wait_processed(app: &App, tenant: &str, id: &str, rows: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h = app.pipeline_handle(tenant, id).unwrap();
        let processed = h
            .metrics
            .input_rows
            .load(std::sync::atomic::Ordering::Acquire);
        if processed >= rows {
            assert_eq!(processed, rows);
            return;
        }
        let status = h.status();
        assert_ne!(status.state, RunState::Failed, "{:?}", status.failure);
        assert!(
            Instant::now() < deadline,
            "not processed in time: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_pipeline_is_created_fed_stopped_started_and_deleted() {
    let app = test_app(Quotas::default());
    let rt = runtime();
    let (tenant, _) = app
        .create_tenant("t".into(), Some(json!({"max_pipelines": 1})))
        .unwrap();
    let t = tenant.id.as_str();
    let wasm = counter_wasm();
    let uploaded = app.upload_processor(t, &wasm).unwrap();
    assert!(uploaded.created);
    let processor = uploaded.record;
    assert_eq!(processor.name, "counter");
    let names: Vec<&str> = processor
        .state_variables
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["count", "batchCounts", "stats"]);
    // The same component again: the stored record, nothing new.
    let again = app.upload_processor(t, &wasm).unwrap();
    assert!(!again.created);
    assert_eq!(again.record.id, processor.id);
    assert_eq!(app.processors(t).len(), 1);

    let mut spec = PipelineSpec::new(&processor.id, "k");
    spec.partitions = Some(2);
    spec.trigger_interval_ms = Some(50);
    let pipeline = app.create_pipeline(t, spec).unwrap();
    let id = pipeline.record.id.clone();
    assert_eq!(pipeline.record.desired, Desired::Running);
    assert_eq!(pipeline.record.key, ["k"]);
    // The tenant's quota of one pipeline is taken.
    match app
        .create_pipeline(t, PipelineSpec::new(&processor.id, "k"))
        .unwrap_err()
    {
        AppError::Quota(m) => assert!(m.contains("`max_pipelines`"), "{m}"),
        other => panic!("expected a quota refusal, got {other:?}"),
    }
    // A processor in use is not deleted.
    match app.delete_processor(t, &processor.id).unwrap_err() {
        AppError::Conflict { message, .. } => assert!(message.contains(&id), "{message}"),
        other => panic!("expected a conflict, got {other:?}"),
    }

    // Rows are acknowledged, processed and read back as output.
    let handle = rt.block_on(app.ingest_target(t, &id)).unwrap();
    let body = b"{\"k\":\"a\"}\n{\"k\":\"b\"}\n{\"k\":\"a\"}\n".to_vec();
    assert_eq!(rt.block_on(app.ingest(&handle, body.into())).unwrap(), 3);
    let e = rt
        .block_on(app.ingest(&handle, b"{\"k\":1}\n{\"v\":2}\n".to_vec().into()))
        .unwrap_err();
    assert_eq!(
        bad_input(e),
        "row 1: the row has no key column `k`; no row of this request was accepted"
    );
    wait_processed(&app, t, &id, 3);
    let page = rt.block_on(app.read_output(t, &id, 0, None)).unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&page.rows_json).unwrap();
    let mut counts: Vec<(String, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["count"].as_i64().unwrap(),
            )
        })
        .collect();
    counts.sort();
    assert_eq!(counts, [("a".to_owned(), 2), ("b".to_owned(), 1)]);
    assert_eq!(page.next, page.committed);
    let e = bad_input(
        rt.block_on(app.read_output(t, &id, page.committed + 1, None))
            .unwrap_err(),
    );
    assert!(
        e.starts_with(&format!("`after` {}", page.committed + 1)),
        "{e}"
    );

    // Stopped, it stays stopped (also in the registry) and keeps taking rows; started
    // again, it processes them.
    let stopped = app.stop_pipeline(t, &id).unwrap();
    assert_eq!(stopped.record.desired, Desired::Stopped);
    assert_eq!(
        stopped.handle.as_ref().unwrap().status().state,
        RunState::Stopped
    );
    assert_eq!(
        rt.block_on(app.ingest(&handle, b"{\"k\":\"a\"}".to_vec().into()))
            .unwrap(),
        1
    );
    let started = app.start_pipeline(t, &id).unwrap();
    assert_eq!(started.record.desired, Desired::Running);
    wait_processed(&app, t, &id, 4);
    let (rows, truncated) = rt
        .block_on(app.read_state(
            t,
            &id,
            super::reads::StateQuery {
                var: Some("count".into()),
                flatten: true,
                ..Default::default()
            },
        ))
        .unwrap();
    assert!(!truncated);
    let a = rows
        .iter()
        .find(|r| r["key"]["k"] == "a")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(a["value"], 3, "{rows:?}");

    // An upgrade to the same component is compatible and keeps the pipeline running.
    let upgraded = app.upgrade_pipeline(t, &id, &processor.id).unwrap();
    assert!(!upgraded.http_grant_dropped);
    assert!(!upgraded.report.is_empty());
    assert_eq!(upgraded.pipeline.record.desired, Desired::Running);
    assert!(matches!(
        app.upgrade_pipeline(t, &id, "pr_missing"),
        Err(AppError::NotFound {
            what: "processor",
            ..
        })
    ));
    // The admin's grant of outbound HTTP names the host at fault.
    let e = bad_input(
        app.grant_http_hosts(&id, &["ok.example".into(), "bad host".into()])
            .unwrap_err(),
    );
    assert!(e.starts_with("`http_hosts[1]`"), "{e}");

    // Past the ingest rate, rows are refused with when to retry, and nothing is taken.
    app.patch_quotas(t, json!({"ingest_rows_per_s": 2}))
        .unwrap();
    app.buckets.lock().unwrap().clear();
    // A full bucket admits one request larger than itself (and goes into debt).
    let many = b"{\"k\":\"c\"}\n{\"k\":\"c\"}\n{\"k\":\"c\"}\n".to_vec();
    assert_eq!(rt.block_on(app.ingest(&handle, many.into())).unwrap(), 3);
    match rt
        .block_on(app.ingest(&handle, b"{\"k\":\"c\"}".to_vec().into()))
        .unwrap_err()
    {
        AppError::RateLimited {
            message,
            retry_after,
        } => {
            assert!(message.contains("`ingest_rows_per_s`"), "{message}");
            assert!(retry_after >= 1);
        }
        other => panic!("expected a rate limit, got {other:?}"),
    }
    wait_processed(&app, t, &id, 7);

    // Another tenant sees none of it.
    let (other, _) = app.create_tenant("other".into(), None).unwrap();
    assert!(matches!(
        app.pipeline_view(&other.id, &id),
        Err(AppError::NotFound { .. })
    ));
    assert!(matches!(
        app.stop_pipeline(&other.id, &id),
        Err(AppError::NotFound { .. })
    ));

    // Deleted with its directory; then its processor can go too.
    let dir = app.pipeline_dir(&id);
    assert!(dir.exists());
    app.delete_pipeline(t, &id).unwrap();
    assert!(!dir.exists());
    assert!(matches!(
        app.pipeline_view(t, &id),
        Err(AppError::NotFound { .. })
    ));
    app.delete_processor(t, &processor.id).unwrap();
    assert!(!app.blob_path(&processor.hash).exists());
}

#[test]
fn a_data_directory_serves_one_server_at_a_time() {
    let first = test_app(Quotas::default());
    let config = first.config.clone();
    match App::open(config) {
        Err(crate::ServeError::DataDirInUse(dir)) => assert_eq!(dir, first.config.data_dir),
        Err(other) => panic!("expected the directory in use, got {other}"),
        Ok(_) => panic!("a second server opened the same data directory"),
    }
}

/// A tenant's pipelines share the memtable room of one database, and another tenant's
/// pipeline has a room of its own; a stopped pipeline's database leaves its tenant's room.
#[test]
fn a_tenants_pipelines_share_the_memtables_of_one_database() {
    let app = test_app(Quotas::default());
    let rt = runtime();
    let wasm = counter_wasm();
    let mut running = Vec::new();
    for (name, pipelines) in [("a", 2), ("b", 1)] {
        let (tenant, _) = app.create_tenant(name.into(), None).unwrap();
        let processor = app.upload_processor(&tenant.id, &wasm).unwrap().record;
        for _ in 0..pipelines {
            let mut spec = PipelineSpec::new(&processor.id, "k");
            spec.trigger_interval_ms = Some(50);
            let id = app.create_pipeline(&tenant.id, spec).unwrap().record.id;
            let handle = rt.block_on(app.ingest_target(&tenant.id, &id)).unwrap();
            let row = b"{\"k\":\"a\"}".to_vec();
            assert_eq!(rt.block_on(app.ingest(&handle, row.into())).unwrap(), 1);
            running.push((tenant.id.clone(), id));
        }
    }
    // A pipeline that processed a row has its checkpoint open.
    for (tenant, id) in &running {
        wait_processed(&app, tenant, id, 1);
    }
    let (a, b) = (&running[0].0, &running[2].0);
    assert_eq!(app.memtables(a).databases(), 2);
    assert_eq!(app.memtables(b).databases(), 1);
    assert!(!Arc::ptr_eq(&app.memtables(a), &app.memtables(b)));

    app.stop_pipeline(a, &running[0].1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.memtables(a).databases() != 1 {
        assert!(Instant::now() < deadline, "{:?}", app.memtables(a));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(app.memtables(b).databases(), 1);
}
