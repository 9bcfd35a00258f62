//! One batch, in the order it runs: reopen the sink if a delivery's outcome was unknown,
//! read the planned input, decode it into partitions, call the processor (partitions in
//! parallel), check the state it wrote against the limit, write the output, commit.
//! [`Query::try_run_batch`] is that sequence; each step is a method below.

use std::time::Instant;

use statebox_state::catalog::VarKind;
use statebox_state::{ChangelogWrite, Commit, PartitionTxn};

use super::Output;
use crate::config::meta;
use crate::input::{self, DecodeStats, PartitionInput};
use crate::source::{self, FileRange, FileSource};
use crate::{
    BatchPlan, BatchReport, BatchTimes, BatchTiming, CallErrorKind, CommitRecord, EngineError,
    FileProgress, Query, TimeMode, VariableCounts, partition,
};

/// A batch's input as its plan names it: the texts to decode, and the positions the batch
/// commits.
struct ReadInput {
    /// Every text: a record source's first, then the planned file ranges'. Emptied once
    /// decoded.
    texts: Vec<String>,
    /// A record source's texts: each with a made-up range (lines count from 1), its name
    /// and the position of each line's record, to name records in errors.
    record_ranges: Vec<FileRange>,
    record_names: Vec<String>,
    positions: Vec<Vec<i64>>,
    /// How far each file read is consumed after the batch.
    file_progress: Vec<(String, FileProgress)>,
    /// A record source's positions after the batch.
    source_progress: Vec<(String, Vec<u8>)>,
}

impl ReadInput {
    /// `e` about line `n` of a record source's text, made to name the record.
    fn locate(&self, e: EngineError) -> EngineError {
        locate_record(e, &self.record_names, &self.positions)
    }
}

/// What the partitions produced, gathered for the sink and the commit.
struct Produced {
    txns: Vec<PartitionTxn>,
    /// The output rows as JSON Lines, for the output file...
    lines: Vec<u8>,
    /// ... or as rows, for a batch sink.
    rows: Vec<String>,
    output_rows: u64,
    timers_fired: u64,
    ttl_removed: u64,
    /// The slowest partition's time firing timers and removing expired state.
    timers_ms: u64,
    ttl_ms: u64,
}

/// Where the batch's output went.
struct Written {
    /// The output file's length after the batch (the committed length for a batch sink).
    output_bytes: u64,
    /// The sink delivery that holds the batch, when the sink names its deliveries.
    sink_delivery: Option<String>,
}

impl Query {
    /// Runs one planned batch and commits it; on failure nothing is committed (the caller,
    /// [`Query::run_batch`], rolls back what was appended and withdraws the plan).
    pub(crate) fn try_run_batch(&mut self, plan: &BatchPlan) -> Result<BatchReport, EngineError> {
        let started = Instant::now();
        self.reopen_sink(plan)?;

        let mut input = self.read_input(plan)?;
        let texts = self.texts(plan, &input);
        let (inputs, stats) = self
            .decode_input(plan, &texts)
            .map_err(|e| input.locate(e))?;
        let initial = self.read_initial_state(plan)?;
        let initial_texts: Vec<input::Text<'_>> = initial
            .iter()
            .map(|(range, text)| input::Text {
                text,
                range,
                file_name: range.file.clone(),
            })
            .collect();
        let initial_inputs = self.decode_initial(&initial_texts, texts.len())?;
        let file_names: Vec<String> = texts
            .iter()
            .chain(&initial_texts)
            .map(|t| t.file_name.clone())
            .collect();
        let keys = inputs.iter().map(|p| p.groups.len() as u64).sum();
        // The groups hold their own copies of the rows: the texts can go before the calls.
        drop(texts);
        drop(initial_texts);
        drop(initial);
        input.texts = Vec::new();
        let read_ms = started.elapsed().as_millis() as u64;

        let times = BatchTimes {
            batch_id: plan.batch_id,
            batch_timestamp_ms: plan.timestamp_ms,
            watermark_ms: plan.watermark_ms,
        };
        let mut results = self
            .execute(inputs, initial_inputs, times, &file_names)
            .map_err(|e| input.locate(e))?;
        let process_ms = started.elapsed().as_millis() as u64 - read_ms;

        // Checked before the output is written: a batch over the limit leaves no trace.
        self.check_state_limit(&mut results)?;
        let produced = self.gather(results);
        let written = self.write_output(plan, &produced)?;

        let (event_time_seen, event_time_progress) = self.event_time_seen(plan, &stats);
        let mut commit = CommitRecord {
            batch_id: plan.batch_id,
            timestamp_ms: plan.timestamp_ms,
            watermark_ms: plan.watermark_ms,
            output_bytes: written.output_bytes,
            input_rows: stats.rows,
            output_rows: produced.output_rows,
            keys,
            late_rows: stats.late_rows,
            timers_fired: produced.timers_fired,
            ttl_removed: produced.ttl_removed,
            variables: self.variable_counts(),
            state_bytes_on_disk: self.checkpoint.disk_bytes(),
            // Counted from the change logs inside the commit.
            state_rows_total: 0,
            state_rows_updated: 0,
            state_rows_removed: 0,
            timers_total: 0,
            timers_registered: 0,
            timers_deleted: 0,
            sink_delivery: written.sink_delivery,
            next_watermark_ms: self.next_watermark(plan, event_time_seen),
        };
        let timing = |started: Instant| {
            let duration_ms = started.elapsed().as_millis() as u64;
            BatchTiming {
                duration_ms,
                read_ms,
                process_ms,
                commit_ms: duration_ms - read_ms - process_ms,
                timers_ms: produced.timers_ms,
                ttl_ms: produced.ttl_ms,
                rows_per_s: rows_per_s(stats.rows, started),
            }
        };
        // The timing kept with the commit is written inside it, so it estimates the
        // commit's own duration up to here; the report has the full figure.
        let source_progress = input.source_progress.into_iter().chain(event_time_progress);
        self.commit(
            &mut commit,
            &timing(started),
            produced.txns,
            &input.file_progress,
            source_progress.collect(),
        )?;
        self.committed(plan, &commit, input.file_progress);
        let timing = timing(started);
        self.head_timing = timing.clone();
        Ok(BatchReport { commit, timing })
    }

    /// Before a batch after one whose delivery's outcome was unknown: the sink learns
    /// again which batches it has.
    fn reopen_sink(&mut self, plan: &BatchPlan) -> Result<(), EngineError> {
        if let Output::Batches { sink, reopen } = &mut self.sink
            && *reopen
        {
            let query_id = self.config.query_id.as_deref().unwrap_or_default();
            sink.open(
                query_id,
                self.head.as_ref().map(|h| h.batch_id),
                Some(plan.batch_id),
            )?;
            *reopen = false;
        }
        Ok(())
    }

    /// Reads what the plan names: the record source's records, then the file ranges.
    fn read_input(&mut self, plan: &BatchPlan) -> Result<ReadInput, EngineError> {
        let mut input = ReadInput {
            texts: Vec::with_capacity(plan.ranges.len()),
            record_ranges: Vec::new(),
            record_names: Vec::new(),
            positions: Vec::new(),
            file_progress: Vec::new(),
            source_progress: Vec::new(),
        };
        if let (Some(source), Some(source_plan)) = (&mut self.records, &plan.source) {
            let batch = source.read(source_plan)?;
            input.source_progress = batch.progress;
            for t in batch.texts {
                input.record_ranges.push(FileRange {
                    file: t.name.clone(),
                    start: 0,
                    end: t.text.len() as u64,
                    first_line: 1,
                });
                input.record_names.push(t.name);
                input.positions.push(t.positions);
                input.texts.push(t.text);
            }
        }
        for range in &plan.ranges {
            let text = self.source.read(range)?;
            // Only line breaks count: a last line without one continues when the file grows.
            let lines = range.first_line - 1 + source::count_lines(text.as_bytes());
            input.file_progress.push((
                range.file.clone(),
                FileProgress {
                    bytes: range.end,
                    lines,
                },
            ));
            input.texts.push(text);
        }
        Ok(input)
    }

    /// The input's texts with their ranges and the names errors give them.
    fn texts<'a>(&self, plan: &'a BatchPlan, input: &'a ReadInput) -> Vec<input::Text<'a>> {
        input
            .texts
            .iter()
            .zip(input.record_ranges.iter().chain(&plan.ranges))
            .enumerate()
            .map(|(i, (text, range))| input::Text {
                text,
                range,
                file_name: match input.record_names.get(i) {
                    Some(name) => name.clone(),
                    None => self.source.path_of(&range.file).display().to_string(),
                },
            })
            .collect()
    }

    /// Validates the input rows, extracts their keys (and event time) and groups them by
    /// key per partition; rows at or before the watermark are dropped as late.
    fn decode_input<'a>(
        &self,
        plan: &BatchPlan,
        texts: &[input::Text<'a>],
    ) -> Result<(Vec<PartitionInput>, DecodeStats), EngineError> {
        let event_time = match (self.config.time_mode, &self.config.event_time_column) {
            (TimeMode::EventTime, Some(column)) => Some(input::EventTime {
                column,
                watermark_ms: plan.watermark_ms,
            }),
            _ => None,
        };
        input::decode(
            texts,
            0,
            &self.scanner,
            &self.config.key_columns,
            event_time,
            self.instances.len(),
            self.workers(),
        )
    }

    /// Groups the initial-state rows by key per partition (no schema, no event time); their
    /// files are numbered after the input's `first_file` texts.
    fn decode_initial<'a>(
        &self,
        texts: &[input::Text<'a>],
        first_file: usize,
    ) -> Result<Vec<PartitionInput>, EngineError> {
        let scanner = statebox_schema::RowScanner::new(None, self.config.key_columns.clone());
        let (inputs, _) = input::decode(
            texts,
            first_file as u32,
            &scanner,
            &self.config.key_columns,
            None,
            self.instances.len(),
            self.workers(),
        )?;
        Ok(inputs)
    }

    /// Fails the batch if its partitions wrote more state than
    /// [`Query::set_state_write_limit`] allows.
    fn check_state_limit(
        &self,
        results: &mut [partition::PartitionResult],
    ) -> Result<(), EngineError> {
        if let Some(limit) = self.state_write_limit {
            let bytes = results.iter_mut().map(|r| r.txn.written_bytes()).sum();
            if bytes > limit {
                return Err(EngineError::StateLimit { bytes, limit });
            }
        }
        Ok(())
    }

    /// Gathers the partitions' output (in partition order) and their transactions.
    fn gather(&self, results: Vec<partition::PartitionResult>) -> Produced {
        let to_file = matches!(self.sink, Output::File(_));
        let mut produced = Produced {
            txns: Vec::with_capacity(results.len()),
            lines: Vec::new(),
            rows: Vec::new(),
            output_rows: 0,
            timers_fired: 0,
            ttl_removed: 0,
            timers_ms: 0,
            ttl_ms: 0,
        };
        for r in results {
            produced.timers_fired += r.timers_fired;
            produced.ttl_removed += r.ttl_removed;
            produced.timers_ms = produced.timers_ms.max(r.timers_ms);
            produced.ttl_ms = produced.ttl_ms.max(r.ttl_ms);
            produced.txns.push(r.txn);
            produced.output_rows += r.rows.len() as u64;
            if to_file {
                for row in r.rows {
                    produced.lines.extend_from_slice(row.as_bytes());
                    produced.lines.push(b'\n');
                }
            } else {
                produced.rows.extend(r.rows);
            }
        }
        produced
    }

    /// Appends the output to the file, or delivers it to the batch sink unless the sink
    /// already has this batch. Before the commit: a batch that dies after this is re-run
    /// from its plan, and the output file is cut back to the committed length on start.
    fn write_output(
        &mut self,
        plan: &BatchPlan,
        produced: &Produced,
    ) -> Result<Written, EngineError> {
        let sink = match &mut self.sink {
            Output::File(sink) => {
                return Ok(Written {
                    output_bytes: sink.append(&produced.lines)?,
                    sink_delivery: None,
                });
            }
            Output::Batches { sink, .. } => sink,
        };
        let sink_delivery = if sink.has_batch(plan.batch_id)? {
            // Delivered by a run that died before committing: the rows computed again here
            // are the ones the sink has; they are not sent twice.
            tracing::info!(
                batch_id = plan.batch_id,
                "the sink already has this batch; its output is not sent again"
            );
            self.checkpoint
                .get_meta(meta::SINK_DELIVERY)?
                .and_then(|b| serde_json::from_slice::<SinkDelivery>(&b).ok())
                .filter(|d| d.batch_id == plan.batch_id)
                .map(|d| d.id)
        } else {
            let sink_delivery = sink.delivery_id(plan.batch_id);
            if let Some(id) = &sink_delivery {
                // Logged before delivering, so that if this run dies after the sink has
                // the batch, the next run can name the delivery.
                let logged = SinkDelivery {
                    batch_id: plan.batch_id,
                    id: id.clone(),
                };
                self.checkpoint.put_meta_sync(
                    meta::SINK_DELIVERY,
                    &serde_json::to_vec(&logged).expect("serialises"),
                )?;
            }
            sink.deliver(plan.batch_id, &produced.rows)?;
            crash_point_after_delivery(plan.batch_id);
            sink_delivery
        };
        Ok(Written {
            output_bytes: self.head.as_ref().map_or(0, |h| h.output_bytes),
            sink_delivery,
        })
    }

    /// The largest event time the next watermark may follow, and what the source commits
    /// about it: a record source may hold the watermark back for a partition that runs
    /// behind.
    fn event_time_seen(
        &mut self,
        plan: &BatchPlan,
        stats: &DecodeStats,
    ) -> (Option<i64>, Vec<(String, Vec<u8>)>) {
        match (&mut self.records, &plan.source, self.config.time_mode) {
            (Some(source), Some(source_plan), TimeMode::EventTime) => source.event_time_seen(
                source_plan,
                &stats.max_event_time_per_text,
                plan.timestamp_ms,
            ),
            _ => (stats.max_event_time_ms, Vec::new()),
        }
    }

    /// The watermark the next batch runs with: the largest event time seen minus the
    /// delay, never going back. -1 outside event-time mode.
    fn next_watermark(&self, plan: &BatchPlan, event_time_seen: Option<i64>) -> i64 {
        match self.config.time_mode {
            TimeMode::EventTime => {
                let seen = event_time_seen.map_or(i64::MIN, |m| {
                    m.saturating_sub(self.config.watermark_delay_ms)
                });
                plan.watermark_ms.max(seen)
            }
            _ => -1,
        }
    }

    fn variable_counts(&self) -> VariableCounts {
        let mut counts = VariableCounts::default();
        let catalog = self.catalog.lock().expect("catalog lock poisoned");
        for var in catalog.vars() {
            match var.kind {
                VarKind::Value => counts.value += 1,
                VarKind::List => counts.list += 1,
                VarKind::Map => counts.map += 1,
            }
        }
        counts
    }

    /// Writes the batch in one synced write: every partition's state changes and their
    /// change log, dropped variables, the catalog if it changed, the input's progress, the
    /// commit record (its state and timer totals counted from the change log on the way)
    /// and the batch's timing. The batch's plan stays until the next batch's is logged.
    fn commit(
        &mut self,
        commit: &mut CommitRecord,
        timing: &BatchTiming,
        txns: Vec<PartitionTxn>,
        file_progress: &[(String, FileProgress)],
        source_progress: Vec<(String, Vec<u8>)>,
    ) -> Result<(), EngineError> {
        let batch_id = commit.batch_id;
        let (drop_vars, catalog_json) = {
            let catalog = self.catalog.lock().expect("catalog lock poisoned");
            let drops = catalog.pending_drops().to_vec();
            (drops, catalog.is_dirty().then(|| catalog.to_json()))
        };
        let mut meta_writes = vec![
            // The plan stays until the next batch's is logged (see `put_plan_sync`); one
            // an earlier version logged among the metadata goes with its commit.
            (meta::legacy_plan(batch_id), None),
            (
                meta::timing(batch_id),
                Some(serde_json::to_vec(timing).expect("serialises")),
            ),
        ];
        if let Some(json) = catalog_json {
            meta_writes.push((meta::catalog_at(batch_id), Some(json.clone())));
            meta_writes.push((meta::CATALOG.to_owned(), Some(json)));
        }
        for (file, p) in file_progress {
            meta_writes.push((
                meta::source(file),
                Some(serde_json::to_vec(p).expect("serialises")),
            ));
        }
        for (name, value) in source_progress {
            meta_writes.push((meta::input(&name), Some(value)));
        }
        let partitions = usize::from(self.config.partitions.max(1));
        let (prev_rows, prev_timers) = self
            .head
            .as_ref()
            .map_or((0, 0), |h| (h.state_rows_total, h.timers_total));
        self.checkpoint.commit_with(
            Commit {
                drop_vars,
                txns,
                meta: meta_writes,
                changelog: Some(ChangelogWrite {
                    batch_id,
                    retain_from: (batch_id + 1).saturating_sub(self.opts.min_batches_to_retain),
                    partition_of: Box::new(move |key: &[u8]| {
                        // Below `partitions`, a `u16`.
                        input::partition_of(key, partitions) as u16
                    }),
                }),
            },
            |changes| {
                commit.state_rows_updated = changes.rows_updated;
                commit.state_rows_removed = changes.rows_removed;
                commit.state_rows_total =
                    (prev_rows + changes.rows_added).saturating_sub(changes.rows_removed);
                commit.timers_registered = changes.timers_added;
                commit.timers_deleted = changes.timers_removed;
                commit.timers_total =
                    (prev_timers + changes.timers_added).saturating_sub(changes.timers_removed);
                let record = serde_json::to_vec(&*commit).expect("serialises");
                vec![
                    (meta::commit(batch_id), Some(record.clone())),
                    (meta::HEAD.to_owned(), Some(record)),
                ]
            },
        )?;
        Ok(())
    }

    /// What follows a durable commit: the catalog's changes, the input's progress and the
    /// head move on, and the periodic snapshot is taken.
    fn committed(
        &mut self,
        plan: &BatchPlan,
        commit: &CommitRecord,
        file_progress: Vec<(String, FileProgress)>,
    ) {
        // Only now are the catalog's changes durable; a failed commit leaves them pending
        // for the next batch.
        self.catalog
            .lock()
            .expect("catalog lock poisoned")
            .take_changes();
        for (file, p) in file_progress {
            self.progress.insert(file, p);
        }
        if let (Some(source), Some(source_plan)) = (&mut self.records, &plan.source) {
            source.committed(source_plan);
        }
        self.head = Some(commit.clone());
        self.snapshot(plan.batch_id);
    }

    /// Reads the plan's initial-state ranges (batch 0 of a new checkpoint only).
    fn read_initial_state(
        &self,
        plan: &BatchPlan,
    ) -> Result<Vec<(FileRange, String)>, EngineError> {
        if plan.initial_ranges.is_empty() {
            return Ok(Vec::new());
        }
        let Some(path) = &self.opts.initial_state else {
            return Err(EngineError::Config(format!(
                "batch {} was planned with initial state but this run has no --initial-state; \
                 pass the same --initial-state again to finish it",
                plan.batch_id
            )));
        };
        let source = FileSource::new(path)?;
        plan.initial_ranges
            .iter()
            .map(|range| {
                let text = source.read(range)?;
                let mut range = range.clone();
                range.file = source.path_of(&range.file).display().to_string();
                Ok((range, text))
            })
            .collect()
    }

    /// Calls the processor for every key of every partition, partitions in parallel.
    fn workers(&self) -> usize {
        self.opts
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1)
    }

    fn execute(
        &mut self,
        inputs: Vec<PartitionInput>,
        initial: Vec<PartitionInput>,
        times: BatchTimes,
        file_names: &[String],
    ) -> Result<Vec<partition::PartitionResult>, EngineError> {
        let workers = self.workers().min(self.instances.len());
        let mut lanes: Vec<Vec<partition::Job>> = (0..workers).map(|_| Vec::new()).collect();
        let jobs = self.instances.iter_mut().zip(inputs).zip(initial);
        for (p, ((instance, input), initial)) in jobs.enumerate() {
            lanes[p % workers].push(partition::Job {
                partition: p as u16,
                instance: instance.take(),
                input,
                initial,
            });
        }
        let ctx = partition::Context {
            checkpoint: &self.checkpoint,
            factory: &*self.factory,
            catalog: &self.catalog,
            time_mode: self.config.time_mode,
            output_event_time_column: self.opts.output_event_time_column.as_deref(),
            query_id: self.config.query_id.as_deref().unwrap_or_default(),
            run_id: &self.run_id,
            times,
            // The committed batch fired every timer and expired every value up to its
            // time, so scans for due timers and expiries can start just after it.
            time_floor: self.head.as_ref().and_then(|h| {
                let clock = self
                    .config
                    .time_mode
                    .clock(h.timestamp_ms, h.watermark_ms)?;
                clock.checked_add(1)
            }),
        };
        let ctx = &ctx;
        let finished: Vec<Vec<partition::Outcome>> = std::thread::scope(|s| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    s.spawn(move || lane.into_iter().map(|job| ctx.run(job)).collect::<Vec<_>>())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("partition worker panicked"))
                .collect()
        });
        let mut results: Vec<Option<partition::PartitionResult>> =
            (0..self.instances.len()).map(|_| None).collect();
        let mut first_error: Option<(u16, partition::Failure)> = None;
        for (p, instance, result) in finished.into_iter().flatten() {
            self.instances[p as usize] = instance.filter(|i| !i.is_poisoned());
            match result {
                Ok(r) => results[p as usize] = Some(r),
                Err(failure) => {
                    if first_error.as_ref().is_none_or(|(q, _)| p < *q) {
                        first_error = Some((p, failure));
                    }
                }
            }
        }
        if let Some((_, failure)) = first_error {
            return Err(match failure {
                partition::Failure::Call(e, origin) => match (&e.kind, origin) {
                    (CallErrorKind::BadInputRow { message, .. }, Some(origin)) => {
                        EngineError::Input {
                            file: file_names[origin.file as usize].clone(),
                            line: origin.line,
                            message: format!(
                                "processor `{}` rejected the row: {message}",
                                e.processor
                            ),
                        }
                    }
                    _ => EngineError::Processor(e),
                },
                // The engine's own timer and TTL work on the store: not the processor's
                // fault, so not reported as one of its calls.
                partition::Failure::Store(e) => EngineError::Store(e),
            });
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every partition finished"))
            .collect())
    }
}

/// Input rows per second since `started`, rounded to a whole number.
fn rows_per_s(rows: u64, started: Instant) -> f64 {
    let seconds = started.elapsed().as_secs_f64();
    if seconds > 0.0 {
        (rows as f64 / seconds).round()
    } else {
        0.0
    }
}

/// A crash point for the tests: with `STATEBOX_CRASH_AFTER_DELIVERY=N` in the environment,
/// the process aborts (as `kill -9` would stop it) right after the sink accepted batch N and
/// before the checkpoint commits it, the moment where the sink has output the checkpoint
/// does not know of. Random kills seldom land there; this makes the next run's recovery of
/// that window testable. Unset, it costs one cached lookup per delivered batch.
fn crash_point_after_delivery(batch_id: u64) {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("STATEBOX_CRASH_AFTER_DELIVERY")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if *at == Some(batch_id) {
        eprintln!("STATEBOX_CRASH_AFTER_DELIVERY: aborting after delivering batch {batch_id}");
        std::process::abort();
    }
}

/// What the checkpoint logs before a [`BatchSink`] delivery.
#[derive(serde::Serialize, serde::Deserialize)]
struct SinkDelivery {
    batch_id: u64,
    id: String,
}

/// Turns an error about line `n` of a record source's text into one naming the record's
/// position (`names[i]` is text `i`'s name, `positions[i]` its records' positions).
fn locate_record(e: EngineError, names: &[String], positions: &[Vec<i64>]) -> EngineError {
    match e {
        EngineError::Input {
            file,
            line,
            message,
        } => match names.iter().position(|n| *n == file) {
            Some(i) => {
                let at = match positions[i].get(line.saturating_sub(1) as usize) {
                    Some(p) => format!("{file} offset {p}"),
                    None => file,
                };
                EngineError::Record { at, message }
            }
            None => EngineError::Input {
                file,
                line,
                message,
            },
        },
        e => e,
    }
}
