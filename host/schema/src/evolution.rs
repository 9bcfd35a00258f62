//! Schema evolution for state values (SPEC §7): which changes are allowed, and rewriting
//! values written under an old schema into the new one.

use std::fmt;

use crate::types::{DataType, Schema};
use crate::value::{self, Strictness, ValueError};

/// A schema change that would make existing values unreadable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct EvolutionError {
    /// The field whose type changed, e.g. `address.zip`, `tags.element` or `counts.value`;
    /// empty for the value as a whole.
    pub path: String,
    /// What changed and why it is not allowed.
    pub message: String,
    /// The whole old schema, as DDL.
    pub old_schema: String,
    /// The whole new schema, as DDL.
    pub new_schema: String,
}

impl fmt::Display for EvolutionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.path.is_empty() {
            write!(f, "field `{}`: ", self.path)?;
        }
        write!(
            f,
            "{} (old schema: `{}`; new schema: `{}`)",
            self.message, self.old_schema, self.new_schema
        )
    }
}

/// Checks that values written with `old` can be read through `new`.
///
/// Struct fields are matched by name, so reordering is free. Added fields must be nullable
/// (old values read them as null); removed fields are dropped. Numbers may widen: int→long,
/// int→double, long→double, float→double. The same rules apply inside nested structs,
/// array elements and map values; map key types must not change at all, and neither may
/// any other type. Nullability may be relaxed but not tightened.
pub fn check_evolution(old: &Schema, new: &Schema) -> Result<(), EvolutionError> {
    let mut path = Vec::new();
    check(old.root(), new.root(), &mut path).map_err(|message| EvolutionError {
        path: path.join("."),
        message,
        old_schema: old.to_ddl(),
        new_schema: new.to_ddl(),
    })
}

/// Converts a JSON value written with `old` into the canonical encoding of `new`: removed
/// fields are dropped, missing fields become null, and numbers widen (`5` stays `5` for
/// long and becomes `5.0` for double). Only meaningful when [`check_evolution`] passed.
///
/// The value is first validated strictly against `old`, so a value that never matched the
/// old schema is reported rather than silently reshaped.
pub fn evolve_json(old: &Schema, new: &Schema, json: &str) -> Result<String, ValueError> {
    old.validate(json, Strictness::Strict)?;
    // With a compatible `new`, reading the old value through it is exactly the evolution:
    // unknown (removed) fields are skipped, absent nullable fields become null, and
    // narrower numbers are valid JSON for the wider type, re-encoded in its canonical form.
    value::canonicalize_with(new.root(), json, Strictness::IgnoreUnknownFields)
}

/// Compares `old` and `new` at `path`; on failure leaves `path` pointing at the culprit.
fn check(old: &DataType, new: &DataType, path: &mut Vec<String>) -> Result<(), String> {
    use DataType::*;
    match (old, new) {
        (Struct(o), Struct(n)) => {
            for nf in &n.fields {
                path.push(nf.name.clone());
                match o.field(&nf.name) {
                    None if !nf.nullable => {
                        return Err("a field added to an existing schema must be nullable, so \
                                    that values written before can read it as null"
                            .to_owned());
                    }
                    None => {}
                    Some(of) => {
                        if of.nullable && !nf.nullable {
                            return Err("the field was nullable and is now NOT NULL; values \
                                        written before may hold null"
                                .to_owned());
                        }
                        check(&of.data_type, &nf.data_type, path)?;
                    }
                }
                path.pop();
            }
            Ok(())
        }
        (
            Array {
                element: oe,
                contains_null: on,
            },
            Array {
                element: ne,
                contains_null: nn,
            },
        ) => {
            path.push("element".to_owned());
            if *on && !nn {
                return Err("array elements could be null and now may not".to_owned());
            }
            check(oe, ne, path)?;
            path.pop();
            Ok(())
        }
        (
            Map {
                key: ok,
                value: ov,
                value_contains_null: on,
            },
            Map {
                key: nk,
                value: nv,
                value_contains_null: nn,
            },
        ) => {
            if ok != nk {
                path.push("key".to_owned());
                return Err(format!(
                    "map key type changed from {ok} to {nk}; map key types cannot change"
                ));
            }
            path.push("value".to_owned());
            if *on && !nn {
                return Err("map values could be null and now may not".to_owned());
            }
            check(ov, nv, path)?;
            path.pop();
            Ok(())
        }
        _ if old == new => Ok(()),
        (Int, Long | Double) | (Long, Double) | (Float, Double) => Ok(()),
        (Long, Int) | (Double, Int | Long | Float) => Err(format!(
            "narrowing {old} to {new} is not allowed; values written before may not fit"
        )),
        _ => Err(format!(
            "the type changed from {old} to {new}, which is not an allowed widening \
             (int→long, int→double, long→double, float→double)"
        )),
    }
}
