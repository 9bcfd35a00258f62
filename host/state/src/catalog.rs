//! The catalog of a query's state variables: names, ids, kinds, schema histories and TTLs.
//!
//! Variables are declared by the processor's `init`. The catalog decides whether a
//! declaration reuses an existing variable, evolves its schema, or is refused (SPEC §7),
//! and it is persisted with every commit so a restart sees the same ids.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::VarId;
use serde::{Deserialize, Serialize};
use statebox_schema::Schema;

/// The three kinds of state variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VarKind {
    /// `ValueState`.
    Value,
    /// `ListState`.
    List,
    /// `MapState`.
    Map,
}

impl VarKind {
    /// The Spark-style name used in messages.
    pub fn describe(self) -> &'static str {
        match self {
            VarKind::Value => "value state",
            VarKind::List => "list state",
            VarKind::Map => "map state",
        }
    }
}

/// One variable as persisted in the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VarDef {
    /// Storage id; never reused, even after `delete-if-exists`.
    pub id: VarId,
    /// The name the processor declared.
    pub name: String,
    /// Value, list or map.
    pub kind: VarKind,
    /// The map's user key schema (DDL), for map state only. It can never change.
    pub key_schema: Option<String>,
    /// Every value schema (DDL) this variable was declared with, oldest first. A stored
    /// value records the index of the schema it was written with.
    pub value_schemas: Vec<String>,
    /// Time to live in milliseconds, if any.
    pub ttl_ms: Option<u64>,
}

/// A declared variable, resolved for fast use by the state imports.
#[derive(Debug)]
pub struct VarHandle {
    /// Storage id.
    pub id: VarId,
    /// The declared name.
    pub name: String,
    /// Value, list or map.
    pub kind: VarKind,
    /// The map's user key schema.
    pub key_schema: Option<Schema>,
    /// Every value schema, oldest first; the last one is current.
    pub value_schemas: Vec<Schema>,
    /// Time to live in milliseconds, if any.
    pub ttl_ms: Option<u64>,
}

impl VarHandle {
    /// Index of the current value schema, recorded in every value written now.
    pub fn schema_id(&self) -> u32 {
        (self.value_schemas.len() - 1) as u32
    }

    /// The current value schema.
    pub fn value_schema(&self) -> &Schema {
        self.value_schemas
            .last()
            .expect("a variable has at least one schema")
    }
}

/// Why a declaration was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeclareError {
    /// The schema text did not parse.
    #[error("state variable `{name}`: invalid {what} schema `{ddl}`: {reason}")]
    InvalidSchema {
        /// Variable name.
        name: String,
        /// "value" or "key".
        what: &'static str,
        /// The DDL given.
        ddl: String,
        /// The parser's message.
        reason: String,
    },
    /// The variable exists with another kind, key schema, or an incompatible value schema.
    #[error("{0}")]
    Incompatible(String),
}

/// All variables of one query, shared by the partitions' instances.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Catalog {
    vars: BTreeMap<String, VarDef>,
    next_id: VarId,
    /// Variables dropped by `delete-if-exists` and not yet committed.
    #[serde(skip)]
    dropped: Vec<VarId>,
    /// Names declared or deleted since this catalog was loaded. Every partition runs
    /// `init`, so a name another instance already handled this run must not be dropped
    /// again (it may already have been re-declared).
    #[serde(skip)]
    touched: BTreeSet<String>,
    #[serde(skip)]
    dirty: bool,
}

impl Catalog {
    /// Loads a persisted catalog.
    pub fn from_json(bytes: &[u8]) -> Result<Catalog, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Serialises the catalog for the checkpoint.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("catalog serialises")
    }

    /// Every variable, by name.
    pub fn vars(&self) -> impl Iterator<Item = &VarDef> {
        self.vars.values()
    }

    /// One variable by name.
    pub fn get(&self, name: &str) -> Option<&VarDef> {
        self.vars.get(name)
    }

    /// Whether anything changed since the last [`Catalog::take_changes`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Variables dropped by `delete-if-exists` whose data is not yet deleted by a commit.
    pub fn pending_drops(&self) -> &[VarId] {
        &self.dropped
    }

    /// Marks the pending changes committed: returns the dropped variables and clears the
    /// dirty flag. Call it once the drops and the serialised catalog are durable.
    pub fn take_changes(&mut self) -> Vec<VarId> {
        self.dirty = false;
        std::mem::take(&mut self.dropped)
    }

    /// Declares a variable, creating it, reusing it, or evolving its value schema.
    pub fn declare(
        &mut self,
        name: &str,
        kind: VarKind,
        key_ddl: Option<&str>,
        value_ddl: &str,
        ttl_ms: Option<u64>,
    ) -> Result<Arc<VarHandle>, DeclareError> {
        let parse = |what: &'static str, ddl: &str| {
            Schema::parse_ddl(ddl).map_err(|e| DeclareError::InvalidSchema {
                name: name.to_owned(),
                what,
                ddl: ddl.to_owned(),
                reason: e.to_string(),
            })
        };
        let value_schema = parse("value", value_ddl)?;
        let key_schema = key_ddl.map(|k| parse("key", k)).transpose()?;
        self.touched.insert(name.to_owned());

        let Some(def) = self.vars.get_mut(name) else {
            let def = VarDef {
                id: self.next_id,
                name: name.to_owned(),
                kind,
                key_schema: key_schema.as_ref().map(Schema::to_ddl),
                value_schemas: vec![value_schema.to_ddl()],
                ttl_ms,
            };
            self.next_id += 1;
            self.dirty = true;
            let handle = resolve(&def)?;
            self.vars.insert(name.to_owned(), def);
            return Ok(handle);
        };

        if def.kind != kind {
            return Err(DeclareError::Incompatible(format!(
                "state variable `{name}` is a {} in the checkpoint but is now declared as a {}; \
                 call delete-if-exists(\"{name}\") in init to drop the old data first",
                def.kind.describe(),
                kind.describe()
            )));
        }
        let new_key = key_schema.as_ref().map(Schema::to_ddl);
        if def.key_schema != new_key {
            return Err(DeclareError::Incompatible(format!(
                "the user key schema of map state `{name}` cannot change: checkpoint has `{}`, \
                 processor declares `{}`",
                def.key_schema.as_deref().unwrap_or(""),
                new_key.as_deref().unwrap_or("")
            )));
        }
        if def.ttl_ms.is_none() && ttl_ms.is_some() {
            return Err(DeclareError::Incompatible(format!(
                "state variable `{name}` was created without TTL; adding a TTL to existing state \
                 is not supported (declare a new variable instead)"
            )));
        }
        if def.ttl_ms != ttl_ms {
            def.ttl_ms = ttl_ms;
            self.dirty = true;
        }
        let new_ddl = value_schema.to_ddl();
        if def.value_schemas.last() != Some(&new_ddl) {
            for old_ddl in &def.value_schemas {
                let old = Schema::parse_ddl(old_ddl).map_err(|e| {
                    DeclareError::Incompatible(format!(
                        "stored schema `{old_ddl}` of `{name}` does not parse: {e}"
                    ))
                })?;
                statebox_schema::check_evolution(&old, &value_schema).map_err(|e| {
                    DeclareError::Incompatible(format!(
                        "state variable `{name}`: new schema `{new_ddl}` is incompatible with \
                         earlier schema `{old_ddl}`: {e}"
                    ))
                })?;
            }
            def.value_schemas.push(new_ddl);
            self.dirty = true;
        }
        resolve(def)
    }

    /// Drops a variable's data for all keys, unless another instance already declared or
    /// dropped this name during the current run.
    pub fn delete_if_exists(&mut self, name: &str) {
        if !self.touched.insert(name.to_owned()) {
            return;
        }
        if let Some(def) = self.vars.remove(name) {
            self.dropped.push(def.id);
            self.dirty = true;
        }
    }
}

fn resolve(def: &VarDef) -> Result<Arc<VarHandle>, DeclareError> {
    let parse = |ddl: &str| {
        Schema::parse_ddl(ddl).map_err(|e| {
            DeclareError::Incompatible(format!(
                "stored schema `{ddl}` of `{}` does not parse: {e}",
                def.name
            ))
        })
    };
    Ok(Arc::new(VarHandle {
        id: def.id,
        name: def.name.clone(),
        kind: def.kind,
        key_schema: def.key_schema.as_deref().map(parse).transpose()?,
        value_schemas: def
            .value_schemas
            .iter()
            .map(|d| parse(d))
            .collect::<Result<_, _>>()?,
        ttl_ms: def.ttl_ms,
    }))
}

/// One thing a processor's `init` did, recorded in describe mode.
#[derive(Clone, Debug, PartialEq)]
pub enum InitOp {
    /// A state variable declaration.
    Declare(Declaration),
    /// `delete-if-exists(name)`.
    Delete(String),
}

/// A state variable as a processor declares it.
#[derive(Clone, Debug, PartialEq)]
pub struct Declaration {
    /// Variable name.
    pub name: String,
    /// Value, list or map.
    pub kind: VarKind,
    /// The map's user key schema (DDL).
    pub key_schema: Option<String>,
    /// The value schema (DDL).
    pub value_schema: String,
    /// Time to live, if any.
    pub ttl_ms: Option<u64>,
}

/// What an upgrade would do to one variable.
#[derive(Clone, Debug, PartialEq)]
pub enum VarStatus {
    /// Declared exactly as before.
    Unchanged,
    /// Declared with a compatible new value schema; old values are converted when read.
    Evolved {
        /// The current schema in the checkpoint.
        from: String,
        /// The schema the new processor declares.
        to: String,
    },
    /// New variable.
    Added,
    /// Dropped by `delete-if-exists` in the new processor's `init`.
    Deleted,
    /// No longer declared; its data stays until a processor deletes it.
    Dropped,
    /// Refused, with the reason (naming the variable and both schemas).
    Incompatible(String),
}

/// What a processor's `init` did in describe mode, run against a trial copy of a catalog:
/// every operation with the outcome the processor saw, and how `init` ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Described {
    /// Declarations and deletions in call order, each with its outcome.
    pub ops: Vec<(InitOp, Result<(), String>)>,
    /// Why `init` failed, if it did.
    pub init_error: Option<String>,
}

/// Per-variable verdicts of upgrading a checkpoint's state to a new processor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpgradeReport {
    /// Variables by name, in declaration order, then dropped ones.
    pub vars: Vec<(String, VarStatus)>,
    /// Why the new processor's `init` failed on this checkpoint, if it did.
    pub init_error: Option<String>,
}

impl UpgradeReport {
    /// Whether the upgrade can proceed: the new processor's `init` succeeds against the
    /// checkpoint's catalog. (A processor may handle a refused declaration itself.)
    pub fn is_compatible(&self) -> bool {
        self.init_error.is_none()
    }
}

impl std::fmt::Display for UpgradeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, status) in &self.vars {
            match status {
                VarStatus::Unchanged => writeln!(f, "  {name}: compatible (unchanged)")?,
                VarStatus::Evolved { from, to } => writeln!(
                    f,
                    "  {name}: compatible (schema evolves from `{from}` to `{to}`)"
                )?,
                VarStatus::Added => writeln!(f, "  {name}: added")?,
                VarStatus::Deleted => writeln!(f, "  {name}: deleted by delete-if-exists")?,
                VarStatus::Dropped => writeln!(
                    f,
                    "  {name}: dropped (no longer declared; its data is kept until delete-if-exists)"
                )?,
                VarStatus::Incompatible(why) => writeln!(f, "  {name}: incompatible: {why}")?,
            }
        }
        if let Some(e) = &self.init_error {
            // A refused declaration usually is why init failed: say so once, on its line.
            let refused = self.vars.iter().any(
                |(_, status)| matches!(status, VarStatus::Incompatible(why) if e.contains(why)),
            );
            if refused {
                writeln!(
                    f,
                    "  init fails on this checkpoint at the refusal above; variables it would \
                     declare after that are not checked"
                )?;
            } else {
                writeln!(f, "  init fails on this checkpoint: {e}")?;
            }
        }
        Ok(())
    }
}

impl Catalog {
    /// A copy of the variables to run a new processor's `init` against in describe mode,
    /// so that it meets exactly the refusals a real run would, without changing anything.
    pub fn trial(&self) -> Catalog {
        Catalog {
            vars: self.vars.clone(),
            next_id: self.next_id,
            ..Catalog::default()
        }
    }

    /// Judges what a new processor's `init`, run in describe mode against
    /// [`Catalog::trial`], would do to this catalog.
    pub fn check(&self, described: &Described) -> UpgradeReport {
        let mut report = UpgradeReport {
            vars: Vec::new(),
            init_error: described.init_error.clone(),
        };
        let mut seen = BTreeSet::new();
        for (op, outcome) in &described.ops {
            match (op, outcome) {
                (InitOp::Delete(name), _) => {
                    if self.get(name).is_some() && seen.insert(name.clone()) {
                        report.vars.push((name.clone(), VarStatus::Deleted));
                    }
                }
                (InitOp::Declare(d), Err(why)) => {
                    seen.insert(d.name.clone());
                    report
                        .vars
                        .push((d.name.clone(), VarStatus::Incompatible(why.clone())));
                }
                (InitOp::Declare(d), Ok(())) => {
                    seen.insert(d.name.clone());
                    let new = Schema::parse_ddl(&d.value_schema)
                        .map(|s| s.to_ddl())
                        .unwrap_or_else(|_| d.value_schema.clone());
                    let status = match self.get(&d.name).and_then(|v| v.value_schemas.last()) {
                        None => VarStatus::Added,
                        Some(old) if *old == new => VarStatus::Unchanged,
                        Some(old) => VarStatus::Evolved {
                            from: old.clone(),
                            to: new,
                        },
                    };
                    report.vars.push((d.name.clone(), status));
                }
            }
        }
        for name in self.vars.keys().filter(|n| !seen.contains(*n)) {
            report.vars.push((name.clone(), VarStatus::Dropped));
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declaration(name: &str, kind: VarKind, value: &str) -> Declaration {
        Declaration {
            name: name.into(),
            kind,
            key_schema: (kind == VarKind::Map).then(|| "string".into()),
            value_schema: value.into(),
            ttl_ms: None,
        }
    }

    /// Runs declarations against a trial catalog the way describe mode does: an init that
    /// stops at its first refused declaration, like a processor using `?`.
    fn describe(catalog: &Catalog, decls: &[InitOp]) -> Described {
        let mut trial = catalog.trial();
        let mut described = Described::default();
        for op in decls {
            let outcome = match op {
                InitOp::Declare(d) => trial
                    .declare(
                        &d.name,
                        d.kind,
                        d.key_schema.as_deref(),
                        &d.value_schema,
                        d.ttl_ms,
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                InitOp::Delete(n) => {
                    trial.delete_if_exists(n);
                    Ok(())
                }
            };
            let failed = outcome.clone().err();
            described.ops.push((op.clone(), outcome));
            if let Some(e) = failed {
                described.init_error = Some(e);
                break;
            }
        }
        described
    }

    fn catalog(decls: &[Declaration]) -> Catalog {
        let mut c = Catalog::default();
        for d in decls {
            c.declare(
                &d.name,
                d.kind,
                d.key_schema.as_deref(),
                &d.value_schema,
                d.ttl_ms,
            )
            .unwrap();
        }
        c
    }

    #[test]
    fn check_reports_every_kind_of_change() {
        let v1 = catalog(&[
            declaration("profile", VarKind::Value, "name string, visits int"),
            declaration("old", VarKind::List, "long"),
            declaration("gone", VarKind::Value, "long"),
            declaration("kind", VarKind::Value, "long"),
        ]);
        let described = describe(
            &v1,
            &[
                InitOp::Declare(declaration(
                    "profile",
                    VarKind::Value,
                    "name string, visits long, email string",
                )),
                InitOp::Declare(declaration("history", VarKind::Map, "long")),
                InitOp::Delete("gone".into()),
                InitOp::Declare(declaration("kind", VarKind::List, "long")),
            ],
        );
        let report = v1.check(&described);
        let status = |n: &str| {
            report
                .vars
                .iter()
                .find(|(m, _)| m == n)
                .map(|(_, s)| s.clone())
        };
        assert!(matches!(status("profile"), Some(VarStatus::Evolved { .. })));
        assert_eq!(status("history"), Some(VarStatus::Added));
        assert_eq!(status("gone"), Some(VarStatus::Deleted));
        assert_eq!(status("old"), Some(VarStatus::Dropped));
        match status("kind") {
            Some(VarStatus::Incompatible(why)) => assert!(why.contains("value state"), "{why}"),
            other => panic!("expected incompatible, got {other:?}"),
        }
        assert!(!report.is_compatible());
        assert!(v1.get("gone").is_some(), "checking changes nothing");
    }

    #[test]
    fn an_incompatibility_with_any_earlier_schema_is_refused() {
        let mut c = catalog(&[declaration("p", VarKind::Value, "name string, visits int")]);
        c.declare("p", VarKind::Value, None, "visits long", None)
            .unwrap();
        let described = describe(
            &c,
            &[InitOp::Declare(declaration(
                "p",
                VarKind::Value,
                "visits long, name long",
            ))],
        );
        let report = c.check(&described);
        match &report.vars[0].1 {
            VarStatus::Incompatible(why) => {
                assert!(why.contains("name string, visits int"), "{why}");
                assert!(why.contains("visits long, name long"), "{why}");
            }
            other => panic!("expected incompatible, got {other:?}"),
        }
        assert!(!report.is_compatible());
    }

    #[test]
    fn a_refusal_that_fails_init_is_reported_once() {
        let why = "state variable `p` is a value in the checkpoint but is now declared as a list";
        let report = UpgradeReport {
            vars: vec![
                ("a".into(), VarStatus::Unchanged),
                ("p".into(), VarStatus::Incompatible(why.into())),
            ],
            init_error: Some(format!("init failed: {why}")),
        };
        let text = report.to_string();
        assert_eq!(text.matches(why).count(), 1, "{text}");
        assert!(text.contains("at the refusal above"), "{text}");

        // An init failure of its own is printed in full.
        let report = UpgradeReport {
            vars: vec![("a".into(), VarStatus::Unchanged)],
            init_error: Some("init failed: boom".into()),
        };
        assert!(
            report
                .to_string()
                .contains("init fails on this checkpoint: init failed: boom")
        );
    }
}
