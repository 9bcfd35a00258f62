//! `statebox sql`: SQL over a checkpoint's committed state (read-only; works while a
//! pipeline runs on it). The queries run on Apache DataFusion; see the `statebox-sql`
//! crate for the table functions and their columns.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use statebox_sql::OutputFormat;

/// `statebox sql`.
#[derive(Args)]
pub(crate) struct SqlArgs {
    /// The checkpoint a table function reads when its call names none (read-only; may be
    /// in use by a running pipeline), or a task in a state store
    /// (`URL/tasks/TOPIC-PARTITION`, its latest snapshot).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// One query, e.g. "SELECT key, value FROM read_statestore('/ck', stateVarName =>
    /// 'count')". Table functions: read_statestore(['/checkpoint/path', ]stateVarName =>
    /// 'NAME', batchId => N, flattenCollectionTypes => false, readChangeFeed => true,
    /// changeStartBatchId => N, changeEndBatchId => M, readRegisteredTimers => true) and
    /// read_state_metadata(['/checkpoint/path']); without a path they read --checkpoint.
    query: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// How the result is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// A bordered table for a terminal (holds the whole result in memory).
    Table,
    /// One JSON object per row.
    Jsonl,
    /// Comma-separated values with a header line; nested values as JSON text.
    Csv,
}

impl From<Format> for OutputFormat {
    fn from(f: Format) -> OutputFormat {
        match f {
            Format::Table => OutputFormat::Table,
            Format::Jsonl => OutputFormat::Jsonl,
            Format::Csv => OutputFormat::Csv,
        }
    }
}

/// Runs `statebox sql`.
pub(crate) fn run(args: SqlArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let task = match &args.checkpoint {
        Some(dir) => Some(crate::group::readable_checkpoint(dir)?),
        None => None,
    };
    let checkpoint = task.as_ref().map(|(dir, _)| dir.as_path());
    statebox_sql::run_paths(checkpoint, &args.query, args.format.into(), &mut out).with_context(
        || match checkpoint {
            Some(dir) => format!("query on checkpoint {} failed", dir.display()),
            None => "query failed".to_owned(),
        },
    )?;
    out.flush().context("cannot write to standard output")
}
