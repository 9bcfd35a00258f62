//! Reports sensors that stop sending heartbeats, and sensors that come back.
//!
//! Grouped by `sensor`; every input row is one heartbeat of the key's sensor (its fields are
//! ignored). The query runs in time mode `processing-time`. Per sensor it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `status` | value | `string` | `"up"` or `"down"`: what was last reported |
//! | `deadline` | value | `long` | the armed timer: last heartbeat's batch time + [`TIMEOUT_MS`] |
//!
//! On a batch with heartbeats of a sensor it emits `{"sensor", "status": "up"}` if the sensor
//! was never seen or was reported down, and re-arms the sensor's single timer at
//! `batch time + TIMEOUT_MS` (deleting the previous one). When the timer fires, no heartbeat
//! came within the timeout: it emits `{"sensor", "status": "down"}` once and arms nothing, so
//! the next report is the `up` of the sensor's next heartbeat.
//!
//! A timer fires at the end of the first batch whose timestamp is at or after its time, after
//! that batch's input: a heartbeat in that very batch re-arms the timer first, so the sensor is
//! not reported down.

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// How long a sensor may stay silent before it is reported down, in milliseconds.
pub const TIMEOUT_MS: i64 = 10_000;

/// What the monitor last reported for a sensor.
pub const UP: &str = "up";
/// See [`UP`].
pub const DOWN: &str = "down";

/// The row emitted when a sensor's status changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusChange {
    /// The sensor (the grouping key's only column, as a string).
    pub sensor: String,
    /// `"up"` or `"down"`.
    pub status: String,
}

/// The heartbeat monitor. See the [crate docs](crate).
pub struct HeartbeatMonitor {
    status: ValueState<String>,
    deadline: ValueState<i64>,
    timers: Timers,
}

/// The sensor name of a key: its only column as a string (as is for a string, else its JSON
/// text).
fn sensor(key: &Key) -> Result<String> {
    if let Some(name) = key.as_str() {
        return Ok(name.to_owned());
    }
    match key.raw_columns()?.as_slice() {
        [column] => Ok((*column).to_owned()),
        _ => Ok(key.json().to_owned()),
    }
}

impl HeartbeatMonitor {
    fn report(&self, key: &Key, status: &str, out: &mut Emitter<StatusChange>) -> Result<()> {
        self.status.update(&status.to_owned())?;
        out.emit(StatusChange {
            sensor: sensor(key)?,
            status: status.to_owned(),
        })
    }
}

impl StatefulProcessor for HeartbeatMonitor {
    type Input = IgnoredAny;
    type Output = StatusChange;
    type InitialState = NoInitialState;

    const NAME: &'static str = "heartbeat-monitor";
    const OUTPUT_SCHEMA: &'static str = "sensor string, status string";
    // Its writes cannot fail (`init` accepts processing time only, where timers are
    // allowed): the deadline's update and the timer's re-arming go many keys to a call.
    const HOLD_WRITES: bool = true;

    fn init(handle: &mut Handle) -> Result<Self> {
        if handle.time_mode() != TimeMode::ProcessingTime {
            statebox_sdk::bail!(
                "heartbeat-monitor measures timeouts in processing time: run it with time mode processing-time"
            );
        }
        Ok(HeartbeatMonitor {
            status: handle.value_state("status", "string")?,
            deadline: handle.value_state("deadline", "long")?,
            timers: handle.timers(),
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<IgnoredAny>,
        timer_values: TimerValues,
        out: &mut Emitter<StatusChange>,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        if self.status.get()?.as_deref() != Some(UP) {
            self.report(key, UP, out)?;
        }
        if let Some(previous) = self.deadline.get()? {
            self.timers.delete(previous)?;
        }
        let deadline = timer_values.current_processing_time_ms() + TIMEOUT_MS;
        self.timers.register(deadline)?;
        self.deadline.update(&deadline)
    }

    fn handle_expired_timer(
        &mut self,
        key: &Key,
        _timer_values: TimerValues,
        info: ExpiredTimerInfo,
        out: &mut Emitter<StatusChange>,
    ) -> Result<()> {
        // Only the armed timer counts; heartbeats delete the ones they replace.
        if self.deadline.get()? != Some(info.expiry_time_ms()) {
            return Ok(());
        }
        self.deadline.clear()?;
        self.report(key, DOWN, out)
    }
}

statebox_sdk::export_processor!(HeartbeatMonitor);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn harness() -> TestHarness<HeartbeatMonitor> {
        TestHarness::new(TimeMode::ProcessingTime).unwrap()
    }

    fn beat(h: &mut TestHarness<HeartbeatMonitor>, sensor: &str) -> Vec<StatusChange> {
        h.handle_input_rows(sensor, vec![IgnoredAny]).unwrap()
    }

    fn change(sensor: &str, status: &str) -> Vec<StatusChange> {
        vec![StatusChange {
            sensor: sensor.to_owned(),
            status: status.to_owned(),
        }]
    }

    #[test]
    fn first_heartbeat_reports_up_and_arms_the_timeout() {
        let mut h = harness();
        h.set_processing_time(1_000);
        assert_eq!(beat(&mut h, "s1"), change("s1", UP));
        assert_eq!(h.timers("s1"), vec![1_000 + TIMEOUT_MS]);
        assert_eq!(h.value_state::<String>("status", "s1").as_deref(), Some(UP));
    }

    #[test]
    fn heartbeats_while_up_rearm_silently() {
        let mut h = harness();
        h.set_processing_time(1_000);
        beat(&mut h, "s1");
        h.set_processing_time(5_000);
        assert_eq!(beat(&mut h, "s1"), vec![]);
        assert_eq!(h.timers("s1"), vec![5_000 + TIMEOUT_MS]);
        h.set_processing_time(1_000 + TIMEOUT_MS);
        assert_eq!(h.fire_expired_timers().unwrap(), vec![]);
    }

    #[test]
    fn silence_reports_down_once_then_up_on_return() {
        let mut h = harness();
        h.set_processing_time(1_000);
        beat(&mut h, "s1");
        h.set_processing_time(1_000 + TIMEOUT_MS);
        assert_eq!(h.fire_expired_timers().unwrap(), change("s1", DOWN));
        assert_eq!(h.timers("s1"), Vec::<i64>::new());
        h.advance_processing_time(60_000);
        assert_eq!(h.fire_expired_timers().unwrap(), vec![]);
        assert_eq!(beat(&mut h, "s1"), change("s1", UP));
        assert_eq!(beat(&mut h, "s1"), vec![]);
    }

    #[test]
    fn sensors_are_independent() {
        let mut h = harness();
        h.set_processing_time(1_000);
        beat(&mut h, "s1");
        h.set_processing_time(4_000);
        beat(&mut h, "s2");
        h.set_processing_time(1_000 + TIMEOUT_MS);
        assert_eq!(h.fire_expired_timers().unwrap(), change("s1", DOWN));
        h.set_processing_time(4_000 + TIMEOUT_MS);
        assert_eq!(h.fire_expired_timers().unwrap(), change("s2", DOWN));
    }

    #[test]
    fn non_string_sensor_keys_use_their_json_text() {
        let mut h = harness();
        assert_eq!(
            h.handle_input_rows(42, vec![IgnoredAny]).unwrap(),
            change("42", UP)
        );
    }

    #[test]
    fn state_and_timer_survive_a_restart() {
        let mut h = harness();
        h.set_processing_time(1_000);
        beat(&mut h, "s1");
        h.restart().unwrap();
        h.set_processing_time(1_000 + TIMEOUT_MS);
        assert_eq!(h.fire_expired_timers().unwrap(), change("s1", DOWN));
    }

    #[test]
    fn refuses_other_time_modes() {
        for mode in [TimeMode::None, TimeMode::EventTime] {
            let err = TestHarness::<HeartbeatMonitor>::new(mode).err().unwrap();
            assert!(err.to_string().contains("processing-time"), "{err}");
        }
    }
}
