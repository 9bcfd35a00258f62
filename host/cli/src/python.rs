//! `statebox build-python`: builds a Python processor file into a component with the Python
//! SDK (`guest-sdk/python`) and componentize-py.
//!
//! componentize-py bundles CPython, the SDK and the processor file into one component and
//! pre-initialises it: the processor file is imported at build time and the interpreter
//! snapshotted, so instances start without importing anything, and syntax errors, import
//! errors and handler methods with the wrong signature fail the build with file and line.
//! The component exports both the single-key `processor` interface and `batch-processor`
//! (many keys per call; see the SDK's README for how async processors interleave keys).
//! Built components are cached by a hash of everything that goes into them, so building an
//! unchanged processor again is instant.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::Args;

/// The WIT world Python processors are built against (`guest-sdk/python/wit/python.wit`):
/// `stateful-batch-processor` — the single-key `processor` export (for `describe`, `init`,
/// initial state and `close`) and the batched `batch-processor` export (input rows and
/// expired timers of many keys per call), importing `keys` — plus
/// `wasi:http/outgoing-handler`, which the SDK's aiohttp client uses.
const WORLD: &str = "python-processor";

/// `statebox build-python`.
#[derive(Args)]
pub(crate) struct BuildPythonArgs {
    /// The processor file: a class subclassing PySpark's `StatefulProcessor` (or the SDK's
    /// `AsyncStatefulProcessor`).
    processor: PathBuf,
    /// Where to write the component. Without it the component stays in the build cache and
    /// its path is printed.
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    options: PythonOptions,
}

/// What a Python processor is built with, besides its file.
#[derive(Args, Clone, Default, Debug)]
pub(crate) struct PythonOptions {
    /// The schema of emitted rows in Spark DDL (`"key string, count long"`), if the file does
    /// not set `OUTPUT_SCHEMA`.
    #[arg(long)]
    pub(crate) output_schema: Option<String>,
    /// The schema input rows must match (checked by the host), if the file does not set
    /// `INPUT_SCHEMA`.
    #[arg(long)]
    pub(crate) input_schema: Option<String>,
    /// The output column holding each row's event time, if the file does not set
    /// `OUTPUT_EVENT_TIME_COLUMN`.
    #[arg(long)]
    pub(crate) output_event_time_column: Option<String>,
    /// The processor's name in logs and errors (default: `NAME` in the file, else the file's
    /// name without `.py`).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// The processor class, when the file defines several.
    #[arg(long = "class")]
    pub(crate) class_name: Option<String>,
    /// Replace the WASI imports with trapping stubs (the host grants nothing through them
    /// anyway; see the SDK's README for the measured difference).
    #[arg(long)]
    pub(crate) stub_wasi: bool,
    /// An environment variable the processor file may read (`os.environ["NAME"]`,
    /// `os.getenv`): `NAME=VALUE`, or `NAME` to take this process's value. Repeatable. The
    /// file runs at build time, so the value is built into the component (do not pass
    /// secrets you would not store in it); the file sees no other variable, and reading
    /// one it was not given fails the build with its file and line. `STATEBOX_PYTHON_ENV`
    /// (names, comma-separated) adds variables from this process's environment to every
    /// Python build, e.g. for `statebox run --processor processor.py`.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub(crate) env: Vec<String>,
    /// Build the SDK's `TwsTester` hook in (`statebox tws-driver` only): a row carrying
    /// `__statebox_tws` writes state instead of reaching the processor.
    #[arg(skip)]
    pub(crate) tws_driver: bool,
}

pub(crate) fn run(args: BuildPythonArgs) -> anyhow::Result<()> {
    let wasm = build(&args.processor, &args.options)?;
    match args.output {
        Some(output) => {
            std::fs::copy(&wasm, &output)
                .with_context(|| format!("cannot write {}", output.display()))?;
            eprintln!("built {}", output.display());
        }
        None => println!("{}", wasm.display()),
    }
    Ok(())
}

/// The Python SDK's folder: `$STATEBOX_PYTHON_SDK`, else `guest-sdk/python` of the source
/// tree this binary was built from.
pub(crate) fn sdk_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("STATEBOX_PYTHON_SDK") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk/python"),
    };
    if !dir.join("src/statebox/__init__.py").is_file() {
        bail!(
            "the Python SDK is not at {} (set STATEBOX_PYTHON_SDK to its guest-sdk/python folder)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The WIT package: `$STATEBOX_WIT_DIR`, else `wit/` of the source tree.
fn wit_dir() -> anyhow::Result<PathBuf> {
    let dir = match std::env::var_os("STATEBOX_WIT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit"),
    };
    if !dir.join("world.wit").is_file() {
        bail!(
            "the WIT package is not at {} (set STATEBOX_WIT_DIR)",
            dir.display()
        );
    }
    Ok(dir)
}

/// FNV-1a over 128 bits: a stable content hash for the build cache (not adversarial input).
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    /// Adds a length-prefixed field, so that field boundaries are part of the hash.
    fn field(&mut self, bytes: &[u8]) {
        for b in (bytes.len() as u64)
            .to_le_bytes()
            .iter()
            .chain(bytes.iter())
        {
            self.0 ^= u128::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// Every file under `dir` with one of `extensions`, sorted, as (relative path, bytes).
fn files(dir: &Path, extensions: &[&str]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("read {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "__pycache__") {
                    stack.push(path);
                }
            } else if path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| extensions.contains(&e))
            {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap_or(&path)
                    .display()
                    .to_string();
                out.push((rel, std::fs::read(&path)?));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A Python string literal (JSON string syntax is valid Python for any text).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "''".to_owned())
}

fn py_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "None".to_owned(), py_str)
}

/// A Python dict literal of string pairs.
fn py_dict(pairs: &[(String, String)]) -> String {
    let items: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}: {}", py_str(k), py_str(v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

/// The variables a build passes to the processor file: each `--env NAME=VALUE` or `--env
/// NAME` (this process's value), then the names `STATEBOX_PYTHON_ENV` lists; sorted by
/// name, so that the build cache sees the same entry module for the same variables.
fn build_env(given: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let listed = std::env::var("STATEBOX_PYTHON_ENV").unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    let from_list = listed
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| (n, "STATEBOX_PYTHON_ENV"));
    for (item, origin) in given.iter().map(|g| (g.as_str(), "--env")).chain(from_list) {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name, value.to_owned()),
            None => {
                let value = std::env::var(item).map_err(|_| {
                    anyhow::anyhow!(
                        "{origin} {item}: {item} is not set in the environment (pass \
                         --env {item}=VALUE to give its value)"
                    )
                })?;
                (item, value)
            }
        };
        if name.is_empty() || name.contains(['\0', '=']) {
            bail!("{origin} {item:?}: expected NAME=VALUE or NAME");
        }
        out.entry(name.to_owned()).or_insert(value);
    }
    Ok(out.into_iter().collect())
}

/// Builds `source` (a Python processor file) into a component, or finds it in the build
/// cache, and returns the component's path.
pub(crate) fn build(source: &Path, options: &PythonOptions) -> anyhow::Result<PathBuf> {
    let source = std::fs::canonicalize(source)
        .with_context(|| format!("cannot read the processor file {}", source.display()))?;
    let text = std::fs::read(&source)
        .with_context(|| format!("cannot read the processor file {}", source.display()))?;
    let sdk = sdk_dir()?;
    let wit = wit_dir()?;
    let display = source.display().to_string();
    let env = build_env(&options.env)?;
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("processor")
        .to_owned();

    let entry = format!(
        "# Generated by `statebox build-python`: the component's entry module.\n\
         import os as _os\n\
         from statebox._component import export as _export\n\n\
         # componentize-py looks up one class per exported interface: `processor` and\n\
         # `batch-processor`.\n\
         Processor, BatchProcessor = _export(\n    \
             _os.path.join(_os.path.dirname(__file__), \"processor_source.py\"),\n    \
             display_path={display},\n    \
             module_name={module},\n    \
             class_name={class_name},\n    \
             name={name},\n    \
             output_schema={output_schema},\n    \
             input_schema={input_schema},\n    \
             output_event_time_column={event_time},\n    \
             tws_driver={tws_driver},\n    \
             env={env},\n\
         )\n",
        display = py_str(&display),
        module = py_str(&stem),
        class_name = py_opt(options.class_name.as_deref()),
        name = py_opt(options.name.as_deref()),
        output_schema = py_opt(options.output_schema.as_deref()),
        input_schema = py_opt(options.input_schema.as_deref()),
        event_time = py_opt(options.output_event_time_column.as_deref()),
        tws_driver = if options.tws_driver { "True" } else { "False" },
        env = py_dict(&env),
    );

    let setup = sdk.join("setup.sh");
    let mut hash = Fnv128::new();
    hash.field(WORLD.as_bytes());
    hash.field(&text);
    hash.field(entry.as_bytes());
    hash.field(&[u8::from(options.stub_wasi)]);
    hash.field(&std::fs::read(&setup).with_context(|| format!("read {}", setup.display()))?);
    for (path, bytes) in files(&sdk.join("src"), &["py"])?
        .into_iter()
        .chain(files(&wit, &["wit"])?)
        .chain(files(&sdk.join("wit"), &["wit"])?)
    {
        hash.field(path.as_bytes());
        hash.field(&bytes);
    }
    let cache = crate::plugin::user_cache_dir("python")?;
    let wasm = cache.join(format!("{stem}-{:032x}.wasm", hash.0));
    if wasm.is_file() {
        statebox_runtime::cache::mark_used(&wasm);
        return Ok(wasm);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("create {}", cache.display()))?;
    // A process building the same processor holds the entry's lock: its build is waited
    // for and used rather than repeated (a build takes seconds of CPU).
    let _building = statebox_runtime::cache::lock_entry(&wasm);
    if wasm.is_file() {
        statebox_runtime::cache::mark_used(&wasm);
        return Ok(wasm);
    }

    let componentize_py = componentize_py(&setup)?;
    let work = tempfile::Builder::new()
        .prefix("statebox-python-")
        .tempdir()
        .context("create a temporary build directory")?;
    let app = work.path().join("app");
    std::fs::create_dir(&app)?;
    let world_dir = python_wit(&wit, &sdk, work.path())?;
    std::fs::write(app.join("processor_source.py"), &text)?;
    std::fs::write(app.join("statebox_main.py"), &entry)?;
    let out = work.path().join("out.wasm");

    eprintln!("building Python processor {display} ...");
    let mut cmd = Command::new(&componentize_py);
    cmd.arg("-d")
        .arg(&world_dir)
        .args(["-w", WORLD, "componentize", "statebox_main"])
        .arg("-p")
        .arg(&app)
        .arg("-p")
        .arg(sdk.join("src"))
        .arg("-o")
        .arg(&out)
        .current_dir(work.path())
        .env_remove("VIRTUAL_ENV")
        .env("RUST_BACKTRACE", "0");
    if options.stub_wasi {
        cmd.arg("--stub-wasi");
    }
    let output = cmd
        .output()
        .with_context(|| format!("cannot run {}", componentize_py.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!("{}", explain_failure(&display, &stderr, &sdk));
    }
    // Move the component into the cache atomically: builds that could not take the lock each
    // write a whole file, and readers never see a partial one.
    let partial = tempfile::NamedTempFile::new_in(&cache)?;
    std::fs::copy(&out, partial.path())?;
    partial
        .persist(&wasm)
        .with_context(|| format!("cannot store {}", wasm.display()))?;
    statebox_runtime::cache::trim(&cache, "wasm", BUILDS_MAX_BYTES, &wasm);
    Ok(wasm)
}

/// What the cache of built Python processors keeps (in bytes) before it removes the least
/// recently used: about a hundred builds (~21 MiB each). The source's path is part of a
/// build (tracebacks name it), so the same file in a new place is a new entry.
const BUILDS_MAX_BYTES: u64 = 2 << 30;

/// The WIT folder the build reads: the Statebox package (`wit/`) with the Python world
/// (`guest-sdk/python/wit/python.wit`) added to it, and the WASI packages it imports as
/// `deps/`.
fn python_wit(wit: &Path, sdk: &Path, work: &Path) -> anyhow::Result<PathBuf> {
    let dir = work.join("wit");
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in files(wit, &["wit"])? {
        if name.contains(std::path::MAIN_SEPARATOR) {
            continue;
        }
        std::fs::write(dir.join(&name), bytes)?;
    }
    let extra = sdk.join("wit");
    std::fs::copy(extra.join("python.wit"), dir.join("python.wit"))
        .with_context(|| format!("read {}", extra.join("python.wit").display()))?;
    for (name, bytes) in files(&extra.join("deps"), &["wit"])? {
        let to = dir.join("deps").join(&name);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(to, bytes)?;
    }
    Ok(dir)
}

/// Installs componentize-py if needed (`guest-sdk/python/setup.sh`, idempotent and quick
/// when already installed) and returns its path.
fn componentize_py(setup: &Path) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("STATEBOX_COMPONENTIZE_PY") {
        return Ok(PathBuf::from(path));
    }
    let output = Command::new("bash")
        .arg(setup)
        .output()
        .with_context(|| format!("cannot run {}", setup.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed to install componentize-py:\n{}",
            setup.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout.lines().last().unwrap_or_default().trim();
    if path.is_empty() {
        bail!("{} printed no componentize-py path", setup.display());
    }
    Ok(PathBuf::from(path))
}

/// The Python error of a failed build, readable: a processor definition error as its
/// `file:line: message`, any other Python error as its traceback, paths inside the build
/// mapped back to the SDK's files.
fn explain_failure(display: &str, stderr: &str, sdk: &Path) -> String {
    // componentize-py reports an error raised while pre-initialising as an `AssertionError`
    // whose message is the Python traceback.
    let marker = "AssertionError: Traceback (most recent call last):";
    let Some(start) = stderr.find(marker) else {
        return format!("componentize-py failed to build {display}:\n{stderr}");
    };
    let rest = &stderr[start + "AssertionError: ".len()..];
    let end = rest.find("\n\nCaused by:").unwrap_or(rest.len());
    let traceback = &rest[..end];
    let marker = "ProcessorDefinitionError: ";
    if let Some(line) = traceback.lines().rev().find(|l| l.contains(marker)) {
        let message = &line[line.find(marker).unwrap_or(0) + marker.len()..];
        return format!("invalid processor: {message}");
    }
    // The build mounts `-p` folders as /0 (the generated entry module) and /1 (the SDK).
    let sdk_src = sdk.join("src").display().to_string();
    let mut out = String::new();
    let _ = writeln!(out, "the processor file {display} failed to load:");
    for line in traceback.lines() {
        let line = line.replace("\"/1/", &format!("\"{sdk_src}/"));
        let _ = writeln!(out, "{line}");
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_error_is_its_message() {
        let stderr = "Traceback (most recent call last):\n  File \"/x/componentize-py\"\nAssertionError: Traceback (most recent call last):\n  File \"/0/statebox_main.py\", line 5, in <module>\nstatebox._component.ProcessorDefinitionError: /p/processor.py:7: Counter.handleInputRows(self, key) cannot be called as handleInputRows(self, key, rows, timerValues)\n\n\nCaused by:\n    x";
        let msg = explain_failure("/p/processor.py", stderr, Path::new("/sdk"));
        assert_eq!(
            msg,
            "invalid processor: /p/processor.py:7: Counter.handleInputRows(self, key) cannot be called as handleInputRows(self, key, rows, timerValues)"
        );
    }

    #[test]
    fn the_hash_separates_fields() {
        let mut a = Fnv128::new();
        a.field(b"ab");
        a.field(b"c");
        let mut b = Fnv128::new();
        b.field(b"a");
        b.field(b"bc");
        assert_ne!(a.0, b.0);
    }
}
