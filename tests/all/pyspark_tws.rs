//! PySpark's `TwsTester` on Statebox (issue 16): the suite in the shape of Spark's own
//! TwsTester tests (`guest-sdk/python/tests/test_tws_tester.py`, which also passes on
//! PySpark 4.3's own tester) runs unchanged on the Python SDK's tester, in memory, and
//! against the real host: every tester there builds its processor into a component and
//! drives it through `statebox tws-driver` (real schema checks, timers, the engine). There
//! `update*State` and `deleteState` write through the host's state imports (a value that
//! does not match its schema is refused and nothing is written), and `setWatermark` moves
//! the query's watermark, so the engine fires event-time timers as in production.

use std::path::Path;
use std::process::{Command, Stdio};

use statebox_tests::{component_cache, statebox_bin};

fn run_suite(host: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let python = std::env::var_os("STATEBOX_PYTHON").unwrap_or_else(|| "python3".into());
    let out = Command::new(python)
        .args(["-m", "unittest", "-v", "test_tws_tester"])
        .current_dir(root.join("guest-sdk/python/tests"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("STATEBOX_TWS_HOST", if host { "1" } else { "0" })
        .env("STATEBOX", statebox_bin())
        .env("STATEBOX_CACHE_DIR", component_cache())
        .env_remove("STATEBOX_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let report = format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\nOK"), "{report}");
    // Every test ran: none skipped.
    assert!(stderr.contains("Ran 19 tests"), "{report}");
    assert!(!stderr.contains("skipped"), "{report}");
}

#[test]
fn a_twstester_suite_passes_on_the_sdk_in_memory() {
    run_suite(false);
}

#[test]
fn the_same_twstester_suite_passes_against_the_real_host() {
    run_suite(true);
}
