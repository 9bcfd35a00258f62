//! Loading components: every guest loads and describes itself; files that are not a
//! processor component are refused with a message that says what is wrong.

use std::path::Path;

use statebox_runtime::{LoadError, Runtime};
use statebox_tests::{Rng, Scratch, StateboxRun, guests, runtime, set_last_used};

fn load_error(rt: &Runtime, bytes: &[u8]) -> String {
    match rt.load(bytes) {
        Ok(p) => panic!("loading should fail, but got processor `{}`", p.info().name),
        Err(e @ LoadError::Invalid(_)) => e.to_string(),
        Err(e) => panic!("expected LoadError::Invalid, got {e:?}"),
    }
}

#[test]
fn every_guest_loads_and_describes_itself() {
    let rt = runtime(Default::default());
    let cases = [
        (guests::COUNTER, "counter", "key string, count long", None),
        (
            guests::SESSION_TRACKER,
            "session-tracker",
            "user_id string, distinct_sessions long, total_events long",
            Some("user_id string, session_id string"),
        ),
        (
            guests::SCD1,
            "scd1",
            "user string, time long, location string",
            Some("user string, time long, location string"),
        ),
        (
            guests::MISBEHAVE,
            "misbehave",
            "k string, action string, detail string, count long",
            Some("k string, action string"),
        ),
        (
            guests::STATE_OPS,
            "state-ops",
            "k string, op string, result string",
            None,
        ),
        (
            guests::STATE_OPS_HELD,
            "state-ops",
            "k string, op string, result string",
            None,
        ),
    ];
    for (wasm, name, output, input) in cases {
        let p = rt
            .load_file(Path::new(wasm))
            .unwrap_or_else(|e| panic!("{wasm}: {e}"));
        let info = p.info();
        assert_eq!(info.name, name);
        let canonical = |ddl: &str| statebox_schema::Schema::parse_ddl(ddl).unwrap().to_ddl();
        assert_eq!(info.output_schema.to_ddl(), canonical(output), "{name}");
        assert_eq!(
            info.input_schema.as_ref().map(|s| s.to_ddl()),
            input.map(canonical),
            "{name}"
        );
        assert_eq!(p.hash().len(), 64, "a hex BLAKE3 hash");
    }
}

#[test]
fn random_bytes_are_not_webassembly() {
    let rt = runtime(Default::default());
    let mut rng = Rng::new(7);
    let bytes: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
    let err = load_error(&rt, &bytes);
    assert!(err.contains("not WebAssembly"), "{err}");
    let err = load_error(&rt, b"");
    assert!(err.contains("not WebAssembly"), "{err}");
}

#[test]
fn a_core_module_is_not_a_component() {
    let rt = runtime(Default::default());
    let err = load_error(&rt, b"\0asm\x01\0\0\0");
    assert!(err.contains("core WebAssembly module"), "{err}");
    assert!(err.contains("wasm32-wasip2"), "says how to fix it: {err}");
}

#[test]
fn an_empty_component_does_not_implement_the_world() {
    let rt = runtime(Default::default());
    let err = load_error(&rt, b"\0asm\x0d\0\x01\0");
    assert!(
        err.contains("does not implement world statebox:processor/stateful-processor@0.1.0"),
        "{err}"
    );
    assert!(
        err.contains("statebox:processor/processor"),
        "names the missing export: {err}"
    );
}

#[test]
fn a_truncated_component_is_refused() {
    let rt = runtime(Default::default());
    let bytes = std::fs::read(guests::COUNTER).unwrap();
    let err = load_error(&rt, &bytes[..bytes.len() / 2]);
    assert!(err.starts_with("invalid processor component:"), "{err}");
}

#[test]
fn a_missing_file_is_named() {
    let rt = runtime(Default::default());
    let missing = Path::new("/nonexistent/processor.wasm");
    match rt.load_file(missing) {
        Err(e @ LoadError::Read { .. }) => {
            assert!(e.to_string().contains("/nonexistent/processor.wasm"), "{e}")
        }
        Err(e) => panic!("expected LoadError::Read, got {e:?}"),
        Ok(_) => panic!("loading a missing file should fail"),
    }
}

#[test]
fn the_cli_names_the_file_and_the_problem() {
    let s = Scratch::new();
    s.write_text("a.jsonl", "{\"k\":\"a\"}\n");
    let cases: [(&str, &[u8], &str); 3] = [
        ("junk.wasm", b"this is not wasm at all", "not WebAssembly"),
        ("module.wasm", b"\0asm\x01\0\0\0", "core WebAssembly module"),
        (
            "empty.wasm",
            b"\0asm\x0d\0\x01\0",
            "does not implement world",
        ),
    ];
    for (name, bytes, reason) in cases {
        let path = s.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let run = s.run_cmd(path.to_str().unwrap(), "k").run();
        run.expect_error(&["cannot load processor", name, reason]);
    }
    assert!(
        !s.output().exists(),
        "nothing runs when the processor does not load"
    );
    // A missing processor file also fails cleanly.
    StateboxRun::new("/nonexistent/processor.wasm")
        .args(["--input", s.input().to_str().unwrap()])
        .args(["--output", s.output().to_str().unwrap()])
        .args(["--checkpoint", s.checkpoint().to_str().unwrap()])
        .args(["--key", "k"])
        .run()
        .expect_error(&["/nonexistent/processor.wasm"]);
}

/// The cache of compiled components stays within its bound: compiling a component into a
/// full cache removes the least recently used artefacts, and loading one from the cache
/// counts as a use.
#[test]
fn the_compiled_component_cache_removes_what_was_used_least_recently() {
    use statebox_runtime::RuntimeConfig;
    use statebox_runtime::cache::COMPILED_MAX_BYTES;
    use std::time::Duration;

    let scratch = Scratch::new();
    let cache = scratch.path().join("compiled");
    let rt = Runtime::new(RuntimeConfig {
        cache_dir: Some(cache.clone()),
        cache_max_bytes: Some(COMPILED_MAX_BYTES),
        ..RuntimeConfig::default()
    })
    .unwrap();
    let artefacts = || -> Vec<std::path::PathBuf> {
        let mut all: Vec<_> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
            .collect();
        all.sort();
        all
    };
    let day = Duration::from_secs(86_400);

    // The counter's artefact, last used two days ago.
    rt.load_file(Path::new(guests::COUNTER)).unwrap();
    let [counter] = artefacts().try_into().unwrap();
    set_last_used(&counter, 2 * day);
    // Another artefact, the cache's whole bound on its own (sparse: no disk), last used a
    // day ago.
    let stale = cache.join("stale.cwasm");
    std::fs::File::create(&stale)
        .unwrap()
        .set_len(COMPILED_MAX_BYTES)
        .unwrap();
    set_last_used(&stale, day);
    // Loaded from the cache: the counter's artefact is now the most recently used.
    rt.load_file(Path::new(guests::COUNTER)).unwrap();
    // Compiling another component fills the cache past its bound: the stale artefact goes,
    // the counter's stays.
    rt.load_file(Path::new(guests::SCD1)).unwrap();
    let left = artefacts();
    assert!(
        !stale.exists(),
        "the least recently used artefact stayed: {left:?}"
    );
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.contains(&counter), "{left:?}");
}
