//! `statebox test`: runs a processor through a scenario file — explicit batches at chosen
//! batch timestamps, no-data batches, restarts — against a fresh temporary checkpoint, and
//! compares what each step emitted with what the file expects.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use statebox_engine::{EventTimeOptions, OutputMode, Query, QueryOptions, TimeMode};
use statebox_runtime::Runtime;

use crate::SandboxArgs;

#[derive(Args)]
pub(crate) struct TestArgs {
    /// The scenario file (JSON).
    scenario: PathBuf,
    /// Print what each step emitted, as JSON lines, instead of pass/fail lines.
    #[arg(long)]
    json: bool,
    /// Restart after every batch: close the query and its processor instances and reopen
    /// them over the same checkpoint, with a fresh runtime, before the next batch. Every
    /// expectation must hold as in the uninterrupted run (checks recovery).
    #[arg(long)]
    restart_every_batch: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// A scenario file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    processor: String,
    key: Vec<String>,
    #[serde(default = "default_time_mode")]
    time_mode: String,
    #[serde(default = "default_output_mode")]
    output_mode: String,
    partitions: Option<u16>,
    event_time: Option<EventTimeSpec>,
    output_event_time_column: Option<String>,
    initial_state: Option<Vec<Value>>,
    steps: Vec<Step>,
}

fn default_time_mode() -> String {
    "none".into()
}

fn default_output_mode() -> String {
    "update".into()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventTimeSpec {
    column: String,
    watermark_delay_ms: i64,
}

/// One step. Exactly one of `batch`, `no_data` and `restart` is given.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    batch: Option<Vec<Value>>,
    #[serde(default)]
    no_data: bool,
    #[serde(default)]
    restart: bool,
    /// With `restart`: continue on the same checkpoint with another processor.
    processor: Option<String>,
    at_ms: Option<i64>,
    expect: Option<Vec<Value>>,
    expect_error: Option<String>,
}

/// What one step did.
struct StepResult {
    emitted: Vec<Value>,
    error: Option<String>,
}

pub(crate) fn run(args: TestArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("cannot read scenario {}", args.scenario.display()))?;
    let scenario: Scenario = serde_json::from_str(&text)
        .with_context(|| format!("invalid scenario {}", args.scenario.display()))?;
    let base = args.scenario.parent().unwrap_or(Path::new(".")).to_owned();
    // A fresh checkpoint, input and output, removed when the run ends (also on errors).
    let work = tempfile::Builder::new()
        .prefix("statebox-test-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let run = RunOptions {
        json: args.json,
        restart_every_batch: args.restart_every_batch,
    };
    let (failures, restarts) = run_steps(&scenario, &base, &args.sandbox, work.path(), run)?;
    if failures > 0 {
        bail!(
            "{failures} of {} steps failed in {}",
            scenario.steps.len(),
            args.scenario.display()
        );
    }
    if !args.json {
        // The restart count shows the mode did restart (a scenario without batches would not).
        let restarts = if run.restart_every_batch {
            format!(" with a restart after every batch ({restarts} restarts)")
        } else {
            String::new()
        };
        println!(
            "ok: {} steps passed in {}{restarts}",
            scenario.steps.len(),
            args.scenario.display()
        );
    }
    Ok(())
}

/// How `statebox test` runs the steps.
#[derive(Clone, Copy)]
struct RunOptions {
    json: bool,
    restart_every_batch: bool,
}

fn run_steps(
    scenario: &Scenario,
    base: &Path,
    sandbox: &SandboxArgs,
    work: &Path,
    run: RunOptions,
) -> anyhow::Result<(usize, usize)> {
    let json = run.json;
    let runtime = sandbox.runtime()?;
    let input = work.join("input");
    std::fs::create_dir_all(&input)?;
    let output = work.join("output.jsonl");
    let opts = QueryOptions {
        partitions: scenario.partitions,
        output_mode: Some(
            scenario
                .output_mode
                .parse::<OutputMode>()
                .map_err(anyhow::Error::msg)?,
        ),
        time_mode: Some(
            scenario
                .time_mode
                .parse::<TimeMode>()
                .map_err(anyhow::Error::msg)?,
        ),
        event_time: scenario.event_time.as_ref().map(|e| EventTimeOptions {
            column: e.column.clone(),
            watermark_delay_ms: e.watermark_delay_ms,
        }),
        output_event_time_column: scenario.output_event_time_column.clone(),
        initial_state: match &scenario.initial_state {
            Some(rows) => {
                let path = work.join("initial-state.jsonl");
                let mut text = String::new();
                for row in rows {
                    text.push_str(&serde_json::to_string(row)?);
                    text.push('\n');
                }
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        },
        ..QueryOptions::new(
            input.clone(),
            output.clone(),
            work.join("checkpoint"),
            scenario.key.clone(),
        )
    };
    let open_in = |runtime: &Runtime, processor: &str| -> anyhow::Result<Query> {
        let wasm = crate::plugin::resolve(&locate(processor, base))?;
        let processor = runtime
            .load_file(&wasm)
            .with_context(|| format!("cannot load processor {}", wasm.display()))?;
        Ok(Query::open(opts.clone(), Arc::new(processor))?)
    };
    let open = |processor: &str| open_in(&runtime, processor);
    // With `--restart-every-batch`, what a process restart leaves: nothing in memory but
    // the checkpoint (and the output and input files). The old query is dropped first, so
    // its instances are torn down and the checkpoint is free to open again; a fresh runtime
    // shares nothing with the old one but the on-disk compile cache.
    let restarts = std::cell::Cell::new(0);
    let reopen = |query: &mut Option<Query>, processor: &str| -> anyhow::Result<()> {
        restarts.set(restarts.get() + 1);
        *query = None;
        *query = Some(open_in(&sandbox.runtime()?, processor)?);
        Ok(())
    };
    let mut query = Some(open(&scenario.processor)?);
    // The processor of the last restart step: what a restart after a batch reopens.
    let mut current = scenario.processor.as_str();
    let mut at_ms = 0;
    let mut failures = 0;
    for (i, step) in scenario.steps.iter().enumerate() {
        let n = i + 1;
        let kinds = usize::from(step.batch.is_some())
            + usize::from(step.no_data)
            + usize::from(step.restart);
        if kinds != 1 {
            bail!("step {n}: give exactly one of `batch`, `no_data` and `restart`");
        }
        if step.restart {
            // Dropping the query tears its instances down; reopening checks the checkpoint.
            query = None;
            let processor = step.processor.as_deref().unwrap_or(&scenario.processor);
            current = processor;
            match open(processor) {
                Ok(q) => query = Some(q),
                Err(e) => {
                    let result = StepResult {
                        emitted: Vec::new(),
                        error: Some(format!("{e:#}")),
                    };
                    failures += usize::from(!report(n, step, &result, json));
                    continue;
                }
            }
            let result = StepResult {
                emitted: Vec::new(),
                error: None,
            };
            failures += usize::from(!report(n, step, &result, json));
            continue;
        }
        if query.is_none() {
            bail!("step {n}: no query to run: reopening it failed in an earlier step");
        }
        at_ms = step.at_ms.unwrap_or(at_ms);
        // Called after every batch the step runs (and after a failed one, as a process
        // that died of it would be restarted).
        let after_batch = |query: &mut Option<Query>| -> anyhow::Result<()> {
            if run.restart_every_batch {
                reopen(query, current)?;
            }
            Ok(())
        };
        let before = std::fs::metadata(&output).map_or(0, |m| m.len());
        let file = input.join(format!("step-{n:05}.jsonl"));
        let outcome = match &step.batch {
            Some(rows) if !rows.is_empty() => {
                let mut text = String::new();
                for row in rows {
                    text.push_str(&serde_json::to_string(row)?);
                    text.push('\n');
                }
                std::fs::write(&file, text)?;
                run_until_idle(&mut query, at_ms, &after_batch)
            }
            _ => run_no_data(&mut query, at_ms)
                .and_then(|()| after_batch(&mut query))
                .and_then(|()| run_until_idle(&mut query, at_ms, &after_batch)),
        };
        let error = outcome.err().map(|e| format!("{e:#}"));
        if error.is_some() {
            // A failed batch commits nothing; its input must not block the steps after it.
            std::fs::remove_file(&file).ok();
            if run.restart_every_batch && query.is_some() {
                // The restart a failed batch would cause. Were it to fail, the next step
                // reports that the query is gone.
                if let Err(e) = reopen(&mut query, current) {
                    tracing::error!(error = %format!("{e:#}"), "reopening after a failed batch");
                }
            }
        }
        let emitted = read_rows_after(&output, before)?;
        failures += usize::from(!report(n, step, &StepResult { emitted, error }, json));
    }
    Ok((failures, restarts.get()))
}

/// Runs batches until there is no new input and no watermark advance left to process,
/// calling `after_batch` after each one.
fn run_until_idle(
    query: &mut Option<Query>,
    at_ms: i64,
    after_batch: &dyn Fn(&mut Option<Query>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    loop {
        let q = query.as_mut().context("the query was not reopened")?;
        if q.run_next(Some(at_ms))?.is_none() {
            return Ok(());
        }
        after_batch(query)?;
    }
}

fn run_no_data(query: &mut Option<Query>, at_ms: i64) -> anyhow::Result<()> {
    let q = query.as_mut().context("the query was not reopened")?;
    q.run_no_data(Some(at_ms))?;
    Ok(())
}

/// Resolves a processor path from the scenario: as given, else relative to the scenario
/// file's folder or any folder above it (so scenarios can name `plugins/x`).
fn locate(processor: &str, base: &Path) -> PathBuf {
    let given = PathBuf::from(processor);
    if given.exists() || given.is_absolute() {
        return given;
    }
    base.ancestors()
        .map(|dir| dir.join(processor))
        .find(|p| p.exists())
        .unwrap_or(given)
}

fn read_rows_after(output: &Path, offset: u64) -> anyhow::Result<Vec<Value>> {
    let bytes = match std::fs::read(output) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let text = std::str::from_utf8(&bytes[offset as usize..])?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).context("the output holds a line that is not JSON"))
        .collect()
}

/// Prints the step's outcome; returns whether it passed.
fn report(n: usize, step: &Step, result: &StepResult, json: bool) -> bool {
    let passed = check(step, result);
    if json {
        let line = serde_json::json!({
            "step": n,
            "emitted": result.emitted,
            "error": result.error,
            "passed": passed.is_ok(),
        });
        println!("{line}");
        return passed.is_ok();
    }
    match &passed {
        Ok(()) => println!("step {n}: ok"),
        Err(diff) => println!("step {n}: FAILED\n{diff}"),
    }
    passed.is_ok()
}

fn check(step: &Step, result: &StepResult) -> Result<(), String> {
    match (&step.expect_error, &result.error) {
        (Some(want), Some(got)) if got.contains(want.as_str()) => return Ok(()),
        (Some(want), Some(got)) => {
            return Err(format!(
                "  expected an error containing: {want}\n  got error: {got}"
            ));
        }
        (Some(want), None) => {
            return Err(format!(
                "  expected an error containing: {want}\n  but the step succeeded"
            ));
        }
        (None, Some(got)) => return Err(format!("  unexpected error: {got}")),
        (None, None) => {}
    }
    let Some(expect) = &step.expect else {
        return Ok(());
    };
    let mut want = multiset(expect);
    let mut got = multiset(&result.emitted);
    let mut missing = Vec::new();
    for (row, n) in std::mem::take(&mut want) {
        let have = got.remove(&row).unwrap_or(0);
        for _ in have..n {
            missing.push(row.clone());
        }
        for _ in n..have {
            got.entry(row.clone()).and_modify(|c| *c += 1).or_insert(1);
        }
    }
    let unexpected: Vec<String> = got
        .into_iter()
        .flat_map(|(row, n)| std::iter::repeat_n(row, n))
        .collect();
    if missing.is_empty() && unexpected.is_empty() {
        return Ok(());
    }
    let mut diff = String::new();
    for row in missing {
        diff.push_str(&format!("  - expected, not emitted: {row}\n"));
    }
    for row in unexpected {
        diff.push_str(&format!("  + emitted, not expected: {row}\n"));
    }
    Err(diff.trim_end().to_owned())
}

/// Rows as canonical JSON text (object keys sorted) with their multiplicity.
fn multiset(rows: &[Value]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for row in rows {
        *m.entry(row.to_string()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(expect: &str) -> Step {
        Step {
            batch: Some(Vec::new()),
            no_data: false,
            restart: false,
            processor: None,
            at_ms: None,
            expect: Some(serde_json::from_str(expect).unwrap()),
            expect_error: None,
        }
    }

    fn emitted(rows: &str) -> StepResult {
        StepResult {
            emitted: serde_json::from_str(rows).unwrap(),
            error: None,
        }
    }

    #[test]
    fn expectations_are_multisets_with_unordered_keys() {
        let s = step(r#"[{"a":1,"b":2},{"a":1,"b":2},{"c":3}]"#);
        assert!(check(&s, &emitted(r#"[{"c":3},{"b":2,"a":1},{"a":1,"b":2}]"#)).is_ok());
        let diff = check(&s, &emitted(r#"[{"c":3},{"a":1,"b":2},{"d":4}]"#)).unwrap_err();
        assert!(
            diff.contains("- expected, not emitted: {\"a\":1,\"b\":2}"),
            "{diff}"
        );
        assert!(
            diff.contains("+ emitted, not expected: {\"d\":4}"),
            "{diff}"
        );
    }

    #[test]
    fn expected_errors_match_by_substring() {
        let mut s = step("[]");
        s.expect = None;
        s.expect_error = Some("timers are not allowed".into());
        let failed = StepResult {
            emitted: Vec::new(),
            error: Some("processor `x` failed: timers are not allowed in time mode none".into()),
        };
        assert!(check(&s, &failed).is_ok());
        assert!(check(&s, &emitted("[]")).is_err());
    }
}
