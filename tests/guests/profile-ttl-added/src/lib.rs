//! Test guest: `plugins/user-profile-v1` with a TTL of one hour added to its `profile` value
//! state (same schema, `name string, visits int`). Restarting a checkpoint of
//! user-profile-v1 on it must be refused: TTL cannot be added to a variable created without
//! one (SPEC §7, issue 4).
//!
//! On a checkpoint of its own (processing-time or event-time mode, as TTL needs) it behaves
//! like user-profile-v1: rows `{"user", "name", "visits"}`, one `{"user", "name", "visits"}`
//! row emitted per call.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// The TTL of `profile`.
pub const PROFILE_TTL: Duration = Duration::from_secs(3600);

/// One input row, and the row emitted per call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visit {
    /// The user, also the grouping key.
    pub user: String,
    /// The user's latest name.
    pub name: String,
    /// Visits: reported in a row, over all rows in the output.
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

/// The processor. See the [crate docs](crate).
pub struct ProfileTtlAdded {
    profile: ValueState<Profile>,
}

impl StatefulProcessor for ProfileTtlAdded {
    type Input = Visit;
    type Output = Visit;
    type InitialState = NoInitialState;

    const NAME: &'static str = "profile-ttl-added";
    const OUTPUT_SCHEMA: &'static str = "user string, name string, visits int";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(ProfileTtlAdded {
            profile: handle.value_state_with_ttl(
                "profile",
                "name string, visits int",
                PROFILE_TTL,
            )?,
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Visit>,
        _timer_values: TimerValues,
        out: &mut Emitter<Visit>,
    ) -> Result<()> {
        let Some(user) = rows.first().map(|row| row.user.clone()) else {
            return Ok(());
        };
        let mut profile = self.profile.get()?.unwrap_or(Profile {
            name: String::new(),
            visits: 0,
        });
        for row in rows {
            profile.name = row.name;
            profile.visits = profile.visits.saturating_add(row.visits);
        }
        self.profile.update(&profile)?;
        out.emit(Visit {
            user,
            name: profile.name,
            visits: profile.visits,
        })
    }
}

statebox_sdk::export_processor!(ProfileTtlAdded);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    #[test]
    fn profile_expires_an_hour_after_its_update() {
        let mut h = TestHarness::<ProfileTtlAdded>::new(TimeMode::ProcessingTime).unwrap();
        let visit = |visits| Visit {
            user: "a".into(),
            name: "Ann".into(),
            visits,
        };
        h.handle_input_rows("a", vec![visit(1)]).unwrap();
        h.set_processing_time(3_599_999);
        assert_eq!(
            h.handle_input_rows("a", vec![visit(1)]).unwrap()[0].visits,
            2
        );
        h.set_processing_time(3_599_999 + 3_600_000);
        assert_eq!(
            h.handle_input_rows("a", vec![visit(1)]).unwrap()[0].visits,
            1
        );
    }
}
