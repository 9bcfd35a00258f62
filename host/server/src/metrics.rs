//! Prometheus metrics, rendered in the text exposition format at `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (seconds) of the batch latency histogram's buckets.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Counters of one pipeline.
#[derive(Debug, Default)]
pub(crate) struct PipelineMetrics {
    pub rows_ingested: AtomicU64,
    pub ingest_requests: AtomicU64,
    pub input_rows: AtomicU64,
    pub output_rows: AtomicU64,
    pub batches: AtomicU64,
    pub batch_failures: AtomicU64,
    pub state_bytes: AtomicU64,
    /// Bytes of the pipeline's directory (input log, output, checkpoint) after its last
    /// batch, plus what was ingested since.
    pub disk_bytes: AtomicU64,
    /// Batch wall time: per-bucket counts, sum (µs).
    latency_buckets: [AtomicU64; BUCKETS.len()],
    latency_sum_us: AtomicU64,
}

impl PipelineMetrics {
    pub fn observe_batch(&self, seconds: f64) {
        for (bucket, bound) in self.latency_buckets.iter().zip(BUCKETS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency_sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }
}

/// One pipeline's labels and metrics, for rendering.
pub(crate) struct PipelineSample<'a> {
    pub tenant: &'a str,
    pub pipeline: &'a str,
    pub metrics: &'a PipelineMetrics,
    pub failed: bool,
}

/// One tenant's usage, for rendering.
pub(crate) struct TenantSample<'a> {
    pub tenant: &'a str,
    pub cpu_ns: u64,
    pub memory_high_water: u64,
    pub rejected_requests: u64,
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders every metric.
pub(crate) fn render(pipelines: &[PipelineSample<'_>], tenants: &[TenantSample<'_>]) -> String {
    let mut out = String::new();
    type Counter = (&'static str, &'static str, fn(&PipelineMetrics) -> u64);
    let counters: [Counter; 7] = [
        (
            "statebox_pipeline_rows_ingested_total",
            "Rows acknowledged by the ingest endpoint (durable in the input log).",
            |m| m.rows_ingested.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_ingest_requests_total",
            "Acknowledged ingest requests.",
            |m| m.ingest_requests.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_input_rows_total",
            "Input rows processed by committed batches.",
            |m| m.input_rows.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_output_rows_total",
            "Rows emitted by committed batches.",
            |m| m.output_rows.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_batches_total",
            "Committed batches.",
            |m| m.batches.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_batch_failures_total",
            "Batch attempts that failed and committed nothing.",
            |m| m.batch_failures.load(Ordering::Relaxed),
        ),
        (
            "statebox_pipeline_state_bytes",
            "Bytes of the pipeline's checkpoint on disk after its last batch.",
            |m| m.state_bytes.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, get) in counters {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        header(&mut out, name, kind, help);
        for p in pipelines {
            let _ = writeln!(
                out,
                "{name}{{tenant=\"{}\",pipeline=\"{}\"}} {}",
                p.tenant,
                p.pipeline,
                get(p.metrics)
            );
        }
    }
    header(
        &mut out,
        "statebox_pipeline_failed",
        "gauge",
        "1 when the pipeline is marked failed.",
    );
    for p in pipelines {
        let _ = writeln!(
            out,
            "statebox_pipeline_failed{{tenant=\"{}\",pipeline=\"{}\"}} {}",
            p.tenant,
            p.pipeline,
            u8::from(p.failed)
        );
    }
    let name = "statebox_pipeline_batch_duration_seconds";
    header(
        &mut out,
        name,
        "histogram",
        "Wall time of committed batches.",
    );
    for p in pipelines {
        let labels = format!("tenant=\"{}\",pipeline=\"{}\"", p.tenant, p.pipeline);
        for (bucket, bound) in p.metrics.latency_buckets.iter().zip(BUCKETS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = p.metrics.batches.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = p.metrics.latency_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
    header(
        &mut out,
        "statebox_tenant_cpu_seconds_total",
        "counter",
        "CPU time spent in the tenant's processor calls.",
    );
    for t in tenants {
        let _ = writeln!(
            out,
            "statebox_tenant_cpu_seconds_total{{tenant=\"{}\"}} {}",
            t.tenant,
            t.cpu_ns as f64 / 1e9
        );
    }
    header(
        &mut out,
        "statebox_tenant_memory_high_water_bytes",
        "gauge",
        "The largest linear memory any of the tenant's processor instances reached.",
    );
    for t in tenants {
        let _ = writeln!(
            out,
            "statebox_tenant_memory_high_water_bytes{{tenant=\"{}\"}} {}",
            t.tenant, t.memory_high_water
        );
    }
    header(
        &mut out,
        "statebox_tenant_rejected_requests_total",
        "counter",
        "Requests refused for a quota or rate limit.",
    );
    for t in tenants {
        let _ = writeln!(
            out,
            "statebox_tenant_rejected_requests_total{{tenant=\"{}\"}} {}",
            t.tenant, t.rejected_requests
        );
    }
    out
}

impl crate::App {
    /// The server's metrics in the Prometheus text format: every pipeline's, and every
    /// tenant's CPU, memory high-water mark and rejected requests.
    pub(crate) fn prometheus_text(&self) -> String {
        let mut pipelines: Vec<std::sync::Arc<crate::pipeline::PipelineHandle>> = self
            .pipelines
            .lock()
            .expect("pipelines lock")
            .values()
            .cloned()
            .collect();
        pipelines.sort_by(|a, b| (&a.tenant, &a.id).cmp(&(&b.tenant, &b.id)));
        let failed: Vec<bool> = pipelines
            .iter()
            .map(|p| p.status().state == crate::pipeline::RunState::Failed)
            .collect();
        let samples: Vec<PipelineSample<'_>> = pipelines
            .iter()
            .zip(&failed)
            .map(|(p, &failed)| PipelineSample {
                tenant: &p.tenant,
                pipeline: &p.id,
                metrics: &p.metrics,
                failed,
            })
            .collect();
        let tenants: Vec<String> = self
            .registry
            .lock()
            .expect("registry lock")
            .data
            .tenants
            .keys()
            .cloned()
            .collect();
        let rejected = self.rejected.lock().expect("rejected lock").clone();
        let usage: Vec<_> = tenants.iter().map(|t| (t, self.usage(t))).collect();
        let tenant_samples: Vec<TenantSample<'_>> = usage
            .iter()
            .map(|(t, u)| TenantSample {
                tenant: t,
                cpu_ns: u.cpu_ns.load(Ordering::Relaxed),
                memory_high_water: u.memory_high_water.load(Ordering::Relaxed),
                rejected_requests: rejected.get(*t).copied().unwrap_or(0),
            })
            .collect();
        render(&samples, &tenant_samples)
    }
}
