//! The `log` interface: guest messages as `tracing` events on the processor's own target,
//! escaped and bounded.

use super::HostView;
use crate::bindings::statebox::processor::log;

/// A guest log message longer than this is cut.
pub(crate) const MAX_LOG_MESSAGE: usize = 4096;
/// Messages one call may log; the rest are counted and reported in one line.
pub(crate) const MAX_LOGS_PER_CALL: u32 = 100;

impl log::Host for HostView<'_> {
    fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let Some(message) = self.sandbox.log_message(&message) else {
            return Ok(());
        };
        let p = &self.sandbox.processor;
        // Guest messages may contain tenant data: they go to the processor's own log target
        // and are never mixed into the host's messages.
        match level {
            log::Level::Trace => {
                tracing::trace!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Debug => {
                tracing::debug!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Info => {
                tracing::info!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Warn => {
                tracing::warn!(target: "statebox::guest", processor = %p, "{message}")
            }
            log::Level::Error => {
                tracing::error!(target: "statebox::guest", processor = %p, "{message}")
            }
        }
        Ok(())
    }
}

impl super::SandboxCtx {
    /// Counts a message toward the call's [`MAX_LOGS_PER_CALL`] and returns the line to
    /// log: `None` past the limit, a note that the rest are dropped on the last one allowed.
    pub(super) fn log_message(&mut self, message: &str) -> Option<String> {
        self.logged = self.logged.saturating_add(1);
        if self.logged > MAX_LOGS_PER_CALL {
            return None;
        }
        Some(if self.logged == MAX_LOGS_PER_CALL {
            format!(
                "(this call's further messages are dropped) {}",
                log_line(message)
            )
        } else {
            log_line(message)
        })
    }
}

/// A guest message as one bounded log line: control characters (newlines included) are
/// escaped, so a guest cannot forge log lines, and anything past [`MAX_LOG_MESSAGE`] bytes
/// is cut.
pub(crate) fn log_line(message: &str) -> String {
    let mut line = String::with_capacity(message.len().min(MAX_LOG_MESSAGE) + 32);
    for (i, c) in message.char_indices() {
        if line.len() >= MAX_LOG_MESSAGE {
            line.push_str(&format!("… ({} more bytes cut)", message.len() - i));
            break;
        }
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostState;
    use crate::{InstanceConfig, Limits, TimeMode};

    #[test]
    fn log_lines_are_escaped_and_cut() {
        assert_eq!(log_line("a\nb\u{7}c"), "a\\nb\\u{7}c");
        let long = "x".repeat(MAX_LOG_MESSAGE + 10);
        let line = log_line(&long);
        assert!(line.starts_with(&"x".repeat(MAX_LOG_MESSAGE)));
        assert!(line.ends_with("… (10 more bytes cut)"), "{line}");
    }

    #[test]
    fn a_call_logs_only_so_many_messages() {
        let mut h = HostState::new(
            "test".into(),
            InstanceConfig::detached(TimeMode::None),
            &Limits::default(),
            wasmtime::component::ResourceTable::new(),
        );
        h.begin_init();
        let lines: Vec<_> = (0..MAX_LOGS_PER_CALL + 5)
            .map(|_| h.view().sandbox.log_message("m\r"))
            .collect();
        let kept = lines.iter().flatten().count();
        assert_eq!(kept, MAX_LOGS_PER_CALL as usize);
        assert_eq!(lines[0].as_deref(), Some("m\\r"));
        let last = lines[MAX_LOGS_PER_CALL as usize - 1].as_deref().unwrap();
        assert!(
            last.starts_with("(this call's further messages are dropped)"),
            "{last}"
        );
        h.end_call();
        // The next call may log again.
        h.begin_close();
        assert!(h.view().sandbox.log_message("again").is_some());
    }
}
