//! Shared helpers of the end-to-end tests: where the guests and the `statebox` binary are,
//! scratch directories with input, output and checkpoint, running the CLI, and running a
//! query in-process through the engine.

pub mod kafka;
pub mod s3;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::Value;
use statebox_engine::{BatchReport, EngineError, Query, QueryOptions};
use statebox_runtime::{Limits, Processor, Runtime, RuntimeConfig};

/// The guest components, built by `build.rs` for `wasm32-wasip2`.
pub mod guests {
    /// `plugins/counter`.
    pub const COUNTER: &str = env!("STATEBOX_GUEST_COUNTER");
    /// `plugins/session-tracker`.
    pub const SESSION_TRACKER: &str = env!("STATEBOX_GUEST_SESSION_TRACKER");
    /// `plugins/sessionizer`.
    pub const SESSIONIZER: &str = env!("STATEBOX_GUEST_SESSIONIZER");
    /// `plugins/scd1`.
    pub const SCD1: &str = env!("STATEBOX_GUEST_SCD1");
    /// `tests/guests/misbehave`.
    pub const MISBEHAVE: &str = env!("STATEBOX_GUEST_MISBEHAVE");
    /// `tests/guests/state-ops`.
    pub const STATE_OPS: &str = env!("STATEBOX_GUEST_STATE_OPS");
    /// `tests/guests/state-ops-held`: `state-ops` with its writes held back.
    pub const STATE_OPS_HELD: &str = env!("STATEBOX_GUEST_STATE_OPS_HELD");
}

/// The profile directory the test binary runs from (`<target>/release`), where cargo also
/// puts the `statebox` binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    // <target>/<profile>/deps/all-<hash>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_owned()
}

/// The `statebox` CLI binary of the same build as the tests. `STATEBOX_TEST_BIN` names
/// another binary instead, e.g. an older build, to show which tests fail on the code before
/// a change.
///
/// # Panics
///
/// If it has not been built: cargo does not build another package's binaries for a test.
pub fn statebox_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("STATEBOX_TEST_BIN") {
        return PathBuf::from(bin);
    }
    let dir = profile_dir();
    let bin = dir.join(format!("statebox{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the statebox binary is missing at {}: build it first with \
         `cargo build --release -p statebox` (same profile and CARGO_TARGET_DIR as the tests)",
        bin.display()
    );
    bin
}

/// A compiled-component cache shared by every test and CLI run of this build, so each guest
/// is compiled once.
pub fn component_cache() -> PathBuf {
    profile_dir().join("statebox-test-component-cache")
}

/// A temporary directory holding a query's input directory, output file and checkpoint.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Scratch {
    /// A fresh scratch directory with an empty `input/` directory.
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("statebox-test-")
            .tempdir()
            .expect("create a temporary directory");
        std::fs::create_dir(dir.path().join("input")).expect("create input/");
        Scratch { dir }
    }

    /// The scratch directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The input directory.
    pub fn input(&self) -> PathBuf {
        self.path().join("input")
    }

    /// The output file.
    pub fn output(&self) -> PathBuf {
        self.path().join("out.jsonl")
    }

    /// The checkpoint directory.
    pub fn checkpoint(&self) -> PathBuf {
        self.path().join("checkpoint")
    }

    /// Writes input file `name` with one JSON row per line.
    pub fn write_rows(&self, name: &str, rows: &[Value]) {
        let mut text = String::new();
        for row in rows {
            text.push_str(&row.to_string());
            text.push('\n');
        }
        self.write_text(name, &text);
    }

    /// Writes input file `name` verbatim. The file is written aside and renamed in, as the
    /// file source expects of complete files.
    pub fn write_text(&self, name: &str, text: &str) {
        let tmp = self.input().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).expect("write input file");
        std::fs::rename(&tmp, self.input().join(name)).expect("move input file in");
    }

    /// The output file's bytes (empty if it does not exist).
    pub fn output_bytes(&self) -> Vec<u8> {
        std::fs::read(self.output()).unwrap_or_default()
    }

    /// The output rows, parsed.
    pub fn output_rows(&self) -> Vec<Value> {
        parse_jsonl(&self.output_bytes())
    }

    /// A `statebox run` over this scratch directory with the given processor and key.
    pub fn run_cmd(&self, processor: &str, key: &str) -> StateboxRun {
        StateboxRun::new(processor)
            .args(["--input".as_ref(), self.input().as_os_str()])
            .args(["--output".as_ref(), self.output().as_os_str()])
            .args(["--checkpoint".as_ref(), self.checkpoint().as_os_str()])
            .args(["--key", key])
    }
}

/// Parses JSON Lines.
pub fn parse_jsonl(bytes: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(bytes).expect("output is UTF-8");
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad output line {line}: {e}"))
        })
        .collect()
}

/// A `statebox run` command line.
pub struct StateboxRun {
    cmd: Command,
}

/// How a `statebox run` ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The exit code; `None` if a signal ended the process.
    pub code: Option<i32>,
    /// Standard error.
    pub stderr: String,
}

impl RunOutcome {
    /// Asserts the run succeeded and returns its standard error.
    #[track_caller]
    pub fn expect_ok(self) -> String {
        assert_eq!(self.code, Some(0), "statebox run failed:\n{}", self.stderr);
        self.stderr
    }

    /// Asserts the run failed cleanly (exit code 1, not a crash) with an `error:` message
    /// containing every fragment, and returns the message (everything from `error:` on).
    #[track_caller]
    pub fn expect_error(self, fragments: &[&str]) -> String {
        assert_eq!(
            self.code,
            Some(1),
            "statebox run should fail with exit code 1:\n{}",
            self.stderr
        );
        // The message starts at the `error:` line and may span several lines (a trap's
        // wasm backtrace, the guest's stderr).
        let start = self
            .stderr
            .find("error: ")
            .filter(|&i| i == 0 || self.stderr.as_bytes()[i - 1] == b'\n')
            .unwrap_or_else(|| panic!("no `error:` line in stderr:\n{}", self.stderr));
        let error = self.stderr[start..].to_owned();
        for fragment in fragments {
            assert!(
                error.contains(fragment),
                "the error should mention `{fragment}`:\n{error}"
            );
        }
        error
    }
}

impl StateboxRun {
    /// `statebox run --processor <processor>`, with the shared component cache.
    pub fn new(processor: &str) -> StateboxRun {
        let mut cmd = Command::new(statebox_bin());
        cmd.arg("run")
            .args(["--processor", processor])
            .env("STATEBOX_CACHE_DIR", component_cache())
            .env_remove("STATEBOX_LOG")
            .stdin(Stdio::null());
        StateboxRun { cmd }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> StateboxRun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    /// The command, to spawn it yourself.
    pub fn command(self) -> Command {
        self.cmd
    }

    /// Runs to completion.
    pub fn run(mut self) -> RunOutcome {
        let out = self
            .cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("spawn statebox");
        RunOutcome {
            code: out.status.code(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// Sets the modification time of `path` to `ago` before now: when the caches (compiled
/// components, Python builds) last saw the entry used.
pub fn set_last_used(path: &Path, ago: std::time::Duration) {
    std::fs::File::options()
        .append(true)
        .open(path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now() - ago))
        .unwrap_or_else(|e| panic!("set the modification time of {}: {e}", path.display()));
}

/// A runtime with the shared component cache.
pub fn runtime(limits: Limits) -> Runtime {
    Runtime::new(runtime_config(limits)).expect("create a runtime")
}

/// The configuration of [`runtime`]: the shared component cache, bounded as the CLI's is.
pub fn runtime_config(limits: Limits) -> RuntimeConfig {
    RuntimeConfig {
        cache_dir: Some(component_cache()),
        cache_max_bytes: Some(statebox_runtime::cache::COMPILED_MAX_BYTES),
        limits,
        per_key_calls: false,
    }
}

/// A query run in-process through the engine, over a [`Scratch`] directory, with one
/// input file per call of [`batch`](Self::batch).
pub struct EngineQuery {
    /// The scratch directory.
    pub scratch: Scratch,
    runtime: Arc<Runtime>,
    processor: Arc<Processor>,
    opts: QueryOptions,
    query: Option<Query>,
    files: usize,
    read: usize,
}

impl EngineQuery {
    /// Opens a query of the guest at `wasm`, keyed by `key`, with the given partitions, on
    /// a runtime of its own.
    pub fn open(wasm: &str, key: &str, partitions: u16, limits: Limits) -> EngineQuery {
        EngineQuery::open_on(Arc::new(runtime(limits)), wasm, key, partitions)
    }

    /// Like [`open`](Self::open), on a runtime shared with other queries.
    pub fn open_on(runtime: Arc<Runtime>, wasm: &str, key: &str, partitions: u16) -> EngineQuery {
        EngineQuery::open_in(runtime, wasm, key, partitions, None)
    }

    /// Like [`open`](Self::open) with one partition and the default limits, in time mode
    /// `mode`.
    pub fn open_in_time_mode(
        wasm: &str,
        key: &str,
        mode: statebox_engine::TimeMode,
    ) -> EngineQuery {
        EngineQuery::open_in(
            Arc::new(runtime(Limits::default())),
            wasm,
            key,
            1,
            Some(mode),
        )
    }

    /// Opens the query in `time_mode` (the processor's own if `None`).
    fn open_in(
        runtime: Arc<Runtime>,
        wasm: &str,
        key: &str,
        partitions: u16,
        time_mode: Option<statebox_engine::TimeMode>,
    ) -> EngineQuery {
        let processor = Arc::new(
            runtime
                .load_file(Path::new(wasm))
                .unwrap_or_else(|e| panic!("load {wasm}: {e}")),
        );
        let scratch = Scratch::new();
        let opts = QueryOptions {
            partitions: Some(partitions),
            time_mode,
            ..QueryOptions::new(
                scratch.input(),
                scratch.output(),
                scratch.checkpoint(),
                key.split(',').map(str::to_owned).collect(),
            )
        };
        let mut q = EngineQuery {
            scratch,
            runtime,
            processor,
            opts,
            query: None,
            files: 0,
            read: 0,
        };
        q.reopen();
        q
    }

    /// The runtime the processor was loaded with.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The loaded processor.
    pub fn processor(&self) -> Arc<Processor> {
        self.processor.clone()
    }

    /// The options the query is opened with.
    pub fn options(&self) -> &QueryOptions {
        &self.opts
    }

    /// Closes the query (dropping its processor instances and the checkpoint handle) and
    /// opens it again, as a restarted process would.
    pub fn reopen(&mut self) {
        self.query = None;
        self.query = Some(
            Query::open(self.opts.clone(), self.processor.clone())
                .unwrap_or_else(|e| panic!("open query: {e}")),
        );
    }

    /// Closes the query.
    pub fn close(&mut self) {
        self.query = None;
    }

    /// Adds one input file and runs every available batch; returns the reports and the rows
    /// emitted since the last call.
    pub fn try_batch(
        &mut self,
        rows: &[Value],
    ) -> Result<(Vec<BatchReport>, Vec<Value>), EngineError> {
        self.files += 1;
        self.rewrite_last(rows);
        self.run_available()
    }

    /// Replaces the content of the input file added last (before any batch read it).
    pub fn rewrite_last(&mut self, rows: &[Value]) {
        self.scratch
            .write_rows(&format!("{:06}.jsonl", self.files), rows);
    }

    /// Runs every available batch; returns the reports and the rows emitted since the last
    /// call.
    pub fn run_available(&mut self) -> Result<(Vec<BatchReport>, Vec<Value>), EngineError> {
        let query = self.query.as_mut().expect("the query is open");
        let reports = query.run_available(|_| {})?;
        Ok((reports, self.new_rows()))
    }

    /// Like [`try_batch`](Self::try_batch), panicking on failure and returning the rows.
    #[track_caller]
    pub fn batch(&mut self, rows: &[Value]) -> Vec<Value> {
        match self.try_batch(rows) {
            Ok((_, rows)) => rows,
            Err(e) => panic!("batch failed: {e}"),
        }
    }

    /// Output rows not yet returned.
    pub fn new_rows(&mut self) -> Vec<Value> {
        let all = self.scratch.output_rows();
        let new = all[self.read..].to_vec();
        self.read = all.len();
        new
    }
}

/// A small deterministic random number generator (SplitMix64) for test data and timings.
pub struct Rng(u64);

impl Rng {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Polls `f` every 50 ms until it returns something, or panics after `limit`.
#[track_caller]
pub fn wait_for<T>(what: &str, limit: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(start.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Sends SIGINT (what Ctrl-C sends) to a running `statebox`, asserts it stops cleanly
/// within 10 s, and returns its standard error (empty unless it was piped).
#[track_caller]
pub fn interrupt(mut child: std::process::Child) -> String {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let status = wait_for(
        "statebox to stop after Ctrl-C",
        std::time::Duration::from_secs(10),
        || child.try_wait().expect("wait for statebox"),
    );
    let mut stderr = String::new();
    if let Some(pipe) = child.stderr.as_mut() {
        std::io::Read::read_to_string(pipe, &mut stderr).expect("read stderr");
    }
    assert_eq!(
        status.code(),
        Some(0),
        "statebox did not stop cleanly:\n{stderr}"
    );
    stderr
}

/// A processing-time query of component `wasm` keyed by `key` over the scratch directory's
/// input, output and checkpoint, driven in-process so a test sets each batch's timestamp.
pub fn processing_time_query(scratch: &Scratch, wasm: &str, key: &str) -> Query {
    let processor = runtime(Limits::default())
        .load_file(Path::new(wasm))
        .unwrap_or_else(|e| panic!("load {wasm}: {e}"));
    let opts = QueryOptions {
        time_mode: Some(statebox_engine::TimeMode::ProcessingTime),
        ..QueryOptions::new(
            scratch.input(),
            scratch.output(),
            scratch.checkpoint(),
            vec![key.into()],
        )
    };
    Query::open(opts, Arc::new(processor)).expect("open query")
}
