//! Checking a new processor against an existing checkpoint before it touches state
//! (SPEC §7): its declarations, learned in describe mode, against every variable's schema
//! history, plus the output schema.

use std::fmt;
use std::path::Path;

use statebox_state::catalog::{Catalog, UpgradeReport};

use crate::{EngineError, ProcessorFactory, QueryConfig, StateReader};

/// The verdict on running a processor over a checkpoint.
#[derive(Clone, Debug)]
pub struct UpgradeCheck {
    /// Per-variable verdicts.
    pub report: UpgradeReport,
    /// The output schema in the checkpoint and the processor's, when they differ.
    pub output_schema_change: Option<(String, String)>,
}

impl UpgradeCheck {
    /// Whether `statebox run` would accept the processor.
    pub fn is_compatible(&self) -> bool {
        self.report.is_compatible()
    }
}

impl fmt::Display for UpgradeCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "state variables:")?;
        if self.report.vars.is_empty() {
            writeln!(f, "  (none)")?;
        }
        write!(f, "{}", self.report)?;
        match &self.output_schema_change {
            None => writeln!(f, "output schema: unchanged"),
            Some((old, new)) => writeln!(f, "output schema: changed from `{old}` to `{new}`"),
        }
    }
}

/// Checks `factory`'s processor against the checkpoint in `dir`, read-only (works while a
/// pipeline runs on it).
pub fn check_upgrade(
    dir: &Path,
    factory: &dyn ProcessorFactory,
) -> Result<UpgradeCheck, EngineError> {
    let reader = StateReader::open(dir)?;
    check_against(reader.config(), reader.catalog(), factory)
}

/// Checks a processor against a loaded query record and catalog.
pub(crate) fn check_against(
    config: &QueryConfig,
    catalog: &Catalog,
    factory: &dyn ProcessorFactory,
) -> Result<UpgradeCheck, EngineError> {
    let described = factory.describe_init(config.time_mode, catalog)?;
    let new_output = factory.info().output_schema.to_ddl();
    let output_schema_change = config
        .output_schema
        .as_ref()
        .filter(|old| **old != new_output)
        .map(|old| (old.clone(), new_output));
    Ok(UpgradeCheck {
        report: catalog.check(&described),
        output_schema_change,
    })
}
