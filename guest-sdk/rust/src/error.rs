//! The SDK's error type.

use std::fmt;

use crate::__private::bindings::statebox::processor::types as wit;

/// What kind of failure an [`Error`] reports.
///
/// The first eight kinds are the host's `error-kind`s for state and timer operations; the rest
/// arise in the SDK or in processor code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A schema string did not parse, or is not allowed where it was given.
    InvalidSchema,
    /// A value, list element or map key does not match the variable's schema.
    SchemaMismatch,
    /// `put` or `append_list` was given an empty list.
    EmptyList,
    /// A list element was null.
    NullElement,
    /// The operation is not allowed in the current phase, for example touching state in `init`.
    WrongPhase,
    /// Timers or TTL were used in a time mode that does not support them.
    UnsupportedInTimeMode,
    /// A state variable was declared twice with different kinds or schemas, or an iterator was
    /// used after the call that created it returned.
    InvalidUse,
    /// A configured limit of the host (state size, page size) was exceeded.
    LimitExceeded,
    /// A key, state value or output row could not be converted to or from JSON.
    Json,
    /// Input row `index` of the call could not be decoded into the processor's input type.
    BadInputRow {
        /// Index of the row within the call's rows, from 0.
        index: u32,
    },
    /// A failure raised by processor code, through [`Error::msg`], [`bail!`](crate::bail) or
    /// `?` on another error type.
    Processor,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::InvalidSchema => "invalid schema",
            ErrorKind::SchemaMismatch => "schema mismatch",
            ErrorKind::EmptyList => "empty list",
            ErrorKind::NullElement => "null element",
            ErrorKind::WrongPhase => "wrong phase",
            ErrorKind::UnsupportedInTimeMode => "unsupported in time mode",
            ErrorKind::InvalidUse => "invalid use",
            ErrorKind::LimitExceeded => "limit exceeded",
            ErrorKind::Json => "JSON conversion failed",
            ErrorKind::BadInputRow { .. } => "bad input row",
            ErrorKind::Processor => "processor error",
        }
    }
}

/// An error from the host, the SDK or processor code: a kind and a message for humans.
///
/// Like `anyhow::Error`, any `std::error::Error` converts into it with `?`, so it does not
/// implement `std::error::Error` itself (that would make the blanket conversion overlap with
/// `From<Error> for Error`).
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// The result type of processor methods and state operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// A processor error ([`ErrorKind::Processor`]) with the given message.
    pub fn msg(message: impl fmt::Display) -> Self {
        Error::new(ErrorKind::Processor, message.to_string())
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn json(what: &str, err: serde_json::Error) -> Self {
        Error::new(ErrorKind::Json, format!("{what}: {err}"))
    }

    /// Converts the host's `state-error`, keeping its kind.
    pub(crate) fn from_host(err: wit::StateError) -> Self {
        let kind = match err.kind {
            wit::ErrorKind::InvalidSchema => ErrorKind::InvalidSchema,
            wit::ErrorKind::SchemaMismatch => ErrorKind::SchemaMismatch,
            wit::ErrorKind::EmptyList => ErrorKind::EmptyList,
            wit::ErrorKind::NullElement => ErrorKind::NullElement,
            wit::ErrorKind::WrongPhase => ErrorKind::WrongPhase,
            wit::ErrorKind::UnsupportedInTimeMode => ErrorKind::UnsupportedInTimeMode,
            wit::ErrorKind::InvalidUse => ErrorKind::InvalidUse,
            wit::ErrorKind::LimitExceeded => ErrorKind::LimitExceeded,
        };
        Error::new(kind, err.message)
    }

    /// The error as the host's `processor-error`.
    pub(crate) fn into_host(self) -> wit::ProcessorError {
        match self.kind {
            ErrorKind::BadInputRow { index } => wit::ProcessorError::BadInputRow(wit::BadRow {
                index,
                message: self.message,
            }),
            _ => wit::ProcessorError::Failed(self.to_string()),
        }
    }
}

/// Converts results of the raw host imports. The generated `state-error` implements
/// `std::error::Error`, so `?` alone would turn it into a processor error and lose its kind.
pub(crate) trait LiftHost<T> {
    /// The result with the host's error converted by [`Error::from_host`].
    fn lift(self) -> Result<T>;
}

impl<T> LiftHost<T> for Result<T, wit::StateError> {
    fn lift(self) -> Result<T> {
        self.map_err(Error::from_host)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Processor => f.write_str(&self.message),
            ErrorKind::BadInputRow { index } => {
                write!(f, "bad input row {index}: {}", self.message)
            }
            kind => write!(f, "{}: {}", kind.describe(), self.message),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self} ({:?})", self.kind)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Error {
    /// Wraps any error as a processor error, keeping its whole cause chain in the message.
    fn from(err: E) -> Self {
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Error::new(ErrorKind::Processor, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_kind() {
        let err = Error::new(ErrorKind::EmptyList, "list `history`: put of an empty list");
        assert_eq!(
            err.to_string(),
            "empty list: list `history`: put of an empty list"
        );
        assert_eq!(Error::msg("boom").to_string(), "boom");
    }

    #[test]
    fn question_mark_converts_std_errors() {
        fn parse() -> Result<i32> {
            Ok("x".parse::<i32>()?)
        }
        let err = parse().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Processor);
        assert!(err.message().contains("invalid digit"));
    }
}
