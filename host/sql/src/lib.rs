//! SQL over a Statebox checkpoint's committed state, on Apache DataFusion (SPEC §9).
//!
//! `statebox sql [--checkpoint DIR] "SELECT ..."` opens checkpoints read-only (a pipeline
//! may be running on them) and offers two table functions modelled on Spark's state data
//! sources and Databricks' table functions of the same names:
//!
//! - `read_statestore('/checkpoint/path', stateVarName => 'NAME', ...)`: like
//!   `spark.read.format("statestore")`. Options, matched case-insensitively: `batchId` (time
//!   travel), `flattenCollectionTypes` (default true), `readChangeFeed` with
//!   `changeStartBatchId` and `changeEndBatchId`, `readRegisteredTimers`, `operatorId`
//!   (always 0).
//! - `read_state_metadata('/checkpoint/path')`: like Spark's `state-metadata` source, one
//!   row per variable.
//!
//! The checkpoint path comes first, as in Databricks' SQL, so one query can read and join
//! several checkpoints; without it a call reads the session's default checkpoint
//! (`--checkpoint`). [`run`] (the server's) reads one checkpoint and refuses paths.
//!
//! # Columns
//!
//! | read | columns |
//! |---|---|
//! | value state | `key`, `value`, `partition_id` |
//! | list state | `key`, `list_element`, `partition_id`; unflattened `key`, `list_value`, `partition_id` |
//! | map state | `key`, `user_map_key`, `user_map_value`, `partition_id`; unflattened `key`, `map_value`, `partition_id` |
//! | change feed | `batch_id`, `change_type` (`update`/`delete`), `key`, `list_index` (lists) or `user_map_key` (maps), `value`, `partition_id` |
//! | timers | `key`, `expiration_timestamp_ms`, `partition_id` |
//!
//! Variables with a TTL add `ttl_expiration_ms` before `partition_id` to value rows and
//! flattened rows.
//!
//! `key` is always a struct of the grouping key columns, as in Spark (`key.user`). Values
//! have the Arrow type of the variable's current schema (see [`types`] for the mapping):
//! a field list such as `"name string, visits int"` is a struct (`value.visits`), and a
//! single type such as `"long"` or `"array<string>"` is a plain column of that type
//! (`value > 2`). Spark's Scala encoders wrap a primitive value in `struct<value: T>`;
//! Statebox's DDL tells `"long"` from `"value long"`, so a processor that wants Spark's
//! shape declares the latter. The key columns' types are not recorded in a checkpoint, so
//! they are inferred from the stored keys ([`types::KeyTypeGuess`]), which costs one extra
//! pass over the rows a call reads. A read at an earlier batch (`batchId`) shows the
//! variable as it was then: its columns come from the schema it had at that batch
//! ([`statebox_engine::StateReader::var_at`]), which the values are read through.
//!
//! # How named arguments reach the table functions
//!
//! DataFusion passes table functions positional arguments only, so the parsed statement
//! is rewritten before planning (see the `named_args` module).
//!
//! Only queries run: DDL, DML (`COPY`, `INSERT`) and `SET` are refused, so `statebox sql`
//! never writes anything.

mod convert;
mod functions;
mod named_args;
mod output;
pub mod types;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement;
use futures::StreamExt;
use statebox_engine::{EngineError, StateReader};

pub use crate::convert::ConvertError;
pub use crate::functions::UsageError;
pub use crate::output::{OutputFormat, PrintError};

use crate::functions::{
    Checkpoints, READ_STATE_METADATA, READ_STATESTORE, ReadStateMetadata, ReadStateStore,
};
use crate::output::Printer;

/// Why a query failed. Says whose fault it is: the query (SQL or options), the checkpoint,
/// or the output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The checkpoint could not be opened or read.
    #[error(transparent)]
    State(#[from] EngineError),
    /// The query is invalid or failed while running: DataFusion's message, or the table
    /// function's own message (an unknown option, an unknown variable, ...) without
    /// DataFusion's prefixes.
    #[error("{0}")]
    Query(String),
    /// Printing the result failed.
    #[error(transparent)]
    Print(#[from] PrintError),
}

impl From<DataFusionError> for SqlError {
    fn from(e: DataFusionError) -> SqlError {
        // Errors of the table functions and the reader travel through DataFusion as
        // `External`; their own message is the one to show.
        match e.find_root() {
            DataFusionError::External(inner) => SqlError::Query(inner.to_string()),
            _ => SqlError::Query(e.to_string()),
        }
    }
}

/// A checkpoint opened for SQL: a DataFusion session with the table functions registered.
/// Every query of the session reads the state committed when it was opened.
pub struct SqlSession {
    ctx: SessionContext,
}

impl SqlSession {
    /// Opens the checkpoint in `dir` read-only (works while a pipeline runs on it). Its
    /// queries read that checkpoint only: a checkpoint path argument is refused.
    pub fn open(dir: &Path) -> Result<SqlSession, SqlError> {
        let reader = StateReader::open(dir)?;
        Ok(SqlSession::with(Checkpoints::fixed(dir, reader)))
    }

    /// A session whose table functions read the checkpoint a call names by path
    /// (`read_statestore('/checkpoint/path', ...)`), or `default` (opened now, if given)
    /// when a call names none.
    pub fn open_paths(default: Option<&Path>) -> Result<SqlSession, SqlError> {
        let default = match default {
            Some(dir) => Some((dir, StateReader::open(dir)?)),
            None => None,
        };
        Ok(SqlSession::with(Checkpoints::open_by_path(default)))
    }

    fn with(checkpoints: Checkpoints) -> SqlSession {
        let checkpoints = Arc::new(checkpoints);
        let config = SessionConfig::new().with_information_schema(false);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_udtf(
            READ_STATESTORE,
            Arc::new(ReadStateStore {
                checkpoints: checkpoints.clone(),
            }),
        );
        ctx.register_udtf(
            READ_STATE_METADATA,
            Arc::new(ReadStateMetadata { checkpoints }),
        );
        SqlSession { ctx }
    }

    /// Plans `sql` (one query) and starts running it.
    pub async fn query(&self, sql: &str) -> Result<SendableRecordBatchStream, SqlError> {
        let state = self.ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state.sql_to_statement(sql, &dialect)?;
        if !matches!(statement, Statement::Statement(_) | Statement::Explain(_)) {
            return Err(SqlError::Query(
                "only queries can run on a checkpoint (SELECT, WITH, VALUES, EXPLAIN)".into(),
            ));
        }
        named_args::rewrite(&mut statement, &[READ_STATESTORE, READ_STATE_METADATA]);
        let plan = state.statement_to_plan(statement).await?;
        datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)?;
        let frame = self.ctx.execute_logical_plan(plan).await?;
        Ok(frame.execute_stream().await?)
    }

    /// Runs `sql` and prints its result to `out` in `format`.
    pub async fn print(
        &self,
        sql: &str,
        format: OutputFormat,
        out: &mut dyn Write,
    ) -> Result<(), SqlError> {
        let mut stream = self.query(sql).await?;
        let mut printer = Printer::new(format, stream.schema());
        while let Some(batch) = stream.next().await {
            printer.batch(out, batch?)?;
        }
        printer.finish(out)?;
        Ok(())
    }
}

/// Opens the checkpoint in `dir`, runs `sql` on it (path arguments refused) and prints its
/// result to `out` in `format`.
pub fn run(
    dir: &Path,
    sql: &str,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), SqlError> {
    run_session(SqlSession::open(dir)?, sql, format, out)
}

/// Runs `sql` on the checkpoints its calls name by path, `default` for calls that name
/// none, and prints its result to `out` in `format`: what `statebox sql` does.
pub fn run_paths(
    default: Option<&Path>,
    sql: &str,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), SqlError> {
    run_session(SqlSession::open_paths(default)?, sql, format, out)
}

fn run_session(
    session: SqlSession,
    sql: &str,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), SqlError> {
    // One query on the calling thread; the reads run on the runtime's blocking pool.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| SqlError::Query(format!("starting the query runtime: {e}")))?;
    runtime.block_on(session.print(sql, format, out))
}

#[cfg(test)]
mod tests;
