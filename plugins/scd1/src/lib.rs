//! Slowly changing dimension, type 1: keeps each user's latest location, by event time.
//!
//! Grouped by `user`; input rows are `{"user": string, "time": long, "location": string}`.
//! Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `latestLocation` | value | `time long, location string` | the row with the greatest `time` so far |
//!
//! For each call it picks the batch's row with the greatest `time` (the first of equals) and,
//! if the user has no stored row or the stored one is strictly older, stores it and emits
//! `{"user", "time", "location"}`. Users whose rows in the batch were all older (or as old)
//! emit nothing. This is Spark's `SCDType1StatefulProcessor` example.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// One input row, and the row emitted when a user's location changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserLocation {
    /// The user, also the grouping key.
    pub user: String,
    /// When the user was seen there, e.g. milliseconds since the epoch.
    pub time: i64,
    /// Where the user was seen.
    pub location: String,
}

/// The `latestLocation` value state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latest {
    /// The greatest `time` seen for the user.
    pub time: i64,
    /// The location of that row.
    pub location: String,
}

/// The SCD type 1 processor. See the [crate docs](crate).
pub struct Scd1 {
    latest: ValueState<Latest>,
}

impl StatefulProcessor for Scd1 {
    type Input = UserLocation;
    type Output = UserLocation;
    type InitialState = NoInitialState;

    const NAME: &'static str = "scd1";
    const OUTPUT_SCHEMA: &'static str = "user string, time long, location string";
    const INPUT_SCHEMA: Option<&'static str> = Some("user string, time long, location string");

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(Scd1 {
            latest: handle.value_state("latestLocation", "time long, location string")?,
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<UserLocation>,
        _timer_values: TimerValues,
        out: &mut Emitter<UserLocation>,
    ) -> Result<()> {
        let newest = rows
            .into_iter()
            .reduce(|best, row| if row.time > best.time { row } else { best });
        let Some(newest) = newest else {
            return Ok(());
        };
        if let Some(stored) = self.latest.get()?
            && stored.time >= newest.time
        {
            return Ok(());
        }
        let latest = Latest {
            time: newest.time,
            location: newest.location,
        };
        self.latest.update(&latest)?;
        out.emit(UserLocation {
            user: newest.user,
            time: latest.time,
            location: latest.location,
        })
    }
}

statebox_sdk::export_processor!(Scd1);

#[cfg(test)]
mod tests {
    use statebox_sdk::ErrorKind;
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn row(user: &str, time: i64, location: &str) -> UserLocation {
        UserLocation {
            user: user.to_owned(),
            time,
            location: location.to_owned(),
        }
    }

    fn latest(time: i64, location: &str) -> Option<Latest> {
        Some(Latest {
            time,
            location: location.to_owned(),
        })
    }

    fn harness() -> TestHarness<Scd1> {
        TestHarness::new(TimeMode::None).unwrap()
    }

    #[test]
    fn keeps_the_newest_row_per_user() {
        let mut h = harness();
        let out = h
            .handle_input_rows(
                "u1",
                vec![row("u1", 1, "NYC"), row("u1", 3, "SF"), row("u1", 2, "LA")],
            )
            .unwrap();
        assert_eq!(out, vec![row("u1", 3, "SF")]);
        let out = h
            .handle_input_rows("u2", vec![row("u2", 5, "London")])
            .unwrap();
        assert_eq!(out, vec![row("u2", 5, "London")]);
        assert_eq!(
            h.value_state::<Latest>("latestLocation", "u1"),
            latest(3, "SF")
        );
        assert_eq!(
            h.value_state::<Latest>("latestLocation", "u2"),
            latest(5, "London")
        );
    }

    #[test]
    fn older_rows_of_a_later_batch_change_nothing() {
        let mut h = harness();
        h.handle_input_rows("u1", vec![row("u1", 3, "SF")]).unwrap();
        let out = h
            .handle_input_rows("u1", vec![row("u1", 2, "LA"), row("u1", 1, "NYC")])
            .unwrap();
        assert!(out.is_empty());
        let out = h
            .handle_input_rows("u1", vec![row("u1", 3, "Paris")])
            .unwrap();
        assert!(
            out.is_empty(),
            "a row as old as the stored one is not newer"
        );
        assert_eq!(
            h.value_state::<Latest>("latestLocation", "u1"),
            latest(3, "SF")
        );
        let out = h
            .handle_input_rows("u1", vec![row("u1", 2, "LA"), row("u1", 4, "Rome")])
            .unwrap();
        assert_eq!(out, vec![row("u1", 4, "Rome")]);
        assert_eq!(
            h.value_state::<Latest>("latestLocation", "u1"),
            latest(4, "Rome")
        );
    }

    #[test]
    fn ties_within_a_batch_keep_the_first_row() {
        let mut h = harness();
        let out = h
            .handle_input_rows("u1", vec![row("u1", 7, "Oslo"), row("u1", 7, "Bergen")])
            .unwrap();
        assert_eq!(out, vec![row("u1", 7, "Oslo")]);
    }

    #[test]
    fn users_are_isolated() {
        let mut h = harness();
        h.handle_input_rows("u1", vec![row("u1", 10, "SF")])
            .unwrap();
        // u2's older time is still u2's first location.
        let out = h.handle_input_rows("u2", vec![row("u2", 1, "LA")]).unwrap();
        assert_eq!(out, vec![row("u2", 1, "LA")]);
        assert_eq!(
            h.value_state::<Latest>("latestLocation", "u1"),
            latest(10, "SF")
        );
        assert_eq!(h.value_state::<Latest>("latestLocation", "u3"), None);
    }

    #[test]
    fn names_bad_rows() {
        let mut h = harness();
        let err = h
            .handle_input_json(
                "u1",
                &[
                    r#"{"user":"u1","time":1,"location":"NYC"}"#,
                    r#"{"user":"u1","time":"late","location":"SF"}"#,
                ],
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
    }
}
