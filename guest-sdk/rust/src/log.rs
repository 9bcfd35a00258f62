//! Logging from a processor.
//!
//! In a component, messages go to the host, which records them as `tracing` events tagged
//! with the processor (and may drop them past a per-call budget). Natively, under the test
//! harness, they are printed to standard error.
//!
//! ```
//! statebox_sdk::log::info!("saw {} rows", 3);
//! ```

use std::fmt;

/// Severity of a log message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the processor handled.
    Warn,
    /// A failure.
    Error,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Trace => "TRACE",
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        })
    }
}

/// Logs one message.
#[cfg(target_arch = "wasm32")]
pub fn log(level: Level, message: &str) {
    use crate::__private::bindings::statebox::processor::log as wit;
    let level = match level {
        Level::Trace => wit::Level::Trace,
        Level::Debug => wit::Level::Debug,
        Level::Info => wit::Level::Info,
        Level::Warn => wit::Level::Warn,
        Level::Error => wit::Level::Error,
    };
    wit::log(level, message);
}

/// Logs one message.
#[cfg(not(target_arch = "wasm32"))]
pub fn log(level: Level, message: &str) {
    // The host import does not exist natively; tests see the message on standard error,
    // which the test runner captures per test.
    eprintln!("[{level}] {message}");
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::log($crate::log::Level::$level, &::std::format!($($arg)*))
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_trace {
    ($($arg:tt)*) => { $crate::__log!(Trace, $($arg)*) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_debug {
    ($($arg:tt)*) => { $crate::__log!(Debug, $($arg)*) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_info {
    ($($arg:tt)*) => { $crate::__log!(Info, $($arg)*) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_warn {
    ($($arg:tt)*) => { $crate::__log!(Warn, $($arg)*) };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __log_error {
    ($($arg:tt)*) => { $crate::__log!(Error, $($arg)*) };
}

/// Logs a message at [`Level::Trace`], formatted like `format!`.
#[doc(inline)]
pub use crate::__log_trace as trace;

/// Logs a message at [`Level::Debug`], formatted like `format!`.
#[doc(inline)]
pub use crate::__log_debug as debug;

/// Logs a message at [`Level::Info`], formatted like `format!`.
#[doc(inline)]
pub use crate::__log_info as info;

/// Logs a message at [`Level::Warn`], formatted like `format!`.
#[doc(inline)]
pub use crate::__log_warn as warn;

/// Logs a message at [`Level::Error`], formatted like `format!`.
#[doc(inline)]
pub use crate::__log_error as error;
