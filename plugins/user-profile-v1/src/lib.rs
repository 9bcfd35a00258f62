//! A user profile, version 1: the first of three versions of one processor that show how
//! state schemas evolve (SPEC §7). See the README for the whole chain.
//!
//! Grouped by `user`; input rows are `{"user": string, "name": string, "visits": int}`: each
//! row reports the user's current name and some new visits. Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `profile` | value | `name string, visits int` | the latest name and the visits so far |
//!
//! and emits the profile once per call, `{"user", "name", "visits"}`. `visits` is an `int`:
//! a total that no longer fits fails the call, which is what version 2 fixes by widening it.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The schema of the `profile` value state.
pub const PROFILE_SCHEMA: &str = "name string, visits int";

/// One input row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visit {
    /// The user, also the grouping key.
    pub user: String,
    /// The user's current name.
    pub name: String,
    /// Visits since the last report.
    pub visits: i32,
}

/// The `profile` value state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// The name of the user's latest row.
    pub name: String,
    /// Visits over all rows.
    pub visits: i32,
}

/// The row emitted per call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileRow {
    /// The user.
    pub user: String,
    /// The user's latest name.
    pub name: String,
    /// The user's visits over all batches.
    pub visits: i32,
}

/// The user-profile processor, version 1. See the [crate docs](crate).
pub struct UserProfile {
    profile: ValueState<Profile>,
}

impl StatefulProcessor for UserProfile {
    type Input = Visit;
    type Output = ProfileRow;
    type InitialState = NoInitialState;

    const NAME: &'static str = "user-profile-v1";
    const OUTPUT_SCHEMA: &'static str = "user string, name string, visits int";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(UserProfile {
            profile: handle.value_state("profile", PROFILE_SCHEMA)?,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Visit>,
        _timer_values: TimerValues,
        out: &mut Emitter<ProfileRow>,
    ) -> Result<()> {
        let Some(last) = rows.last() else {
            return Ok(());
        };
        let user = last.user.clone();
        let mut profile = self.profile.get()?.unwrap_or(Profile {
            name: String::new(),
            visits: 0,
        });
        for row in rows {
            profile.name = row.name;
            profile.visits = match profile.visits.checked_add(row.visits) {
                Some(visits) => visits,
                None => statebox_sdk::bail!(
                    "user {}: {} + {} visits overflow an int; upgrade to user-profile-v2, \
                     which counts visits as a long",
                    key.as_str().unwrap_or(key.json()),
                    profile.visits,
                    row.visits
                ),
            };
        }
        self.profile.update(&profile)?;
        out.emit(ProfileRow {
            user,
            name: profile.name,
            visits: profile.visits,
        })
    }
}

statebox_sdk::export_processor!(UserProfile);

#[cfg(test)]
mod tests {
    use statebox_sdk::ErrorKind;
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn visit(user: &str, name: &str, visits: i32) -> Visit {
        Visit {
            user: user.to_owned(),
            name: name.to_owned(),
            visits,
        }
    }

    fn row(user: &str, name: &str, visits: i32) -> ProfileRow {
        ProfileRow {
            user: user.to_owned(),
            name: name.to_owned(),
            visits,
        }
    }

    fn harness() -> TestHarness<UserProfile> {
        TestHarness::new(TimeMode::None).unwrap()
    }

    #[test]
    fn sums_visits_and_keeps_the_latest_name() {
        let mut h = harness();
        let out = h
            .handle_input_rows("a", vec![visit("a", "Ann", 2), visit("a", "Anna", 3)])
            .unwrap();
        assert_eq!(out, vec![row("a", "Anna", 5)]);
        let out = h
            .handle_input_rows("a", vec![visit("a", "Anna", 1)])
            .unwrap();
        assert_eq!(out, vec![row("a", "Anna", 6)]);
        assert_eq!(
            h.value_state::<Profile>("profile", "a"),
            Some(Profile {
                name: "Anna".into(),
                visits: 6
            })
        );
    }

    #[test]
    fn users_are_isolated() {
        let mut h = harness();
        h.handle_input_rows("a", vec![visit("a", "Ann", 2)])
            .unwrap();
        let out = h
            .handle_input_rows("b", vec![visit("b", "Bob", 1)])
            .unwrap();
        assert_eq!(out, vec![row("b", "Bob", 1)]);
        assert_eq!(h.value_state::<Profile>("profile", "c"), None);
    }

    #[test]
    fn a_total_beyond_an_int_fails_the_call() {
        let mut h = harness();
        h.handle_input_rows("a", vec![visit("a", "Ann", i32::MAX)])
            .unwrap();
        let err = h
            .handle_input_rows("a", vec![visit("a", "Ann", 1)])
            .unwrap_err();
        assert!(err.to_string().contains("overflow an int"), "{err}");
        assert_eq!(
            h.value_state::<Profile>("profile", "a").map(|p| p.visits),
            Some(i32::MAX),
            "the failed call changed nothing"
        );
    }

    #[test]
    fn rows_must_match_the_input_shape() {
        let mut h = harness();
        let err = h
            .handle_input_json(
                "a",
                &[
                    r#"{"user":"a","name":"Ann","visits":1}"#,
                    r#"{"user":"a","name":"Ann","visits":3000000000}"#,
                ],
            )
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadInputRow { index: 1 });
    }

    #[test]
    fn takes_no_initial_state() {
        let mut h = harness();
        let err = h
            .handle_initial_state_json("a", r#"{"user":"a","name":"Ann","visits":1}"#)
            .unwrap_err();
        assert!(
            err.to_string().contains("does not accept initial state"),
            "{err}"
        );
    }
}
