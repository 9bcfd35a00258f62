//! A user profile, version 3: compatible with version 2, but not with version 1 (SPEC §7).
//! See the README for the whole chain.
//!
//! Version 2 plus a structured `name`, derived from `display_name` (split at the first
//! space). Grouped by `user`; input rows are
//! `{"user": string, "name": string?, "email": string?, "visits": long}`. Per user it keeps:
//!
//! | variable | kind | schema | holds |
//! |---|---|---|---|
//! | `profile` | value | `display_name string, email string, visits long, name struct<first: string, last: string>` | the latest name (also split) and email, the visits so far |
//! | `history` | list | `long` | the visits of the latest updates, oldest first, at most [`HISTORY_LEN`] |
//!
//! Against version 2's `profile` (`display_name string, email string, visits long`) the only
//! change is the added nullable field `name`: allowed, and profiles written by version 2 read
//! it as null until the user's next update fills it in from `display_name`.
//!
//! Against version 1's `profile` (`name string, visits int`) the same field is a type change:
//! `name` was a string there, and a profile version 1 wrote and nobody rewrote since still
//! holds one. So the host refuses version 3 on any checkpoint whose `profile` ever had
//! version 1's schema, even one upgraded to version 2 in between: schemas must be compatible
//! with every earlier schema of the variable, not only the latest.
//!
//! Each call emits the profile once, `{"user", "display_name", "email", "visits", "history",
//! "status": "active", "name"}`. Initial state and inactivity timers work as in version 2.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The schema of the `profile` value state.
pub const PROFILE_SCHEMA: &str =
    "display_name string, email string, visits long, name struct<first: string, last: string>";
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

/// A name split into its parts; schema `struct<first: string, last: string>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FullName {
    /// Everything before the first space.
    pub first: Option<String>,
    /// Everything after the first space; null for a name without one.
    pub last: Option<String>,
}

impl FullName {
    /// Splits a display name at its first space.
    pub fn split(display_name: &str) -> FullName {
        match display_name.split_once(' ') {
            Some((first, last)) => FullName {
                first: Some(first.to_owned()),
                last: Some(last.to_owned()),
            },
            None => FullName {
                first: Some(display_name.to_owned()),
                last: None,
            },
        }
    }
}

/// The `profile` value state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    /// The user's latest name, if known.
    pub display_name: Option<String>,
    /// The user's latest email, if any.
    pub email: Option<String>,
    /// Visits over all updates.
    pub visits: i64,
    /// `display_name` split; null for profiles of version 2 until the user's next update.
    pub name: Option<FullName>,
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
        self.name = self.display_name.as_deref().map(FullName::split);
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
    /// The user's name split, if known.
    pub name: Option<FullName>,
}

/// The user-profile processor, version 3. See the [crate docs](crate).
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
            name: profile.name,
        })
    }
}

impl StatefulProcessor for UserProfile {
    type Input = Visit;
    type Output = ProfileRow;
    type InitialState = Seed;

    const NAME: &'static str = "user-profile-v3";
    const OUTPUT_SCHEMA: &'static str = "user string, display_name string, email string, \
                                         visits long, history array<long>, status string, \
                                         name struct<first: string, last: string>";

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

    fn full(first: &str, last: Option<&str>) -> Option<FullName> {
        Some(FullName {
            first: Some(first.to_owned()),
            last: last.map(str::to_owned),
        })
    }

    fn harness(time_mode: TimeMode) -> TestHarness<UserProfile> {
        TestHarness::new(time_mode).unwrap()
    }

    #[test]
    fn splits_the_display_name() {
        let mut h = harness(TimeMode::None);
        let out = h
            .handle_input_rows("a", vec![visit(Some("Ann Lee Smith"), Some("ann@x"), 2)])
            .unwrap();
        assert_eq!(
            out,
            vec![ProfileRow {
                user: "a".into(),
                display_name: Some("Ann Lee Smith".into()),
                email: Some("ann@x".into()),
                visits: 2,
                history: vec![2],
                status: "active".into(),
                name: full("Ann", Some("Lee Smith")),
            }]
        );
        let out = h
            .handle_input_rows("b", vec![visit(Some("Bob"), None, 1)])
            .unwrap();
        assert_eq!(out[0].name, full("Bob", None));
        let out = h
            .handle_input_rows("c", vec![visit(None, None, 1)])
            .unwrap();
        assert_eq!(out[0].name, None, "no display name, no name");
    }

    #[test]
    fn fills_in_the_name_of_a_version_2_profile_on_its_next_update() {
        // What the host hands over for a value version 2 stored as
        // {"display_name":"Ann Lee","email":null,"visits":4}: the added `name` reads as null.
        let evolved: Profile = serde_json::from_str(
            r#"{"display_name":"Ann Lee","email":null,"visits":4,"name":null}"#,
        )
        .unwrap();
        assert_eq!(evolved.name, None);
        let mut h = harness(TimeMode::None);
        h.handle_initial_state_json("a", r#"{"name":"Ann Lee","visits":4}"#)
            .unwrap();
        let out = h
            .handle_input_rows("a", vec![visit(None, None, 1)])
            .unwrap();
        assert_eq!(out[0].name, full("Ann", Some("Lee")));
        assert_eq!(out[0].visits, 5);
        assert_eq!(
            h.value_state::<Profile>("profile", "a").unwrap().name,
            full("Ann", Some("Lee"))
        );
    }

    #[test]
    fn an_inactive_user_is_reported_once_its_timer_fires() {
        let mut h = harness(TimeMode::ProcessingTime);
        h.set_processing_time(1_000);
        h.handle_initial_state("b", visit(Some("Bob Ray"), None, 2))
            .unwrap();
        h.set_processing_time(61_000);
        let fired = h.fire_expired_timers().unwrap();
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].status, "inactive");
        assert_eq!(fired[0].name, full("Bob", Some("Ray")));
    }
}
