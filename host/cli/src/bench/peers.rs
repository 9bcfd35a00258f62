//! `statebox bench peers`: the counter workload on Statebox, Flink 2.3 and Spark 4.3 in one
//! run, over the same generated input.
//!
//! The peers are the programs under `bench/peers/` (a Flink DataStream job, a Spark
//! `transformWithState` job in Java and one in Python), run as child processes on the Java and
//! Python that `bench/peers/setup.sh` installs under `~/.cache/statebox`. Each prints one JSON
//! line; it checks its own event count (see the programs) and this command checks it again
//! from the line. A peer that is not installed is reported with the command that installs it,
//! and the others still run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde_json::Value;

use crate::SandboxArgs;

/// The command that installs the peers, relative to the repository.
const SETUP: &str = "bench/peers/setup.sh";
/// Written by `setup.sh` once Flink's jars are unpacked.
const FLINK_MARKER: &str = ".complete-2.3.0";
/// What Spark's launcher (`spark-submit`) passes to a Java 17 JVM so Spark may reach into the
/// JDK's internals; a plain `java` needs them too.
const SPARK_JAVA_OPTIONS: &[&str] = &[
    "-XX:+IgnoreUnrecognizedVMOptions",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.cs=ALL-UNNAMED",
    "--add-opens=java.base/sun.security.action=ALL-UNNAMED",
    "--add-opens=java.base/sun.util.calendar=ALL-UNNAMED",
    "-Djdk.reflect.useDirectMethodHandle=false",
    "-Dio.netty.tryReflectionSetAccessible=true",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PeerEngine {
    /// Statebox, the `counter` plugin as a WebAssembly component.
    Wasm,
    /// Statebox, the same logic compiled into the host.
    Native,
    /// Statebox, `plugins/counter-py` built with the Python SDK.
    Python,
    /// Flink 2.3, `bench/peers/flink/CounterJob.java`.
    Flink,
    /// Spark 4.3 `transformWithState`, Java API: `bench/peers/spark/CounterTws.java`.
    SparkJava,
    /// PySpark 4.3 `transformWithState`, row API: `bench/peers/spark_count.py`.
    SparkPython,
}

impl PeerEngine {
    fn name(self) -> &'static str {
        match self {
            PeerEngine::Wasm => "wasm",
            PeerEngine::Native => "native",
            PeerEngine::Python => "python",
            PeerEngine::Flink => "flink",
            PeerEngine::SparkJava => "spark-java",
            PeerEngine::SparkPython => "spark-python",
        }
    }
}

#[derive(Args)]
pub(crate) struct PeersArgs {
    /// Events to generate.
    #[arg(long, default_value_t = 4_000_000)]
    events: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Micro-batches (input files) the events are split into.
    #[arg(long, default_value_t = 8)]
    batches: u64,
    /// State partitions: Statebox's partitions and Spark's shuffle partitions.
    #[arg(long, default_value_t = 4)]
    partitions: u16,
    /// The peers' worker threads: Flink's parallelism and Spark's `local[N]` (default: the
    /// machine's cores).
    #[arg(long)]
    parallelism: Option<usize>,
    /// Also the Python counter: on Statebox and on PySpark's row API.
    #[arg(long)]
    python: bool,
    /// Only these engines, comma-separated (default: wasm, native, flink, spark-java, and
    /// with `--python` also python and spark-python).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<PeerEngine>,
    /// Flink's checkpoint interval in milliseconds (default: Statebox's mean batch time in
    /// this run, so Flink checkpoints about as often as Statebox commits).
    #[arg(long)]
    flink_checkpoint_ms: Option<u64>,
    /// Also print Statebox's per-batch lines (as `bench count --per-batch`).
    #[arg(long)]
    per_batch: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// What became of one engine.
#[derive(Debug)]
enum Outcome {
    /// It ran; its JSON line.
    Ran(Value),
    /// A peer whose programs are not installed: what is missing.
    NotInstalled(String),
    /// It failed: why.
    Failed(String),
}

/// Where `setup.sh` installs the peers: `$XDG_CACHE_HOME/statebox` or `~/.cache/statebox`.
struct PeerHome {
    venv_python: PathBuf,
    flink_lib: PathBuf,
    classes: PathBuf,
}

impl PeerHome {
    fn locate() -> anyhow::Result<PeerHome> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .context("neither XDG_CACHE_HOME nor HOME is set: cannot find the peers")?
            .join("statebox");
        Ok(PeerHome {
            venv_python: base.join("peers-venv/bin/python"),
            flink_lib: base.join("peers/flink-lib"),
            classes: base.join("peers/classes"),
        })
    }

    /// Spark's jars, as the PySpark package in the venv ships them.
    fn spark_jars(&self) -> Option<PathBuf> {
        let lib = self.venv_python.parent()?.parent()?.join("lib");
        std::fs::read_dir(lib)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("site-packages/pyspark/jars"))
            .find(|jars| jars.join("spark-sql_2.13-4.3.0.jar").is_file())
    }
}

pub(crate) fn run(args: PeersArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.keys > 0 && args.events > 0 && args.batches > 0 && args.partitions > 0,
        "--events, --keys, --batches and --partitions must be positive"
    );
    let parallelism = match args.parallelism {
        Some(0) => anyhow::bail!("--parallelism must be positive"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(2, |n| n.get()),
    };
    let engines = if args.only.is_empty() {
        let mut all = vec![PeerEngine::Wasm, PeerEngine::Native];
        if args.python {
            all.push(PeerEngine::Python);
        }
        all.extend([PeerEngine::Flink, PeerEngine::SparkJava]);
        if args.python {
            all.push(PeerEngine::SparkPython);
        }
        all
    } else {
        args.only.clone()
    };
    let home = PeerHome::locate()?;
    let scratch = super::scratch_dir()?;
    let dir = scratch.path();
    let input = dir.join("input");
    super::generate_count_input(&input, args.events, args.keys, args.batches)?;
    order_modification_times(&input)?;

    let mut outcomes: Vec<(PeerEngine, Outcome)> = Vec::new();
    // Statebox's mean batch time, for Flink's checkpoint interval.
    let mut statebox_batch_ms = None;
    for engine in engines {
        let outcome = match engine {
            PeerEngine::Wasm | PeerEngine::Native | PeerEngine::Python => {
                let factory = super::counter_factory(engine.name(), &args.sandbox, None)?;
                let run = super::run_count(
                    engine.name(),
                    factory,
                    &input,
                    dir,
                    args.partitions,
                    args.events,
                    &statebox_state::StateMemory::default(),
                )?;
                if engine != PeerEngine::Python && statebox_batch_ms.is_none() {
                    statebox_batch_ms = Some(run.seconds * 1000.0 / args.batches as f64);
                }
                let line = run.summary(args.keys, args.batches, args.partitions);
                println!("{line}");
                if args.per_batch {
                    for batch in run.batch_lines() {
                        println!("{batch}");
                    }
                }
                Outcome::Ran(line)
            }
            PeerEngine::Flink => {
                let interval = args
                    .flink_checkpoint_ms
                    .or(statebox_batch_ms.map(|ms: f64| ms.round().max(100.0) as u64))
                    .unwrap_or(1000);
                run_peer(engine, args.events, || {
                    flink(&home, &input, dir, parallelism, interval, args.events)
                })
            }
            PeerEngine::SparkJava => run_peer(engine, args.events, || {
                spark_java(
                    &home,
                    &input,
                    dir,
                    parallelism,
                    args.partitions,
                    args.events,
                )
            }),
            PeerEngine::SparkPython => run_peer(engine, args.events, || {
                spark_python(
                    &home,
                    &input,
                    dir,
                    parallelism,
                    args.partitions,
                    args.events,
                )
            }),
        };
        outcomes.push((engine, outcome));
    }
    print!("{}", table(&outcomes));
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed(_)))
        .map(|(e, _)| e.name())
        .collect();
    anyhow::ensure!(failed.is_empty(), "failed: {}", failed.join(", "));
    Ok(())
}

/// Runs a peer (`start` returns its command and the file for its stderr, or `Ok(Err(..))`
/// with what is missing when it is not installed), prints its line and checks its event
/// count.
fn run_peer(
    engine: PeerEngine,
    events: u64,
    start: impl FnOnce() -> anyhow::Result<Result<(Command, PathBuf), String>>,
) -> Outcome {
    let name = engine.name();
    let (mut command, log) = match start() {
        Ok(Ok(started)) => started,
        Ok(Err(missing)) => {
            eprintln!("{name}: not installed ({missing}): run {SETUP} to install it");
            return Outcome::NotInstalled(missing);
        }
        Err(e) => return Outcome::Failed(format!("{e:#}")),
    };
    let result = (|| -> anyhow::Result<Value> {
        let stderr = std::fs::File::create(&log)?;
        let output = command
            .stdin(Stdio::null())
            .stderr(stderr)
            .output()
            .with_context(|| format!("cannot start {name}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        anyhow::ensure!(
            output.status.success(),
            "{name} exited with {}; its last messages:\n{}",
            output.status,
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 15)
        );
        parse_peer_line(&stdout, name, events)
    })();
    match result {
        Ok(line) => {
            println!("{line}");
            Outcome::Ran(line)
        }
        Err(e) => {
            eprintln!("{name}: {e:#}");
            Outcome::Failed(format!("{e:#}"))
        }
    }
}

/// The Flink job's command, compiling it first if needed.
fn flink(
    home: &PeerHome,
    input: &Path,
    dir: &Path,
    parallelism: usize,
    interval_ms: u64,
    events: u64,
) -> anyhow::Result<Result<(Command, PathBuf), String>> {
    if !home.flink_lib.join(FLINK_MARKER).is_file() {
        return Ok(Err(format!(
            "no Flink 2.3 jars in {}",
            home.flink_lib.display()
        )));
    }
    let sources = super::workspace_root().join("bench/peers/flink");
    let lib = home.flink_lib.join("*");
    let classes = home.classes.join("flink");
    compile(&sources.join("CounterJob.java"), &lib, &classes)?;
    let work = dir.join("flink");
    let mut cmd = Command::new("java");
    cmd.arg(format!(
        "-Dlog4j.configurationFile={}",
        sources.join("log4j2.properties").display()
    ))
    .arg("-cp")
    .arg(classpath(&[&classes, &lib])?)
    .arg("CounterJob")
    .arg("--input")
    .arg(input)
    .arg("--output")
    .arg(work.join("output"))
    .arg("--work")
    .arg(&work)
    .args(["--parallelism", &parallelism.to_string()])
    .args(["--checkpoint-interval-ms", &interval_ms.to_string()])
    .args(["--events", &events.to_string()]);
    Ok(Ok((cmd, dir.join("flink.log"))))
}

/// The Spark Java job's command, compiling it first if needed.
fn spark_java(
    home: &PeerHome,
    input: &Path,
    dir: &Path,
    cores: usize,
    partitions: u16,
    events: u64,
) -> anyhow::Result<Result<(Command, PathBuf), String>> {
    let Some(jars) = home.spark_jars() else {
        return Ok(Err(format!(
            "no PySpark 4.3 (and its jars) in the venv of {}",
            home.venv_python.display()
        )));
    };
    let source = super::workspace_root().join("bench/peers/spark/CounterTws.java");
    let lib = jars.join("*");
    let classes = home.classes.join("spark");
    compile(&source, &lib, &classes)?;
    let work = dir.join("spark-java");
    std::fs::create_dir_all(&work)?;
    let mut cmd = Command::new("java");
    cmd.args(SPARK_JAVA_OPTIONS)
        .arg("-cp")
        .arg(classpath(&[&classes, &lib])?)
        .arg("CounterTws")
        .arg("--input")
        .arg(input)
        .arg("--work")
        .arg(&work)
        .args(["--cores", &cores.to_string()])
        .args(["--partitions", &partitions.to_string()])
        .args(["--events", &events.to_string()]);
    Ok(Ok((cmd, dir.join("spark-java.log"))))
}

/// The PySpark job's command.
fn spark_python(
    home: &PeerHome,
    input: &Path,
    dir: &Path,
    cores: usize,
    partitions: u16,
    events: u64,
) -> anyhow::Result<Result<(Command, PathBuf), String>> {
    if home.spark_jars().is_none() {
        return Ok(Err(format!(
            "no PySpark 4.3 in the venv of {}",
            home.venv_python.display()
        )));
    }
    let root = super::workspace_root();
    let work = dir.join("spark-python");
    std::fs::create_dir_all(&work)?;
    let mut cmd = Command::new(&home.venv_python);
    cmd.arg(root.join("bench/peers/spark_count.py"))
        .arg("--input")
        .arg(input)
        .arg("--work")
        .arg(&work)
        .args(["--cores", &cores.to_string()])
        .args(["--partitions", &partitions.to_string()])
        .args(["--events", &events.to_string()])
        .arg("--processor")
        .arg(root.join("plugins/counter-py/processor.py"));
    Ok(Ok((cmd, dir.join("spark-python.log"))))
}

/// Compiles `source` into `classes` with `javac`, unless its class there is newer.
fn compile(source: &Path, lib: &Path, classes: &Path) -> anyhow::Result<()> {
    let class = classes.join(
        source
            .file_stem()
            .context("a Java source has a file name")?,
    );
    let class = class.with_extension("class");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(built), Some(written)) = (modified(&class), modified(source))
        && built >= written
    {
        return Ok(());
    }
    std::fs::create_dir_all(classes)?;
    let output = Command::new("javac")
        .arg("-d")
        .arg(classes)
        .arg("-cp")
        .arg(lib)
        .arg(source)
        .stdin(Stdio::null())
        .output()
        .context("cannot run javac (Java 17's compiler is needed for the peers)")?;
    anyhow::ensure!(
        output.status.success(),
        "javac {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn classpath(parts: &[&Path]) -> anyhow::Result<std::ffi::OsString> {
    Ok(std::env::join_paths(parts)?)
}

/// Spark's file source takes files in modification-time order: make it the name order, as
/// Statebox reads them (files written within one clock tick could otherwise tie or swap).
fn order_modification_times(input: &Path) -> anyhow::Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(input)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let base =
        std::time::SystemTime::now() - std::time::Duration::from_secs(files.len() as u64 + 10);
    for (i, f) in files.iter().enumerate() {
        std::fs::File::options()
            .write(true)
            .open(f)?
            .set_modified(base + std::time::Duration::from_secs(i as u64))?;
    }
    Ok(())
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The line a peer printed: the last line of its output that is a JSON object with
/// `"engine": engine` (Spark's Python workers print lines of their own to stdout). It must
/// report `events` events and positive `seconds` and `events_per_s`.
fn parse_peer_line(stdout: &str, engine: &str, events: u64) -> anyhow::Result<Value> {
    let line = stdout
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v.get("engine").and_then(Value::as_str) == Some(engine))
        .with_context(|| format!("{engine} printed no JSON line with \"engine\":\"{engine}\""))?;
    let reported = line.get("events").and_then(Value::as_u64);
    anyhow::ensure!(
        reported == Some(events),
        "{engine} reports {} events; {events} were generated",
        reported.map_or("no".to_owned(), |n| n.to_string())
    );
    for field in ["seconds", "events_per_s"] {
        anyhow::ensure!(
            line.get(field)
                .and_then(Value::as_f64)
                .is_some_and(|x| x > 0.0),
            "{engine}'s line has no positive \"{field}\": {line}"
        );
    }
    Ok(line)
}

/// The side-by-side table: engine, events/s, seconds, and a note (the peers' parallelism, or
/// why an engine has no figure).
fn table(outcomes: &[(PeerEngine, Outcome)]) -> String {
    let rows: Vec<[String; 4]> = outcomes
        .iter()
        .map(|(engine, outcome)| {
            let name = engine.name().to_owned();
            match outcome {
                Outcome::Ran(line) => {
                    let number = |f: &str| line.get(f).and_then(Value::as_f64).unwrap_or(0.0);
                    [
                        name,
                        thousands(number("events_per_s").round() as u64),
                        format!("{:.2}", number("seconds")),
                        note(line),
                    ]
                }
                Outcome::NotInstalled(missing) => [
                    name,
                    "-".into(),
                    "-".into(),
                    format!("not installed ({missing}): run {SETUP}"),
                ],
                Outcome::Failed(why) => [
                    name,
                    "-".into(),
                    "-".into(),
                    format!("failed: {}", why.lines().next().unwrap_or_default()),
                ],
            }
        })
        .collect();
    let header = ["engine", "events/s", "seconds", ""];
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([header[i].len()])
            .max()
            .unwrap_or(0)
    };
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = String::new();
    for row in std::iter::once(header.map(str::to_owned)).chain(rows) {
        let line = format!(
            "{:<w0$}  {:>w1$}  {:>w2$}  {}",
            row[0], row[1], row[2], row[3]
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// What a line says about how the engine ran, beyond its rate.
fn note(line: &Value) -> String {
    let get = |f: &str| line.get(f).map(|v| v.to_string());
    let mut parts = Vec::new();
    if let Some(p) = get("parallelism") {
        parts.push(format!("parallelism {p}"));
    }
    if let Some(c) = get("cores") {
        parts.push(format!("local[{c}]"));
    }
    if let Some(p) = get("partitions") {
        parts.push(format!("{p} partitions"));
    }
    if let Some(ms) = get("checkpoint_interval_ms") {
        parts.push(format!("checkpoint every {ms} ms"));
    }
    if let Some(r) = line.get("slowest_batch_vs_first").and_then(Value::as_f64) {
        parts.push(format!("slowest batch {r:.2}x the first"));
    }
    parts.join(", ")
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_peers_line_among_other_output() {
        let stdout = "Streaming TransformWithStateInPandas Python worker Starting\n\
            {\"engine\":\"spark-java\",\"events\":10,\"seconds\":1.0,\"events_per_s\":10}\n\
            {\"engine\":\"spark-python\",\"events\":10,\"seconds\":2.5,\"events_per_s\":4}\n\
            done\n";
        let line = parse_peer_line(stdout, "spark-python", 10).unwrap();
        assert_eq!(line["seconds"], json!(2.5));
    }

    #[test]
    fn refuses_a_line_with_another_event_count_or_none() {
        let stdout = r#"{"engine":"flink","events":9,"seconds":1.0,"events_per_s":9}"#;
        let err = parse_peer_line(stdout, "flink", 10)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "flink reports 9 events; 10 were generated");
        let err = parse_peer_line("starting\n", "flink", 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no JSON line"), "{err}");
        let stdout = r#"{"engine":"flink","events":10,"seconds":0,"events_per_s":9}"#;
        let err = parse_peer_line(stdout, "flink", 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no positive \"seconds\""), "{err}");
    }

    #[test]
    fn the_table_aligns_figures_and_says_how_to_install_a_peer() {
        let outcomes = vec![
            (
                PeerEngine::Wasm,
                Outcome::Ran(
                    json!({"engine":"wasm","events_per_s":1234567.0,"seconds":3.24,
                    "partitions":4,"slowest_batch_vs_first":1.5}),
                ),
            ),
            (
                PeerEngine::Flink,
                Outcome::Ran(
                    json!({"engine":"flink","events_per_s":445000,"seconds":8.988,
                    "parallelism":2,"checkpoint_interval_ms":400}),
                ),
            ),
            (
                PeerEngine::SparkJava,
                Outcome::NotInstalled("no PySpark 4.3".into()),
            ),
            (
                PeerEngine::SparkPython,
                Outcome::Failed("spark-python exited with 1\nTraceback".into()),
            ),
        ];
        assert_eq!(
            table(&outcomes),
            "engine         events/s  seconds\n\
             wasm          1,234,567     3.24  4 partitions, slowest batch 1.50x the first\n\
             flink           445,000     8.99  parallelism 2, checkpoint every 400 ms\n\
             spark-java            -        -  not installed (no PySpark 4.3): run bench/peers/setup.sh\n\
             spark-python          -        -  failed: spark-python exited with 1\n"
        );
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(4_000_000), "4,000,000");
    }
}
