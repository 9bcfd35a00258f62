//! Test guest: `plugins/user-profile-v1` with its `profile` variable declared as a list state
//! (same element schema, `name string, visits int`) instead of a value state. Restarting a
//! checkpoint of user-profile-v1 on it must be refused: a variable's kind cannot change
//! (SPEC §7).
//!
//! On a checkpoint of its own it works: each row `{"user", "name", "visits"}` is appended to
//! the user's list, and each call emits `{"user", "entries"}`, the list's length.

use serde::{Deserialize, Serialize};
use statebox_sdk::prelude::*;

/// One input row, and one list element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Visit {
    /// The user, also the grouping key.
    #[serde(skip_serializing, default)]
    pub user: String,
    /// The user's name.
    pub name: String,
    /// Visits reported.
    pub visits: i32,
}

/// The row emitted per call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entries {
    /// The user.
    pub user: String,
    /// Elements of the user's list.
    pub entries: i64,
}

/// The processor. See the [crate docs](crate).
pub struct ProfileKindChange {
    profile: ListState<Visit>,
}

impl StatefulProcessor for ProfileKindChange {
    type Input = Visit;
    type Output = Entries;
    type InitialState = NoInitialState;

    const NAME: &'static str = "profile-kind-change";
    const OUTPUT_SCHEMA: &'static str = "user string, entries long";

    fn init(handle: &mut Handle) -> Result<Self> {
        Ok(ProfileKindChange {
            profile: handle.list_state("profile", "name string, visits int")?,
        })
    }

    fn handle_input_rows(
        &mut self,
        _key: &Key,
        rows: Vec<Visit>,
        _timer_values: TimerValues,
        out: &mut Emitter<Entries>,
    ) -> Result<()> {
        let Some(user) = rows.first().map(|row| row.user.clone()) else {
            return Ok(());
        };
        self.profile.append_list(&rows)?;
        let entries = self.profile.get()?.count() as i64;
        out.emit(Entries { user, entries })
    }
}

statebox_sdk::export_processor!(ProfileKindChange);

#[cfg(test)]
mod tests {
    use statebox_sdk::testing::TestHarness;

    use super::*;

    #[test]
    fn appends_each_row() {
        let mut h = TestHarness::<ProfileKindChange>::new(TimeMode::None).unwrap();
        let visit = |visits| Visit {
            user: "a".into(),
            name: "Ann".into(),
            visits,
        };
        let out = h.handle_input_rows("a", vec![visit(1), visit(2)]).unwrap();
        assert_eq!(
            out,
            vec![Entries {
                user: "a".into(),
                entries: 2
            }]
        );
        assert_eq!(h.list_state::<Visit>("profile", "a").len(), 2);
    }
}
