//! A user profile, version 2: evolves version 1's state over the same checkpoint (SPEC §7)
//! and takes initial state (SPEC §8). See the README for the whole chain.
//!
//! Grouped by `user`; input rows are
//! `{"user": string, "name": string?, "email": string?, "visits": long}`: each row reports
//! the user's current name and email (when known) and some new visits. Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `profile` | value | `display_name string, email string, visits long` | the latest name and email, the visits so far |
//! | `history` | list | `long` | the visits of the latest updates, oldest first, at most [`HISTORY_LEN`] |
//!
//! Against version 1's `profile` (`name string, visits int`) this renames `name` to
//! `display_name` (a rename is a removal plus an added field, so profiles written by version 1
//! read `display_name` as null until the user's next named row), adds the nullable `email`
//! (null in old profiles) and widens `visits` from int to long. `history` is a new variable:
//! empty for users of version 1 until their first update.
//!
//! Each call emits the profile once, `{"user", "display_name", "email", "visits", "history",
//! "status": "active"}`. An update is one call of `handle_input_rows` (its rows' visits
//! summed) or one initial-state row.
//!
//! **Initial state** rows look like input rows (`name`, `email` and `visits` optional): each
//! is applied as one update, so several rows of a user add up.
//!
//! **Inactivity** (processing-time mode only): every update re-arms one timer per user,
//! [`INACTIVE_AFTER_MS`] after the batch timestamp; when it fires the processor emits the
//! profile with `"status": "inactive"`. In other time modes it uses no timers.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The schema of the `profile` value state.
pub const PROFILE_SCHEMA: &str = "display_name string, email string, visits long";
/// The element schema of the `history` list state.
pub const HISTORY_SCHEMA: &str = "long";
/// How many updates `history` remembers.
pub const HISTORY_LEN: usize = 5;
/// How long after a user's latest update the user counts as inactive (processing time).
pub const INACTIVE_AFTER_MS: i64 = 60_000;

/// One input row. Without `name` or `email` the stored ones stay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visit {
    /// The user's current name.
    pub name: Option<String>,
    /// The user's current email.
    pub email: Option<String>,
    /// Visits since the last report.
    #[serde(default)]
    pub visits: i64,
}

/// One initial-state row: the same shape as an input row.
pub type Seed = Visit;

/// The `profile` value state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// The user's latest name; null for profiles of version 1 until the next named row.
    pub display_name: Option<String>,
    /// The user's latest email, if any.
    pub email: Option<String>,
    /// Visits over all updates.
    pub visits: i64,
}

impl Profile {
    /// Applies one row.
    fn apply(&mut self, key: &Key, row: Visit) -> Result<()> {
        if row.name.is_some() {
            self.display_name = row.name;
        }
        if row.email.is_some() {
            self.email = row.email;
        }
        self.visits = match self.visits.checked_add(row.visits) {
            Some(visits) => visits,
            None => statebox_sdk::bail!(
                "user {}: {} + {} visits overflow a long",
                key.as_str().unwrap_or(key.json()),
                self.visits,
                row.visits
            ),
        };
        Ok(())
    }
}

/// The row emitted per update and per inactivity timer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileRow {
    /// The user.
    pub user: String,
    /// The user's latest name, if known.
    pub display_name: Option<String>,
    /// The user's latest email, if known.
    pub email: Option<String>,
    /// The user's visits over all batches.
    pub visits: i64,
    /// The visits of the user's latest updates, oldest first.
    pub history: Vec<i64>,
    /// `active` after an update, `inactive` when the inactivity timer fired.
    pub status: String,
}

/// The user-profile processor, version 2. See the [crate docs](crate).
pub struct UserProfile {
    profile: ValueState<Profile>,
    history: ListState<i64>,
    timers: Timers,
    /// Whether the query runs in processing-time mode, where inactivity timers apply.
    timed: bool,
}

/// The user of a call: the key's only column.
fn user(key: &Key) -> Result<String> {
    match key.as_str() {
        Some(user) => Ok(user.to_owned()),
        None => statebox_sdk::bail!(
            "user-profile is keyed by one string column, `user`; got key {}",
            key.json()
        ),
    }
}

impl UserProfile {
    /// Applies rows as one update: stores the profile, records the update's visits in the
    /// history and re-arms the inactivity timer. Returns the profile and the history.
    fn update(
        &self,
        key: &Key,
        rows: Vec<Visit>,
        timer_values: TimerValues,
    ) -> Result<(Profile, Vec<i64>)> {
        let mut profile = self.profile.get()?.unwrap_or_default();
        let mut added = 0i64;
        for row in rows {
            added = added.saturating_add(row.visits);
            profile.apply(key, row)?;
        }
        self.profile.update(&profile)?;
        let mut history = self.history.get()?.collect::<Result<Vec<i64>>>()?;
        history.push(added);
        let keep = history.len().saturating_sub(HISTORY_LEN);
        history.drain(..keep);
        self.history.put(&history)?;
        if self.timed {
            for at in self.timers.list()? {
                self.timers.delete(at)?;
            }
            self.timers
                .register(timer_values.current_processing_time_ms() + INACTIVE_AFTER_MS)?;
        }
        Ok((profile, history))
    }

    fn row(key: &Key, profile: Profile, history: Vec<i64>, status: &str) -> Result<ProfileRow> {
        Ok(ProfileRow {
            user: user(key)?,
            display_name: profile.display_name,
            email: profile.email,
            visits: profile.visits,
            history,
            status: status.to_owned(),
        })
    }
}

impl StatefulProcessor for UserProfile {
    type Input = Visit;
    type Output = ProfileRow;
    type InitialState = Seed;

    const NAME: &'static str = "user-profile-v2";
    const OUTPUT_SCHEMA: &'static str = "user string, display_name string, email string, \
                                         visits long, history array<long>, status string";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(UserProfile {
            profile: handle.value_state("profile", PROFILE_SCHEMA)?,
            history: handle.list_state("history", HISTORY_SCHEMA)?,
            timers: handle.timers(),
            timed: handle.time_mode() == TimeMode::ProcessingTime,
        })
    }

    fn handle_input_rows(
        &mut self,
        key: &Key,
        rows: Vec<Visit>,
        timer_values: TimerValues,
        out: &mut Emitter<ProfileRow>,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (profile, history) = self.update(key, rows, timer_values)?;
        out.emit(Self::row(key, profile, history, "active")?)
    }

    fn handle_expired_timer(
        &mut self,
        key: &Key,
        _timer_values: TimerValues,
        _info: ExpiredTimerInfo,
        out: &mut Emitter<ProfileRow>,
    ) -> Result<()> {
        let Some(profile) = self.profile.get()? else {
            return Ok(());
        };
        let history = self.history.get()?.collect::<Result<Vec<i64>>>()?;
        out.emit(Self::row(key, profile, history, "inactive")?)
    }

    fn handle_initial_state(
        &mut self,
        key: &Key,
        row: Seed,
        timer_values: TimerValues,
    ) -> Result<()> {
        self.update(key, vec![row], timer_values).map(drop)
    }
}

statebox_sdk::export_processor!(UserProfile);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    fn visit(name: Option<&str>, email: Option<&str>, visits: i64) -> Visit {
        Visit {
            name: name.map(str::to_owned),
            email: email.map(str::to_owned),
            visits,
        }
    }

    fn row(
        user: &str,
        name: Option<&str>,
        email: Option<&str>,
        visits: i64,
        history: &[i64],
        status: &str,
    ) -> ProfileRow {
        ProfileRow {
            user: user.to_owned(),
            display_name: name.map(str::to_owned),
            email: email.map(str::to_owned),
            visits,
            history: history.to_vec(),
            status: status.to_owned(),
        }
    }

    fn harness(time_mode: TimeMode) -> TestHarness<UserProfile> {
        TestHarness::new(time_mode).unwrap()
    }

    #[test]
    fn sums_visits_and_keeps_the_latest_name_and_email() {
        let mut h = harness(TimeMode::None);
        let out = h
            .handle_input_rows(
                "a",
                vec![
                    visit(Some("Ann"), Some("ann@x"), 2),
                    visit(Some("Anna"), None, 3),
                ],
            )
            .unwrap();
        assert_eq!(
            out,
            vec![row("a", Some("Anna"), Some("ann@x"), 5, &[5], "active")]
        );
        let out = h
            .handle_input_rows("a", vec![visit(None, None, 3_000_000_000)])
            .unwrap();
        assert_eq!(
            out,
            vec![row(
                "a",
                Some("Anna"),
                Some("ann@x"),
                3_000_000_005,
                &[5, 3_000_000_000],
                "active"
            )]
        );
        assert!(
            h.timers("a").is_empty(),
            "no timers outside processing time"
        );
    }

    #[test]
    fn reads_a_profile_of_version_1_as_the_host_evolves_it() {
        // What the host hands over for a value version 1 stored as {"name":"Ann","visits":4}:
        // `name` removed, `display_name` and `email` added as null, `visits` widened.
        let evolved: Profile =
            serde_json::from_str(r#"{"display_name":null,"email":null,"visits":4}"#).unwrap();
        assert_eq!(
            evolved,
            Profile {
                display_name: None,
                email: None,
                visits: 4
            }
        );
    }

    #[test]
    fn history_keeps_the_latest_updates() {
        let mut h = harness(TimeMode::None);
        for visits in 1..=7 {
            h.handle_input_rows("a", vec![visit(None, None, visits), visit(None, None, 10)])
                .unwrap();
        }
        assert_eq!(
            h.list_state::<i64>("history", "a"),
            vec![13, 14, 15, 16, 17]
        );
        assert_eq!(h.value_state::<Profile>("profile", "a").unwrap().visits, 98);
    }

    #[test]
    fn each_initial_state_row_is_one_update() {
        let mut h = harness(TimeMode::None);
        h.handle_initial_state_json("a", r#"{"user":"a","name":"Ann","visits":4}"#)
            .unwrap();
        h.handle_initial_state_json("a", r#"{"user":"a","email":"ann@x","visits":6}"#)
            .unwrap();
        h.handle_initial_state_json("b", r#"{"user":"b","name":"Bob"}"#)
            .unwrap();
        assert_eq!(
            h.value_state::<Profile>("profile", "a"),
            Some(Profile {
                display_name: Some("Ann".into()),
                email: Some("ann@x".into()),
                visits: 10
            })
        );
        assert_eq!(h.list_state::<i64>("history", "a"), vec![4, 6]);
        let out = h
            .handle_input_rows("a", vec![visit(None, None, 1)])
            .unwrap();
        assert_eq!(
            out,
            vec![row(
                "a",
                Some("Ann"),
                Some("ann@x"),
                11,
                &[4, 6, 1],
                "active"
            )]
        );
        assert_eq!(h.list_state::<i64>("history", "b"), vec![0]);
    }

    #[test]
    fn an_inactive_user_is_reported_once_its_timer_fires() {
        let mut h = harness(TimeMode::ProcessingTime);
        h.set_processing_time(1_000);
        h.handle_initial_state("b", visit(Some("Bob"), None, 2))
            .unwrap();
        h.handle_input_rows("a", vec![visit(Some("Ann"), None, 1)])
            .unwrap();
        assert_eq!(h.timers("b"), vec![61_000]);
        h.set_processing_time(30_000);
        // A later update re-arms the timer instead of adding one.
        h.handle_input_rows("a", vec![visit(None, None, 1)])
            .unwrap();
        assert_eq!(h.timers("a"), vec![90_000]);
        h.set_processing_time(61_000);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![row("b", Some("Bob"), None, 2, &[2], "inactive")]
        );
        h.set_processing_time(90_000);
        assert_eq!(
            h.fire_expired_timers().unwrap(),
            vec![row("a", Some("Ann"), None, 2, &[1, 1], "inactive")]
        );
        assert!(h.timers("a").is_empty());
    }

    #[test]
    fn a_total_beyond_a_long_fails_the_call() {
        let mut h = harness(TimeMode::None);
        h.handle_input_rows("a", vec![visit(None, None, i64::MAX)])
            .unwrap();
        let err = h
            .handle_input_rows("a", vec![visit(None, None, 1)])
            .unwrap_err();
        assert!(err.to_string().contains("overflow a long"), "{err}");
    }
}
