//! A processor whose calls attack the runtime, so the end-to-end tests can check that every
//! call stays bounded in time and in the host memory it drives (issue: no tenant can freeze,
//! starve or exhaust the host).
//!
//! Grouped by `k`. Each input row `{"k": ..., "action": ..., "n": ...}` runs one action and
//! emits `{"k", "action", "detail", "count"}`:
//!
//! | action | does |
//! |---|---|
//! | `ok` | emits `count` 1 |
//! | `sleep` | sleeps `n` ms (`std::thread::sleep`); emits the guest's elapsed monotonic and wall time in ms (`detail` `mono,wall`) |
//! | `sleep-forever` | sleeps 1 s at a time, forever |
//! | `block-body` | writes an outgoing HTTP request's body with `blocking-write-and-flush` without ever sending the request, so the write waits for room that never comes |
//! | `spin` | spins `n` iterations, then emits `count` 1 |
//! | `leak-iterators` | opens `n` list iterators and never drops them; emits how many it got (`count`) and the first error (`detail`) |
//! | `timers` | registers `n` timers, then lists them; emits how many `list-timers` returned or its error |
//! | `log-flood` | logs `n` messages, each with a newline and a bell character |
//! | `big-page` | appends `n` elements of 256 KiB to a list, then reads the first page; emits the page's size |
//! | `write-flood` | writes `n` values of 1 MiB to one value state; emits how many writes succeeded and the first error |
//! | `alias-append` | calls `append-list` with `n` strings that all alias one 1 MiB buffer: `n` MiB for the host to copy from 1 MiB of guest memory |

use std::hint::black_box;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use statebox_sdk::__private::bindings::statebox::processor::{handle as raw, state as raw_state};
use statebox_sdk::prelude::*;

/// One input row.
#[derive(Debug, Deserialize)]
pub struct Row {
    /// The grouping key.
    pub k: String,
    /// What to do.
    pub action: String,
    /// The action's size (milliseconds, iterations or items).
    #[serde(default)]
    pub n: u64,
}

/// One output row.
#[derive(Debug, Serialize)]
pub struct Out {
    k: String,
    action: String,
    detail: String,
    count: i64,
}

/// The processor. See the [crate docs](crate).
pub struct HostileCalls {
    items: ListState<String>,
    /// The same kind of list through the raw import, to read one page as the host sends it.
    pages: raw_state::ListState,
    blob: ValueState<String>,
    timers: Timers,
}

impl StatefulProcessor for HostileCalls {
    type Input = Row;
    type Output = Out;
    type InitialState = NoInitialState;

    const NAME: &'static str = "hostile-calls";
    const OUTPUT_SCHEMA: &'static str = "k string, action string, detail string, count long";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(HostileCalls {
            items: handle.list_state("items", "string")?,
            pages: raw::get_list_state("pages", "string", None)
                .map_err(|e| Error::msg(format!("{:?}: {}", e.kind, e.message)))?,
            blob: handle.value_state("blob", "string")?,
            timers: handle.timers(),
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Row>,
        _timer_values: TimerValues,
        out: &mut Emitter<Out>,
    ) -> Result<()> {
        for row in rows {
            let (detail, count) = self.act(&row)?;
            out.emit(Out {
                k: row.k,
                action: row.action,
                detail,
                count,
            })?;
        }
        Ok(())
    }
}

impl HostileCalls {
    fn act(&mut self, row: &Row) -> Result<(String, i64)> {
        let n = row.n;
        Ok(match row.action.as_str() {
            "ok" => (String::new(), 1),
            "sleep" => {
                let (mono, wall) = (Instant::now(), SystemTime::now());
                std::thread::sleep(std::time::Duration::from_millis(n));
                let mono = mono.elapsed().as_millis();
                let wall = wall.elapsed().map(|d| d.as_millis()).unwrap_or(0);
                (format!("{mono},{wall}"), mono as i64)
            }
            "sleep-forever" => loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            },
            "block-body" => {
                block_on_request_body();
                ("the body write returned".into(), 0)
            }
            "spin" => {
                let mut x = 0u64;
                for _ in 0..n {
                    x = black_box(x.wrapping_add(1));
                }
                (x.to_string(), 1)
            }
            "leak-iterators" => {
                self.items.append_value(&"x".to_owned())?;
                let mut opened = 0;
                let mut first_error = String::new();
                for _ in 0..n {
                    match self.items.get() {
                        Ok(it) => {
                            std::mem::forget(it);
                            opened += 1;
                        }
                        Err(e) => {
                            first_error = format!("{:?}: {}", e.kind(), e.message());
                            break;
                        }
                    }
                }
                (first_error, opened)
            }
            "timers" => {
                for i in 0..n {
                    self.timers.register(1_000_000_000 + i as i64)?;
                }
                match self.timers.list() {
                    Ok(list) => (String::new(), list.len() as i64),
                    Err(e) => (format!("{:?}: {}", e.kind(), e.message()), -1),
                }
            }
            "log-flood" => {
                for i in 0..n {
                    statebox_sdk::log::log(
                        statebox_sdk::log::Level::Info,
                        &format!("flood {i}\nforged line\u{7}"),
                    );
                }
                (String::new(), n as i64)
            }
            "big-page" => {
                let host =
                    |e: raw_state::StateError| Error::msg(format!("{:?}: {}", e.kind, e.message));
                let element = serde_json::to_string(&"y".repeat(256 << 10))?;
                for _ in 0..n {
                    self.pages.append_value(&element).map_err(host)?;
                }
                let page = self
                    .pages
                    .get()
                    .map_err(host)?
                    .next_page(4096)
                    .map_err(host)?;
                let bytes: usize = page.iter().map(String::len).sum();
                (bytes.to_string(), page.len() as i64)
            }
            "write-flood" => {
                let value = "z".repeat(1 << 20);
                let mut written = 0;
                let mut first_error = String::new();
                for _ in 0..n {
                    match self.blob.update(&value) {
                        Ok(()) => written += 1,
                        Err(e) => {
                            first_error = format!("{:?}: {}", e.kind(), e.message());
                            break;
                        }
                    }
                }
                (first_error, written)
            }
            "alias-append" => {
                let host =
                    |e: raw_state::StateError| Error::msg(format!("{:?}: {}", e.kind, e.message));
                let buffer = format!("\"{}\"", "a".repeat((1 << 20) - 2));
                let aliased: Vec<String> = (0..n)
                    .map(|_| {
                        // SAFETY: every element aliases `buffer`, which outlives them; none
                        // is ever dropped (the vector is forgotten below), so nothing is
                        // freed twice. This is the attack: lowering copies no bytes, the
                        // host would copy each element.
                        unsafe {
                            String::from_raw_parts(
                                buffer.as_ptr().cast_mut(),
                                buffer.len(),
                                buffer.capacity(),
                            )
                        }
                    })
                    .collect();
                let result = self.pages.append_list(&aliased);
                std::mem::forget(aliased);
                result.map_err(host)?;
                ("appended".into(), n as i64)
            }
            other => statebox_sdk::bail!("unknown action `{other}`"),
        })
    }
}

statebox_sdk::export_processor!(HostileCalls);

/// Fills an outgoing request's body stream with blocking writes, never handing the request
/// to `outgoing-handler`: nothing ever reads the body, so once its buffer is full the write
/// waits forever unless the host gives up on the call.
#[cfg(target_arch = "wasm32")]
fn block_on_request_body() {
    use wasi::http::types::{Fields, OutgoingBody, OutgoingRequest};
    let request = OutgoingRequest::new(Fields::new());
    let body: OutgoingBody = request.body().expect("the request's body");
    let stream = body.write().expect("the body's stream");
    let chunk = vec![0u8; 4096];
    loop {
        if stream.blocking_write_and_flush(&chunk).is_err() {
            return;
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn block_on_request_body() {}
