//! `statebox state`: reading a checkpoint's committed state, metadata and progress,
//! read-only (works while a pipeline runs on it).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;
use statebox_engine::{EngineError, StateReader};

/// `statebox state ...`.
#[derive(Subcommand)]
pub(crate) enum StateCommand {
    /// Print one variable's state (or the registered timers) at the latest committed batch.
    Read(ReadArgs),
    /// Print one variable's changes (updates and deletes) per batch, from the retained
    /// per-batch change logs.
    Changes(ChangesArgs),
    /// Print the checkpoint's operator, partitions, batches, modes and variables (JSON).
    Metadata(CheckpointArgs),
    /// Print the last batches' progress records (JSON Lines).
    Progress(ProgressArgs),
}

#[derive(Args)]
pub(crate) struct CheckpointArgs {
    /// The checkpoint directory (read-only; may be in use by a running pipeline), or a task
    /// of a query shared by workers in their state store: `URL/tasks/TOPIC-PARTITION`
    /// (its latest snapshot).
    #[arg(long)]
    checkpoint: PathBuf,
}

#[derive(Args)]
pub(crate) struct ReadArgs {
    /// The checkpoint directory (read-only; may be in use by a running pipeline), or a task
    /// of a query shared by workers in their state store: `URL/tasks/TOPIC-PARTITION`
    /// (its latest snapshot).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The state variable to read.
    #[arg(long, required_unless_present = "timers", conflicts_with = "timers")]
    var: Option<String>,
    /// List the registered timers instead of a variable.
    #[arg(long)]
    timers: bool,
    /// One row per grouping key for list and map state, instead of one per element/entry.
    #[arg(long)]
    no_flatten: bool,
    /// The committed batch to read (time travel): any retained one, see `statebox state
    /// metadata` (`min_batch_id`..`max_batch_id`). Default: the latest.
    #[arg(long)]
    batch_id: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
}

#[derive(Args)]
pub(crate) struct ChangesArgs {
    /// The checkpoint directory (read-only; may be in use by a running pipeline), or a task
    /// of a query shared by workers in their state store: `URL/tasks/TOPIC-PARTITION`
    /// (its latest snapshot).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The state variable whose changes to print.
    #[arg(long)]
    var: String,
    /// The first batch whose changes to print.
    #[arg(long)]
    from: u64,
    /// The last batch whose changes to print (default: the latest committed batch).
    #[arg(long)]
    to: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
}

#[derive(Args)]
pub(crate) struct ProgressArgs {
    /// The checkpoint directory (read-only; may be in use by a running pipeline), or a task
    /// of a query shared by workers in their state store: `URL/tasks/TOPIC-PARTITION`
    /// (its latest snapshot).
    #[arg(long)]
    checkpoint: PathBuf,
    /// How many of the most recent batches to print.
    #[arg(long, default_value_t = 10)]
    last: usize,
}

/// How rows are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Comma-separated values with a header line; nested values as JSON text.
    Csv,
    /// Aligned columns for a terminal (holds every row in memory).
    Table,
}

/// Runs a `statebox state` command.
pub(crate) fn run(cmd: StateCommand) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match cmd {
        StateCommand::Read(args) => read(args, &mut out)?,
        StateCommand::Changes(args) => {
            let reader = open(&args.checkpoint)?;
            let mut printer = Printer::new(args.format);
            reader.read_changes(&args.var, args.from, args.to, |row| {
                printer
                    .row(&mut out, row)
                    .map_err(|e| EngineError::Io(e.to_string()))
            })?;
            printer.finish(&mut out)?;
        }
        StateCommand::Metadata(args) => {
            let reader = open(&args.checkpoint)?;
            serde_json::to_writer_pretty(&mut out, &reader.metadata()?)?;
            writeln!(out)?;
        }
        StateCommand::Progress(args) => {
            let reader = open(&args.checkpoint)?;
            for record in reader.progress(args.last)? {
                serde_json::to_writer(&mut out, &record)?;
                writeln!(out)?;
            }
        }
    }
    out.flush().context("cannot write to standard output")
}

/// A reader of a checkpoint, and the temporary copy it reads when the checkpoint is a task
/// in a state store (removed when this is dropped).
struct Opened {
    reader: StateReader,
    _download: Option<tempfile::TempDir>,
}

impl std::ops::Deref for Opened {
    type Target = StateReader;

    fn deref(&self) -> &StateReader {
        &self.reader
    }
}

fn open(dir: &std::path::Path) -> anyhow::Result<Opened> {
    let (local, download) = crate::group::readable_checkpoint(dir)?;
    let reader = StateReader::open(&local)
        .with_context(|| format!("cannot read checkpoint {}", dir.display()))?;
    Ok(Opened {
        reader,
        _download: download,
    })
}

fn read(args: ReadArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let reader = open(&args.checkpoint)?;
    let mut printer = Printer::new(args.format);
    let print = |row: Value| {
        printer
            .row(out, row)
            .map_err(|e| EngineError::Io(e.to_string()))
    };
    match (&args.var, args.timers) {
        (_, true) => reader.read_timers_at(args.batch_id, print)?,
        (Some(var), false) => reader.read_state(var, !args.no_flatten, args.batch_id, print)?,
        (None, false) => anyhow::bail!("--var NAME or --timers is required"),
    }
    printer.finish(out)?;
    Ok(())
}

/// Writes rows in one format; csv and jsonl stream, table collects to align columns.
struct Printer {
    format: Format,
    /// The csv/table columns, taken from the first row.
    columns: Option<Vec<String>>,
    /// The table's header and rows.
    table: Vec<Vec<String>>,
}

/// Column order of csv and table output (rows are JSON objects, whose fields sort by name).
const COLUMN_ORDER: [&str; 13] = [
    "batch_id",
    "change_type",
    "key",
    "list_index",
    "user_map_key",
    "value",
    "list_element",
    "list_value",
    "user_map_value",
    "map_value",
    "expiration_timestamp_ms",
    "ttl_expiration_ms",
    "partition_id",
];

impl Printer {
    fn new(format: Format) -> Printer {
        Printer {
            format,
            columns: None,
            table: Vec::new(),
        }
    }

    fn row(&mut self, out: &mut impl Write, row: Value) -> std::io::Result<()> {
        if self.format == Format::Jsonl {
            serde_json::to_writer(&mut *out, &row)?;
            return writeln!(out);
        }
        let Value::Object(fields) = row else {
            return Ok(());
        };
        let columns = match &self.columns {
            Some(columns) => columns,
            None => {
                let mut columns: Vec<String> = fields.keys().cloned().collect();
                columns.sort_by_key(|c| {
                    COLUMN_ORDER
                        .iter()
                        .position(|o| o == c)
                        .unwrap_or(COLUMN_ORDER.len())
                });
                match self.format {
                    Format::Csv => write_csv(out, &columns)?,
                    _ => self.table.push(columns.clone()),
                }
                self.columns.insert(columns)
            }
        };
        let cells: Vec<String> = columns
            .iter()
            .map(|c| fields.get(c).map(cell).unwrap_or_default())
            .collect();
        match self.format {
            Format::Csv => write_csv(out, &cells),
            _ => {
                self.table.push(cells);
                Ok(())
            }
        }
    }

    fn finish(self, out: &mut impl Write) -> std::io::Result<()> {
        if self.format != Format::Table || self.table.is_empty() {
            return Ok(());
        }
        let mut widths = vec![0; self.table[0].len()];
        for row in &self.table {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        for (i, row) in self.table.iter().enumerate() {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            writeln!(out, "{}", line.join("  ").trim_end())?;
            if i == 0 {
                let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
                writeln!(out, "{}", rule.join("  "))?;
            }
        }
        Ok(())
    }
}

/// A value as one cell: strings as they are, everything else as JSON text.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Writes one CSV line.
fn write_csv(out: &mut impl Write, cells: &[String]) -> std::io::Result<()> {
    let line: Vec<String> = cells.iter().map(|c| csv_field(c)).collect();
    writeln!(out, "{}", line.join(","))
}

/// Quotes a CSV field when it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn print(format: Format, rows: &[Value]) -> String {
        let mut out = Vec::new();
        let mut p = Printer::new(format);
        for row in rows {
            p.row(&mut out, row.clone()).unwrap();
        }
        p.finish(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn rows_print_as_csv_and_table() {
        let rows = [
            json!({"key": {"u": "a,b"}, "value": 1, "partition_id": 0}),
            json!({"key": {"u": "c"}, "value": "say \"hi\"", "partition_id": 12}),
        ];
        assert_eq!(
            print(Format::Csv, &rows),
            "key,value,partition_id\n\
             \"{\"\"u\"\":\"\"a,b\"\"}\",1,0\n\
             \"{\"\"u\"\":\"\"c\"\"}\",\"say \"\"hi\"\"\",12\n"
        );
        assert_eq!(
            print(Format::Table, &rows),
            "key          value     partition_id\n\
             -----------  --------  ------------\n\
             {\"u\":\"a,b\"}  1         0\n\
             {\"u\":\"c\"}    say \"hi\"  12\n"
        );
        assert_eq!(print(Format::Jsonl, &rows[..1]), format!("{}\n", rows[0]));
        assert_eq!(print(Format::Table, &[]), "");
    }
}
