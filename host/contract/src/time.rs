//! A query's time mode and the times of one batch: the single home of the clock that timers
//! fire against and TTL expires against.

use serde::{Deserialize, Serialize};

/// The query's time mode; fixed for its lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeMode {
    /// No timers, no TTL.
    None,
    /// Timers and TTL against the batch timestamp.
    ProcessingTime,
    /// Timers (and TTL) against the watermark.
    EventTime,
}

impl std::str::FromStr for TimeMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(TimeMode::None),
            "processing-time" => Ok(TimeMode::ProcessingTime),
            "event-time" => Ok(TimeMode::EventTime),
            _ => Err(format!(
                "unknown time mode `{s}` (expected none, processing-time or event-time)"
            )),
        }
    }
}

impl std::fmt::Display for TimeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeMode::None => "none",
            TimeMode::ProcessingTime => "processing-time",
            TimeMode::EventTime => "event-time",
        })
    }
}

impl TimeMode {
    /// The time timers fire against and TTL expires against in a batch with these times:
    /// the batch timestamp, the watermark (TTL too: a Statebox extension), or none in time
    /// mode `none`. The engine (firing timers, TTL cleanup) and the runtime (the expiry of
    /// a write, what reads hide) both ask here, so they cannot disagree.
    pub fn clock(self, batch_timestamp_ms: i64, watermark_ms: i64) -> Option<i64> {
        match self {
            TimeMode::None => None,
            TimeMode::ProcessingTime => Some(batch_timestamp_ms),
            TimeMode::EventTime => Some(watermark_ms),
        }
    }
}

/// The times and identity of the batch being run.
#[derive(Clone, Copy, Debug)]
pub struct BatchTimes {
    /// Batch id, used to seed the guest's virtual randomness.
    pub batch_id: u64,
    /// The batch timestamp (ms since the epoch), recorded with the batch for replay.
    pub batch_timestamp_ms: i64,
    /// The watermark for this batch; -1 when not in event-time mode.
    pub watermark_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_follows_the_time_mode() {
        assert_eq!(TimeMode::None.clock(1_000, 500), None);
        assert_eq!(TimeMode::ProcessingTime.clock(1_000, 500), Some(1_000));
        assert_eq!(TimeMode::EventTime.clock(1_000, 500), Some(500));
    }

    #[test]
    fn time_mode_text_round_trips() {
        for mode in [
            TimeMode::None,
            TimeMode::ProcessingTime,
            TimeMode::EventTime,
        ] {
            assert_eq!(mode.to_string().parse::<TimeMode>(), Ok(mode));
        }
        let err = "wall-clock".parse::<TimeMode>().unwrap_err();
        assert!(err.contains("wall-clock"), "{err}");
    }
}
