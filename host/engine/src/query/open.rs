//! Opening a query: the checkpoint is created, or its recorded settings are checked
//! against this run's; the processor is checked against the state's schema histories
//! before any batch runs; the sink learns what was committed and the source where to go on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use statebox_state::catalog::Catalog;
use statebox_state::{Checkpoint, StateCache};

use super::{Output, Query};
use crate::config::{self, meta};
use crate::sink::Sink;
use crate::{
    BatchTiming, CommitRecord, Endpoints, EngineError, FileProgress, FileSource, OutputMode,
    ProcessorFactory, QueryConfig, QueryOptions, TimeMode, upgrade,
};

const DEFAULT_PARTITIONS: u16 = 4;

impl Query {
    /// Opens (or creates) the checkpoint, checks the settings against it, and prepares the
    /// sink. Refuses settings that differ from the ones the checkpoint was created with.
    pub fn open(
        opts: QueryOptions,
        factory: Arc<dyn ProcessorFactory>,
    ) -> Result<Query, EngineError> {
        Query::open_with(opts, factory, Endpoints::default())
    }

    /// Like [`Query::open`], reading from and writing to `endpoints` where they are set.
    pub fn open_with(
        opts: QueryOptions,
        factory: Arc<dyn ProcessorFactory>,
        endpoints: Endpoints,
    ) -> Result<Query, EngineError> {
        let Endpoints {
            source: mut records,
            sink: batch_sink,
            plans: mut plan_log,
        } = endpoints;
        if opts.key_columns.is_empty() {
            return Err(EngineError::Config(
                "at least one key column is required (--key)".into(),
            ));
        }
        if opts.max_files_per_batch == 0 {
            return Err(EngineError::Config(
                "--max-files-per-batch must be at least 1".into(),
            ));
        }
        if opts.min_batches_to_retain == 0 {
            return Err(EngineError::Config(
                "--min-batches-to-retain must be at least 1".into(),
            ));
        }
        std::fs::create_dir_all(&opts.checkpoint).map_err(|e| {
            EngineError::Io(format!(
                "cannot create checkpoint {}: {e}",
                opts.checkpoint.display()
            ))
        })?;
        let cache = match &opts.shared_state_cache {
            Some(shared) => StateCache::Shared(Arc::clone(shared)),
            None => StateCache::Own(
                opts.state_cache_bytes
                    .unwrap_or(statebox_state::DEFAULT_STATE_CACHE_BYTES),
            ),
        };
        let checkpoint =
            Checkpoint::open_with_memory(&opts.checkpoint, &cache, opts.shared_memtables.as_ref())?;
        // This process writes the checkpoint now (its database is locked): no snapshot is
        // being taken, and any partial one is from a run that died taking it.
        let snapshots = crate::reader::snapshots_dir(&opts.checkpoint);
        match Checkpoint::remove_partial_snapshots(&snapshots) {
            Ok(0) => {}
            Ok(removed) => {
                tracing::info!(removed, dir = %snapshots.display(), "removed partial snapshots")
            }
            Err(e) => tracing::warn!("cannot remove partial snapshots: {e}"),
        }
        let config = match checkpoint.get_meta(meta::QUERY)? {
            Some(bytes) => {
                let stored: QueryConfig = serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::corrupt_record("query record", e))?;
                check_restart(&stored, &opts)?;
                let mut stored = stored;
                if stored.query_id.is_none() {
                    stored.query_id = Some(config::new_uuid());
                    checkpoint.put_meta_sync(
                        meta::QUERY,
                        &serde_json::to_vec(&stored).expect("serialises"),
                    )?;
                }
                // The watermark delay may change between runs, as in Spark.
                if let Some(e) = &opts.event_time {
                    stored.watermark_delay_ms = e.watermark_delay_ms;
                }
                stored
            }
            None => {
                let config = QueryConfig {
                    version: 1,
                    key_columns: opts.key_columns.clone(),
                    partitions: opts.partitions.unwrap_or(DEFAULT_PARTITIONS),
                    output_mode: opts.output_mode.unwrap_or(OutputMode::Update),
                    time_mode: opts.time_mode.unwrap_or(TimeMode::None),
                    operator_name: factory.info().name.clone(),
                    event_time_column: opts.event_time.as_ref().map(|e| e.column.clone()),
                    watermark_delay_ms: opts
                        .event_time
                        .as_ref()
                        .map_or(0, |e| e.watermark_delay_ms),
                    output_schema: Some(factory.info().output_schema.to_ddl()),
                    query_id: Some(config::new_uuid()),
                };
                check_time_settings(&config)?;
                // A new checkpoint has committed no output, so opening the sink would
                // truncate the file to nothing: refuse rather than destroy someone's data.
                // (Checked before the query record is written, so a refused run leaves no
                // checkpoint behind that would allow the truncation next time.)
                let existing = std::fs::metadata(&opts.output).map_or(0, |m| m.len());
                if existing > 0 && batch_sink.is_none() {
                    return Err(EngineError::Config(format!(
                        "output {} already holds {existing} bytes but checkpoint {} is new; \
                         statebox appends each batch's rows exactly once and needs a missing \
                         or empty output file for a new checkpoint (move the file away or \
                         choose another --output)",
                        opts.output.display(),
                        opts.checkpoint.display()
                    )));
                }
                if config.partitions == 0 {
                    return Err(EngineError::Config(
                        "--partitions must be at least 1".into(),
                    ));
                }
                if let Some(source) = &records {
                    checkpoint
                        .put_meta_sync(meta::SOURCE_IDENTITY, source.identity().as_bytes())?;
                }
                checkpoint.put_meta_sync(
                    meta::QUERY,
                    &serde_json::to_vec(&config).expect("serialises"),
                )?;
                config
            }
        };
        // The source cannot change under an existing checkpoint: its positions would mean
        // nothing to another source (as in Spark).
        let identity = checkpoint
            .get_meta(meta::SOURCE_IDENTITY)?
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let wanted = records.as_ref().map(|s| s.identity());
        if identity != wanted {
            let name = |i: &Option<String>| {
                i.clone()
                    .unwrap_or_else(|| "files (--input PATH)".to_owned())
            };
            return Err(EngineError::Config(format!(
                "the checkpoint {} reads from {}, but this run asks for {}; the input of an \
                 existing checkpoint cannot change (use a new --checkpoint)",
                opts.checkpoint.display(),
                name(&identity),
                name(&wanted)
            )));
        }
        let catalog = match checkpoint.get_meta(meta::CATALOG)? {
            Some(bytes) => {
                Catalog::from_json(&bytes).map_err(|e| EngineError::corrupt_record("catalog", e))?
            }
            None => Catalog::default(),
        };
        // Upgrade check: the processor's declarations, learned without running it on any
        // data, must be compatible with every variable's schema history before any state
        // is touched.
        if catalog.vars().next().is_some() {
            let check = upgrade::check_against(&config, &catalog, &*factory)?;
            if !check.is_compatible() {
                return Err(EngineError::Config(format!(
                    "processor `{}` cannot run on checkpoint {}: its state is incompatible\n{check}",
                    factory.info().name,
                    opts.checkpoint.display()
                )));
            }
        }
        let (head, head_timing) = match checkpoint.get_meta(meta::HEAD)? {
            Some(bytes) => {
                let head: CommitRecord = serde_json::from_slice(&bytes)
                    .map_err(|e| EngineError::corrupt_record("commit record", e))?;
                // Only reported, never needed to go on: a timing that does not decode is
                // left out rather than refusing the query. Records from before the timing
                // moved out of the commit record carry it themselves.
                let timing = checkpoint
                    .get_meta(&meta::timing(head.batch_id))?
                    .unwrap_or(bytes);
                let timing = serde_json::from_slice(&timing).unwrap_or_default();
                (Some(head), timing)
            }
            None => (None, BatchTiming::default()),
        };
        let mut progress = BTreeMap::new();
        for (name, bytes) in checkpoint.scan_meta(meta::SOURCE_PREFIX)? {
            let p: FileProgress = serde_json::from_slice(&bytes)
                .map_err(|e| EngineError::corrupt_record("source progress", e))?;
            progress.insert(name[meta::SOURCE_PREFIX.len()..].to_owned(), p);
        }
        if let (Some(path), Some(h)) = (&opts.initial_state, &head) {
            tracing::warn!(
                "ignoring initial state {}: the checkpoint is past its first batch (last committed batch {})",
                path.display(),
                h.batch_id
            );
        }
        let pending = {
            let next = head.as_ref().map_or(0, |h| h.batch_id + 1);
            let local = super::logged_plan(&checkpoint, next)?.map(|_| next);
            // Batches planned in a shared log after this checkpoint's head run next, from
            // their plans (a restored snapshot catching up): the sink may have all of them.
            let logged = match &mut plan_log {
                Some(log) => log.last()?.filter(|&l| l >= next),
                None => None,
            };
            local.max(logged)
        };
        let sink = match batch_sink {
            Some(mut sink) => {
                let query_id = config.query_id.as_deref().unwrap_or_default();
                sink.open(query_id, head.as_ref().map(|h| h.batch_id), pending)?;
                Output::Batches {
                    sink,
                    reopen: false,
                }
            }
            None => Output::File(Sink::open(
                &opts.output,
                head.as_ref().map_or(0, |h| h.output_bytes),
            )?),
        };
        if let Some(source) = &mut records {
            let committed = checkpoint
                .scan_meta(meta::INPUT_PREFIX)?
                .into_iter()
                .map(|(name, value)| (name[meta::INPUT_PREFIX.len()..].to_owned(), value))
                .collect();
            source.restore(committed, head.is_none())?;
        }
        // With a record source the file source is never asked for anything; it points at
        // the checkpoint directory only because `--input` names no path then.
        let source = FileSource::new(match records {
            Some(_) => &opts.checkpoint,
            None => &opts.input,
        })?;
        let mut columns = config.key_columns.clone();
        columns.extend(config.event_time_column.clone());
        let scanner =
            statebox_schema::RowScanner::new(factory.info().input_schema.clone(), columns);
        let instances = (0..config.partitions).map(|_| None).collect();
        Ok(Query {
            opts,
            factory,
            checkpoint,
            config,
            catalog: Arc::new(Mutex::new(catalog)),
            instances,
            run_id: config::new_uuid(),
            source,
            progress,
            records,
            plans: plan_log,
            head,
            head_timing,
            sink,
            scanner,
            state_write_limit: None,
        })
    }
}

fn check_restart(stored: &QueryConfig, opts: &QueryOptions) -> Result<(), EngineError> {
    let refuse = |setting: &str, old: String, new: String| {
        Err(EngineError::Config(format!(
            "the checkpoint {} was created with {setting} {old}, but this run asks for {new}; \
             {setting} cannot change for an existing checkpoint (use a new --checkpoint)",
            opts.checkpoint.display()
        )))
    };
    if stored.key_columns != opts.key_columns {
        return refuse(
            "--key",
            stored.key_columns.join(","),
            opts.key_columns.join(","),
        );
    }
    if let Some(m) = opts.output_mode.filter(|m| *m != stored.output_mode) {
        return refuse(
            "--output-mode",
            stored.output_mode.to_string(),
            m.to_string(),
        );
    }
    if let Some(t) = opts.time_mode.filter(|t| *t != stored.time_mode) {
        return refuse("--time-mode", stored.time_mode.to_string(), t.to_string());
    }
    if let Some(p) = opts.partitions.filter(|p| *p != stored.partitions) {
        return refuse("--partitions", stored.partitions.to_string(), p.to_string());
    }
    if let Some(e) = opts
        .event_time
        .as_ref()
        .filter(|e| stored.event_time_column.as_deref() != Some(e.column.as_str()))
    {
        let old = stored
            .event_time_column
            .clone()
            .unwrap_or_else(|| "no event-time column".into());
        return refuse("--event-time", old, e.column.clone());
    }
    Ok(())
}

fn check_time_settings(config: &QueryConfig) -> Result<(), EngineError> {
    match (config.time_mode, &config.event_time_column) {
        (TimeMode::EventTime, None) => Err(EngineError::Config(
            "time mode event-time needs an event-time column (--event-time COL --watermark-delay DURATION)".into(),
        )),
        (TimeMode::None | TimeMode::ProcessingTime, Some(c)) => Err(EngineError::Config(format!(
            "--event-time {c} needs --time-mode event-time (the query uses {})",
            config.time_mode
        ))),
        _ if config.watermark_delay_ms < 0 => Err(EngineError::Config(
            "the watermark delay cannot be negative".into(),
        )),
        _ => Ok(()),
    }
}
