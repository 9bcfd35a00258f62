//! `statebox bench serve`: a bounded load test of the server on loopback. Starts a server
//! in-process on a temporary data directory, creates tenants with one pipeline each, and
//! has many concurrent clients post rows (keep-alive HTTP/1.1) until each has sent its
//! share; reports the sustained acknowledged rows/s, the ack latency percentiles, and how
//! long the pipelines took to process everything.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Quotas, ServeError, Server, ServerConfig};

/// Why the benchmark could not run to its end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The options do not describe a load (the caller's to fix).
    #[error("{0}")]
    Options(&'static str),
    /// A file, the temporary data directory or a connection to the server failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The server answered what the benchmark did not expect (an error status, a response
    /// it cannot parse), or a pipeline failed or did not catch up.
    #[error("{0}")]
    Server(String),
    /// The server could not start, or stopped with an error.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A thread of the benchmark panicked.
    #[error("{0} panicked")]
    Panicked(&'static str),
}

/// An I/O error on the connection to the server.
impl From<std::io::Error> for BenchError {
    fn from(source: std::io::Error) -> BenchError {
        BenchError::Io {
            what: "the connection to the server failed".into(),
            source,
        }
    }
}

type Result<T> = std::result::Result<T, BenchError>;

/// The load to generate.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The processor component (the counter plugin).
    pub processor: PathBuf,
    /// Tenants, each with one pipeline.
    pub tenants: usize,
    /// Concurrent clients per tenant.
    pub clients_per_tenant: usize,
    /// Requests each client sends, one after the other.
    pub requests_per_client: usize,
    /// Rows per request.
    pub rows_per_request: usize,
    /// Distinct keys per pipeline.
    pub keys: u64,
}

/// A minimal keep-alive HTTP/1.1 client, enough to drive the server without a client
/// library's overhead in the measurement.
pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> Result<Client> {
        let stream = TcpStream::connect(addr).map_err(|source| BenchError::Io {
            what: format!("cannot connect to {addr}"),
            source,
        })?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(Client {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one request and returns the status and the body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: statebox\r\nauthorization: Bearer {token}\r\n\
             content-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        self.writer.write_all(head.as_bytes())?;
        self.writer.write_all(body)?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| BenchError::Server(format!("bad status line `{}`", line.trim())))?;
        let mut length = None;
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let length = length
            .ok_or_else(|| BenchError::Server("the response has no content-length".into()))?;
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body)?;
        Ok((status, body))
    }

    /// A JSON request that must succeed; returns the response.
    pub fn json(&mut self, method: &str, path: &str, token: &str, body: &Value) -> Result<Value> {
        // `null` sends no body: the server does not read the body of a GET.
        let text = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let (status, bytes) =
            self.request(method, path, token, "application/json", text.as_bytes())?;
        if status >= 300 {
            return Err(BenchError::Server(format!(
                "{method} {path}: {status} {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        parse(&bytes)
    }
}

/// A response body as JSON.
fn parse(bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes)
        .map_err(|e| BenchError::Server(format!("the response is not JSON: {e}")))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Runs the load test; returns its report.
pub fn run(opts: BenchOptions) -> Result<Value> {
    if opts.tenants == 0
        || opts.clients_per_tenant == 0
        || opts.requests_per_client == 0
        || opts.rows_per_request == 0
        || opts.keys == 0
    {
        return Err(BenchError::Options(
            "--tenants, --clients, --requests, --rows and --keys must be positive",
        ));
    }
    let wasm = std::fs::read(&opts.processor).map_err(|source| BenchError::Io {
        what: format!("cannot read {}", opts.processor.display()),
        source,
    })?;
    let data = tempfile::Builder::new()
        .prefix("statebox-bench-serve-")
        .tempdir()
        .map_err(|source| BenchError::Io {
            what: "cannot create a temporary data directory".into(),
            source,
        })?;
    let admin = crate::registry::random_id("adm_", 32).map_err(|source| BenchError::Io {
        what: "cannot make an admin token".into(),
        source,
    })?;
    let config = ServerConfig {
        data_dir: data.path().to_owned(),
        listen: "127.0.0.1:0".parse().expect("an address"),
        admin_token: admin.clone(),
        cache_dir: None,
        default_quotas: Quotas::default(),
        max_attempts: 3,
        retry_backoff: Duration::from_millis(200),
        http: crate::HttpLimits::default(),
    };
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|source| BenchError::Io {
                what: "cannot start the async runtime".into(),
                source,
            })?;
        rt.block_on(async move {
            let server = match Server::start(config).await {
                Ok(s) => s,
                Err(e) => {
                    let _ = addr_tx.send(Err(e));
                    return Ok(());
                }
            };
            let _ = addr_tx.send(Ok(server.addr()));
            server
                .run_until(async move {
                    let _ = stop_rx.await;
                })
                .await
                .map_err(BenchError::from)
        })
    });
    let addr = addr_rx
        .recv()
        .map_err(|_| BenchError::Server("the server thread ended".into()))??;

    let mut setup = Client::connect(addr)?;
    let mut tenants = Vec::new();
    for t in 0..opts.tenants {
        let tenant = setup.json(
            "POST",
            "/v1/tenants",
            &admin,
            &json!({"name": format!("bench-{t}")}),
        )?;
        let token = tenant["token"]
            .as_str()
            .ok_or_else(|| BenchError::Server("no token".into()))?
            .to_owned();
        let (status, body) =
            setup.request("POST", "/v1/processors", &token, "application/wasm", &wasm)?;
        if status >= 300 {
            return Err(BenchError::Server(format!(
                "upload failed: {status} {}",
                String::from_utf8_lossy(&body)
            )));
        }
        let processor = parse(&body)?;
        let pipeline = setup.json(
            "POST",
            "/v1/pipelines",
            &token,
            &json!({"processor": processor["id"], "key": "k", "trigger_interval_ms": 100}),
        )?;
        let id = pipeline["id"]
            .as_str()
            .ok_or_else(|| BenchError::Server("no pipeline id".into()))?
            .to_owned();
        tenants.push((token, id));
    }

    let started = Instant::now();
    let mut workers = Vec::new();
    for (t, (token, pipeline)) in tenants.iter().enumerate() {
        for c in 0..opts.clients_per_tenant {
            let (token, path) = (token.clone(), format!("/v1/pipelines/{pipeline}/rows"));
            let opts = opts.clone();
            workers.push(std::thread::spawn(move || -> Result<Vec<Duration>> {
                let mut client = Client::connect(addr)?;
                let mut latencies = Vec::with_capacity(opts.requests_per_client);
                let mut seq = (t * 1_000_003 + c * 7_919) as u64;
                for r in 0..opts.requests_per_client {
                    let mut body = String::with_capacity(opts.rows_per_request * 32);
                    for _ in 0..opts.rows_per_request {
                        seq = seq
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        body.push_str(&format!(
                            "{{\"k\":\"k{}\",\"c\":{c},\"r\":{r}}}\n",
                            (seq >> 33) % opts.keys
                        ));
                    }
                    let sent = Instant::now();
                    let (status, reply) = client.request(
                        "POST",
                        &path,
                        &token,
                        "application/x-ndjson",
                        body.as_bytes(),
                    )?;
                    latencies.push(sent.elapsed());
                    if status != 200 {
                        return Err(BenchError::Server(format!(
                            "ingest answered {status}: {}",
                            String::from_utf8_lossy(&reply)
                        )));
                    }
                }
                Ok(latencies)
            }));
        }
    }
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(
            w.join()
                .map_err(|_| BenchError::Panicked("a client thread"))??,
        );
    }
    let ingest_seconds = started.elapsed().as_secs_f64();
    let per_pipeline =
        (opts.clients_per_tenant * opts.requests_per_client * opts.rows_per_request) as u64;
    let total = per_pipeline * opts.tenants as u64;

    // Wait until every pipeline processed everything it acknowledged.
    let deadline = Instant::now() + Duration::from_secs(600);
    for (token, id) in &tenants {
        loop {
            let p = setup.json("GET", &format!("/v1/pipelines/{id}"), token, &Value::Null)?;
            if p["rows_processed"].as_u64() == Some(per_pipeline) {
                break;
            }
            if p["status"]["state"] == "failed" {
                return Err(BenchError::Server(format!(
                    "pipeline {id} failed: {}",
                    p["status"]["failure"]
                )));
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Server(format!(
                    "pipeline {id} did not catch up in 10 minutes"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let processed_seconds = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(());
    server
        .join()
        .map_err(|_| BenchError::Panicked("the server thread"))??;

    latencies.sort();
    Ok(json!({
        "workload": "serve",
        "tenants": opts.tenants,
        "clients": opts.tenants * opts.clients_per_tenant,
        "requests": latencies.len(),
        "rows_per_request": opts.rows_per_request,
        "rows": total,
        "ingest_seconds": (ingest_seconds * 1000.0).round() / 1000.0,
        "acked_rows_per_s": (total as f64 / ingest_seconds).round(),
        "requests_per_s": (latencies.len() as f64 / ingest_seconds).round(),
        "ack_latency_ms": {
            "p50": (percentile(&latencies, 0.50) * 100.0).round() / 100.0,
            "p99": (percentile(&latencies, 0.99) * 100.0).round() / 100.0,
            "max": (percentile(&latencies, 1.0) * 100.0).round() / 100.0,
        },
        "processed_seconds": (processed_seconds * 1000.0).round() / 1000.0,
        "processed_rows_per_s": (total as f64 / processed_seconds).round(),
    }))
}
