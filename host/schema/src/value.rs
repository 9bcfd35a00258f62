//! Validation and canonical re-encoding of JSON values against a [`DataType`], in one
//! streaming pass (a serde `DeserializeSeed` driven by `serde_json::Deserializer`).
//! (One file on purpose: the seed, its visitors and the error path they share make one
//! recursive pass.)
//!
//! Errors carry the path of the offending value. To keep the success path free of
//! allocation the path is not tracked on the way down: the failing visitor records its
//! message in a shared [`Ctx`], and each enclosing struct, array or map adds its path
//! segment as the error travels back up.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::scalar;
use crate::types::{DataType, Schema, StructType};

/// What to do with JSON object members that the schema does not name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strictness {
    /// Unknown struct fields are an error. Used for state values and output rows.
    Strict,
    /// Unknown struct fields are skipped (their JSON must still be well formed), like
    /// Spark's JSON reader with a schema. Used for input rows.
    IgnoreUnknownFields,
}

/// A JSON value that does not match its schema, or is not valid JSON.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValueError {
    /// Where in the value the problem is, e.g. `address.zip`, `tags[3]` or
    /// `attributes['color']`; empty for the value as a whole.
    pub path: String,
    /// What was expected and what was found, e.g. `expected int, found string "x"`.
    pub message: String,
}

impl ValueError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> ValueError {
        ValueError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else if self.path.starts_with("['") {
            write!(f, "map entry `{}`: {}", self.path, self.message)
        } else if self.path.starts_with('[') {
            write!(f, "element `{}`: {}", self.path, self.message)
        } else {
            write!(f, "column `{}`: {}", self.path, self.message)
        }
    }
}

impl Schema {
    /// Validates one JSON text against the schema in a single streaming pass, without
    /// building a `serde_json::Value`.
    ///
    /// Map values are not checked for duplicate keys here (that would mean remembering
    /// every key); [`Schema::canonicalize`] rejects them.
    pub fn validate(&self, json: &str, mode: Strictness) -> Result<(), ValueError> {
        if plain_fits(self.root(), json) {
            return Ok(());
        }
        run(self.root(), json, mode, None)
    }

    /// Validates JSON (strictly) and re-encodes it canonically, so that equal values have
    /// equal bytes. Used for map user keys and grouping keys.
    ///
    /// The canonical form has no whitespace; struct fields appear in schema order and every
    /// field is present (absent nullable fields are written as `null`); strings use
    /// `serde_json`'s minimal escaping; integers are plain integers; float and double are
    /// written as the shortest text that reads back to the same value and always carry a
    /// `.` or exponent (`5` becomes `5.0`, `-0.0` becomes `0.0`); timestamps become integer
    /// milliseconds; map entries are sorted by their canonical key text, and duplicate keys
    /// (after canonicalising them, so `"1"` and `"01"` collide for int keys) are an error.
    pub fn canonicalize(&self, json: &str) -> Result<String, ValueError> {
        canonicalize_with(self.root(), json, Strictness::Strict)
    }
}

/// Whether `json` is, in its plainest form, a value of type `ty` that the full pass ([`run`])
/// accepts: an integer (see [`plain_integer_fits`]), or an object of a struct's fields with
/// flat values (see [`plain_struct_fits`]). Every state write and every emitted row is
/// validated, mostly such texts, for which the full pass costs several hundred instructions
/// to over a thousand (`bench/HISTORY.md`, "Plain values validated without a parser"). A
/// text this does not take goes to the full pass, which gives the verdict and the error:
/// this never rejects.
pub(crate) fn plain_fits(ty: &DataType, json: &str) -> bool {
    match ty {
        DataType::Struct(st) => plain_struct_fits(st, json.as_bytes()),
        _ => plain_integer_fits(ty, json.as_bytes()),
    }
}

/// Whether `json` is an object of `st`'s fields, as compact JSON (no whitespace), each field
/// at most once and every NOT NULL field present, whose values are integers of integer
/// fields ([`plain_integer_fits`]), strings without escapes of string fields, `true` or
/// `false` of boolean fields, or `null` of nullable fields; member names without escapes.
fn plain_struct_fits(st: &StructType, json: &[u8]) -> bool {
    let fields = &st.fields;
    if fields.is_empty() || fields.len() > 64 {
        return false;
    }
    let mut seen = 0u64;
    let Some(mut rest) = json.strip_prefix(b"{") else {
        return false;
    };
    let mut hint = 0;
    loop {
        let Some((name, after)) = plain_string(rest) else {
            return false;
        };
        let named = |i: usize| fields[i].name.as_bytes() == name;
        let Some(i) = (hint < fields.len() && named(hint))
            .then_some(hint)
            .or_else(|| (0..fields.len()).find(|&i| named(i)))
        else {
            return false;
        };
        if seen & (1 << i) != 0 {
            return false;
        }
        seen |= 1 << i;
        hint = i + 1;
        let Some(value) = after.strip_prefix(b":") else {
            return false;
        };
        let field = &fields[i];
        let end = match value.first() {
            Some(b'"') if matches!(field.data_type, DataType::String) => {
                match plain_string(value) {
                    Some((_, after)) => value.len() - after.len(),
                    None => return false,
                }
            }
            _ => {
                let end = value
                    .iter()
                    .position(|&b| b == b',' || b == b'}')
                    .unwrap_or(value.len());
                let token = &value[..end];
                let fits = match (token, &field.data_type) {
                    (b"null", _) => field.nullable,
                    (b"true" | b"false", DataType::Boolean) => true,
                    (_, DataType::Int | DataType::Long | DataType::Timestamp) => {
                        plain_integer_fits(&field.data_type, token)
                    }
                    _ => false,
                };
                if !fits {
                    return false;
                }
                end
            }
        };
        match &value[end..] {
            [b',', more @ ..] => rest = more,
            [b'}'] => break,
            _ => return false,
        }
    }
    fields
        .iter()
        .enumerate()
        .all(|(i, f)| f.nullable || seen & (1 << i) != 0)
}

/// A JSON string at the start of `bytes` with no escape and no control character: its
/// contents and what follows its closing quote.
fn plain_string(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let body = bytes.strip_prefix(b"\"")?;
    let close = body
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    (body[close] == b'"').then(|| (&body[..close], &body[close + 1..]))
}

/// Whether `json` is a plain integer literal that type `ty` (an integer type) holds: an
/// optional `-`, then 1 to 18 digits without a leading zero (or `0` alone), and nothing else.
pub(crate) fn plain_integer_fits(ty: &DataType, json: &[u8]) -> bool {
    let (min, max) = match ty {
        DataType::Int => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DataType::Long | DataType::Timestamp => (i64::MIN, i64::MAX),
        _ => return false,
    };
    let (negative, digits) = match json {
        [b'-', rest @ ..] => (true, rest),
        all => (false, all),
    };
    // 18 digits stay below 2^63; `-0` is left to serde_json, which reads it as a float.
    let plain = matches!(digits, [b'1'..=b'9', rest @ ..] if rest.len() < 18)
        || (!negative && digits == b"0");
    if !plain || !digits.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let magnitude = digits
        .iter()
        .fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
    let v = if negative { -magnitude } else { magnitude };
    (min..=max).contains(&v)
}

pub(crate) fn canonicalize_with(
    ty: &DataType,
    json: &str,
    mode: Strictness,
) -> Result<String, ValueError> {
    let mut out = Vec::with_capacity(json.len());
    run(ty, json, mode, Some(&mut out))?;
    // Every byte written comes from the validated input or from serde_json's encoder.
    String::from_utf8(out).map_err(|_| ValueError::new("", "canonical encoding is not UTF-8"))
}

/// Validates `json` as one complete value of type `ty`, optionally writing its canonical
/// encoding to `out`.
pub(crate) fn run(
    ty: &DataType,
    json: &str,
    mode: Strictness,
    out: Option<&mut Vec<u8>>,
) -> Result<(), ValueError> {
    let ctx = Ctx::new(mode);
    let mut de = serde_json::Deserializer::from_str(json);
    let result = Seed {
        ty,
        null: Null::TopLevel,
        ctx: &ctx,
        out,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    result.map_err(|e| ctx.into_error(e))
}

/// Validates a complete JSON value inside an ongoing pass, sharing its [`Ctx`] so that
/// the failure's path continues outward from here.
pub(crate) fn run_nested<E: de::Error>(
    ty: &DataType,
    null: Null,
    json: &str,
    ctx: &Ctx,
) -> Result<(), E> {
    let mut de = serde_json::Deserializer::from_str(json);
    Seed {
        ty,
        null,
        ctx,
        out: None,
    }
    .deserialize(&mut de)
    .map_err(|e| {
        if ctx.failure.borrow().message.is_some() {
            E::custom("")
        } else {
            ctx.fail(format!("malformed JSON: {e}"))
        }
    })
}

/// One step of a value's path, innermost first while an error propagates.
pub(crate) enum Seg {
    Field(String),
    Index(usize),
    Key(String),
}

#[derive(Default)]
struct Failure {
    message: Option<String>,
    segs: Vec<Seg>,
}

/// State shared by all visitors of one pass.
pub(crate) struct Ctx {
    pub(crate) mode: Strictness,
    failure: RefCell<Failure>,
}

impl Ctx {
    pub(crate) fn new(mode: Strictness) -> Ctx {
        Ctx {
            mode,
            failure: RefCell::new(Failure::default()),
        }
    }

    /// Records why the value is wrong and returns the error to propagate. The serde error
    /// itself carries no text: [`Ctx::into_error`] takes the message from here.
    pub(crate) fn fail<E: de::Error>(&self, message: String) -> E {
        self.failure.borrow_mut().message = Some(message);
        E::custom("")
    }

    /// Adds the path segment of an enclosing value to a failure on its way up.
    pub(crate) fn push(&self, seg: Seg) {
        self.failure.borrow_mut().segs.push(seg);
    }

    pub(crate) fn into_error(self, e: serde_json::Error) -> ValueError {
        let failure = self.failure.into_inner();
        let mut path = String::new();
        for seg in failure.segs.iter().rev() {
            match seg {
                Seg::Field(name) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(name);
                }
                Seg::Index(i) => {
                    path.push('[');
                    path.push_str(&i.to_string());
                    path.push(']');
                }
                Seg::Key(k) => {
                    path.push_str("['");
                    path.push_str(k);
                    path.push_str("']");
                }
            }
        }
        // Without a recorded message the error came from serde_json itself: bad syntax.
        let message = failure
            .message
            .unwrap_or_else(|| format!("malformed JSON: {e}"));
        ValueError { path, message }
    }
}

/// Whether null is acceptable at a position, and if not, why (for the message).
#[derive(Clone, Copy)]
pub(crate) enum Null {
    Allowed,
    NotNullField,
    Element,
    MapValue,
    TopLevel,
}

impl Null {
    pub(crate) fn field(nullable: bool) -> Null {
        if nullable {
            Null::Allowed
        } else {
            Null::NotNullField
        }
    }
}

/// The JSON actually found, for messages.
enum Found<'a> {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'a str),
    Array,
    Object,
}

impl fmt::Display for Found<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Null => f.write_str("null"),
            Found::Bool(b) => write!(f, "{b}"),
            Found::Int(i) => write!(f, "number {i}"),
            Found::Float(x) => write!(f, "number {}", float_text(*x)),
            Found::Str(s) => {
                // Long strings are cut so a bad multi-kilobyte value does not flood logs.
                const MAX: usize = 40;
                match s.char_indices().nth(MAX) {
                    Some((cut, _)) => write!(f, "string {:?}…", &s[..cut]),
                    None => write!(f, "string {s:?}"),
                }
            }
            Found::Array => f.write_str("an array"),
            Found::Object => f.write_str("an object"),
        }
    }
}

/// How the expected type is named in messages.
pub(crate) fn expected(ty: &DataType) -> String {
    match ty {
        DataType::Binary => "binary (a base64 string)".to_owned(),
        DataType::Timestamp => {
            "timestamp (milliseconds since the epoch or an ISO-8601 string)".to_owned()
        }
        DataType::Date => "date (a \"YYYY-MM-DD\" string)".to_owned(),
        DataType::Struct(_) => "struct (a JSON object)".to_owned(),
        DataType::Array { .. } => format!("{} (a JSON array)", ty.to_ddl()),
        DataType::Map { .. } => format!("{} (a JSON object)", ty.to_ddl()),
        _ => ty.to_ddl(),
    }
}

/// Validates (and optionally canonicalises) one JSON value of type `ty`.
pub(crate) struct Seed<'s, 'o> {
    pub(crate) ty: &'s DataType,
    pub(crate) null: Null,
    pub(crate) ctx: &'s Ctx,
    pub(crate) out: Option<&'o mut Vec<u8>>,
}

impl Seed<'_, '_> {
    fn mismatch<E: de::Error>(&self, found: Found<'_>) -> E {
        self.ctx
            .fail(format!("expected {}, found {found}", expected(self.ty)))
    }

    fn invalid<E: de::Error>(&self, found: Found<'_>, reason: &str) -> E {
        self.ctx.fail(format!(
            "expected {}, found {found}: {reason}",
            expected(self.ty)
        ))
    }

    fn integer<E: de::Error>(self, v: i128) -> Result<(), E> {
        let (min, max) = match self.ty {
            DataType::Int => (i128::from(i32::MIN), i128::from(i32::MAX)),
            DataType::Long | DataType::Timestamp => (i128::from(i64::MIN), i128::from(i64::MAX)),
            DataType::Float => return self.float(v as f64),
            DataType::Double => return self.float(v as f64),
            _ => return Err(self.mismatch(Found::Int(v))),
        };
        if v < min || v > max {
            return Err(self.invalid(Found::Int(v), "out of range"));
        }
        if let Some(out) = self.out {
            // The range check above guarantees the value fits.
            write_int(out, v as i64);
        }
        Ok(())
    }

    fn float<E: de::Error>(self, v: f64) -> Result<(), E> {
        match self.ty {
            DataType::Double => {
                if let Some(out) = self.out {
                    write_f64(out, v);
                }
                Ok(())
            }
            DataType::Float => {
                let narrowed = v as f32;
                if !narrowed.is_finite() {
                    return Err(self.invalid(Found::Float(v), "out of range for float"));
                }
                if let Some(out) = self.out {
                    write_f32(out, narrowed);
                }
                Ok(())
            }
            // serde_json reads `-0` as a float to keep its sign; it is the integer zero.
            DataType::Int | DataType::Long | DataType::Timestamp if v == 0.0 => {
                if let Some(out) = self.out {
                    out.push(b'0');
                }
                Ok(())
            }
            DataType::Int | DataType::Long | DataType::Timestamp => {
                // serde_json hands us an f64 for any number with a fraction or exponent and
                // for integers beyond the u64/i64 range.
                let reason = if v.fract() != 0.0 {
                    "not an integer"
                } else if v.abs() < 9.2e18 {
                    "integers must be written without a decimal point or exponent"
                } else {
                    "out of range"
                };
                Err(self.invalid(Found::Float(v), reason))
            }
            _ => Err(self.mismatch(Found::Float(v))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&expected(self.ty))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        let why = match self.null {
            Null::Allowed => {
                if let Some(out) = self.out {
                    out.extend_from_slice(b"null");
                }
                return Ok(());
            }
            Null::NotNullField => "the field is NOT NULL",
            Null::Element => "array elements may not be null",
            Null::MapValue => "map values may not be null",
            Null::TopLevel => "the value may not be null",
        };
        Err(self.invalid(Found::Null, why))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        if !matches!(self.ty, DataType::Boolean) {
            return Err(self.mismatch(Found::Bool(v)));
        }
        if let Some(out) = self.out {
            out.extend_from_slice(if v { b"true" } else { b"false" });
        }
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.integer(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.integer(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.float(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match self.ty {
            DataType::String => {}
            DataType::Binary => {
                scalar::check_base64(v).map_err(|why| self.invalid(Found::Str(v), why))?
            }
            DataType::Date => {
                scalar::parse_date(v).map_err(|why| self.invalid(Found::Str(v), why))?;
            }
            DataType::Timestamp => {
                let millis =
                    scalar::parse_timestamp(v).map_err(|why| self.invalid(Found::Str(v), why))?;
                if let Some(out) = self.out {
                    write_int(out, millis);
                }
                return Ok(());
            }
            _ => return Err(self.mismatch(Found::Str(v))),
        }
        if let Some(out) = self.out {
            write_str(out, v);
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let DataType::Array {
            element,
            contains_null,
        } = self.ty
        else {
            return Err(self.mismatch(Found::Array));
        };
        let null = if *contains_null {
            Null::Allowed
        } else {
            Null::Element
        };
        let Seed { ctx, mut out, .. } = self;
        if let Some(out) = out.as_deref_mut() {
            out.push(b'[');
        }
        let mut index = 0;
        loop {
            // The separator is written before we know whether another element follows,
            // and taken back if none does.
            let mark = out.as_deref_mut().map(|out| {
                let mark = out.len();
                if index > 0 {
                    out.push(b',');
                }
                mark
            });
            let seed = Seed {
                ty: element,
                null,
                ctx,
                out: out.as_deref_mut(),
            };
            match seq.next_element_seed(seed) {
                Ok(Some(())) => index += 1,
                Ok(None) => {
                    if let (Some(out), Some(mark)) = (out.as_deref_mut(), mark) {
                        out.truncate(mark);
                    }
                    break;
                }
                Err(e) => {
                    ctx.push(Seg::Index(index));
                    return Err(e);
                }
            }
        }
        if let Some(out) = out {
            out.push(b']');
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        match self.ty {
            DataType::Struct(st) => visit_struct(st, self.ctx, self.out, map),
            DataType::Map {
                key,
                value,
                value_contains_null,
            } => {
                let null = if *value_contains_null {
                    Null::Allowed
                } else {
                    Null::MapValue
                };
                visit_map_type(key, value, null, self.ctx, self.out, map)
            }
            _ => Err(self.mismatch(Found::Object)),
        }
    }
}

fn visit_struct<'de, A: MapAccess<'de>>(
    st: &StructType,
    ctx: &Ctx,
    out: Option<&mut Vec<u8>>,
    mut map: A,
) -> Result<(), A::Error> {
    let n = st.fields.len();
    let mut seen = Seen::new(n);
    // Canonical output needs schema order, but members may arrive in any order, so each
    // field's encoding is kept until the object ends.
    let mut slots: Vec<Option<Vec<u8>>> = if out.is_some() {
        vec![None; n]
    } else {
        Vec::new()
    };
    let mut hint = 0;
    while let Some(found) = map.next_key_seed(FieldKey {
        names: &st.fields,
        hint,
        ctx,
    })? {
        let Some(i) = found else {
            map.next_value::<IgnoredAny>()?;
            continue;
        };
        let field = &st.fields[i];
        if !seen.insert(i) {
            ctx.push(Seg::Field(field.name.clone()));
            return Err(ctx.fail("the field appears more than once".to_owned()));
        }
        hint = i + 1;
        let mut buf = out.is_some().then(Vec::new);
        let seed = Seed {
            ty: &field.data_type,
            null: Null::field(field.nullable),
            ctx,
            out: buf.as_mut(),
        };
        if let Err(e) = map.next_value_seed(seed) {
            ctx.push(Seg::Field(field.name.clone()));
            return Err(e);
        }
        if let Some(buf) = buf {
            slots[i] = Some(buf);
        }
    }
    if let Some(missing) = st
        .fields
        .iter()
        .enumerate()
        .find(|(i, f)| !f.nullable && !seen.contains(*i))
    {
        ctx.push(Seg::Field(missing.1.name.clone()));
        return Err(ctx.fail("the field is NOT NULL but missing".to_owned()));
    }
    if let Some(out) = out {
        out.push(b'{');
        for (i, (field, slot)) in st.fields.iter().zip(slots).enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_str(out, &field.name);
            out.push(b':');
            match slot {
                Some(bytes) => out.extend_from_slice(&bytes),
                None => out.extend_from_slice(b"null"),
            }
        }
        out.push(b'}');
    }
    Ok(())
}

fn visit_map_type<'de, A: MapAccess<'de>>(
    key_ty: &DataType,
    value_ty: &DataType,
    null: Null,
    ctx: &Ctx,
    out: Option<&mut Vec<u8>>,
    mut map: A,
) -> Result<(), A::Error> {
    let canonical = out.is_some();
    let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    while let Some(key) = map.next_key_seed(KeyText)? {
        let mut key_buf = canonical.then(Vec::new);
        if let Err(why) = map_key(key_ty, &key, ctx.mode, key_buf.as_mut()) {
            ctx.push(Seg::Key(key.into_owned()));
            return Err(ctx.fail(why));
        }
        let mut value_buf = canonical.then(Vec::new);
        let seed = Seed {
            ty: value_ty,
            null,
            ctx,
            out: value_buf.as_mut(),
        };
        if let Err(e) = map.next_value_seed(seed) {
            ctx.push(Seg::Key(key.into_owned()));
            return Err(e);
        }
        if let (Some(k), Some(v)) = (key_buf, value_buf) {
            entries.push((k, v));
        }
    }
    if let Some(out) = out {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(dup) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
            let text: String = serde_json::from_slice(&dup[0].0).unwrap_or_default();
            ctx.push(Seg::Key(text));
            return Err(ctx.fail("the map key appears more than once".to_owned()));
        }
        out.push(b'{');
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(k);
            out.push(b':');
            out.extend_from_slice(v);
        }
        out.push(b'}');
    }
    Ok(())
}

/// Checks a map key (always a JSON string) against the key type and optionally writes its
/// canonical form as a JSON string.
fn map_key(
    ty: &DataType,
    key: &str,
    mode: Strictness,
    out: Option<&mut Vec<u8>>,
) -> Result<(), String> {
    let bad = |why: &str| {
        format!(
            "the map key {} is not a valid {}{why}",
            Found::Str(key),
            ty.to_ddl()
        )
    };
    let mut text = Cow::Borrowed(key);
    match ty {
        DataType::String => {}
        DataType::Boolean => {
            if key != "true" && key != "false" {
                return Err(bad(" (\"true\" or \"false\")"));
            }
        }
        DataType::Int => text = key.parse::<i32>().map_err(|_| bad(""))?.to_string().into(),
        DataType::Long => text = key.parse::<i64>().map_err(|_| bad(""))?.to_string().into(),
        DataType::Float | DataType::Double => {
            let v = scalar::parse_number_text(key).ok_or_else(|| bad(""))?;
            let mut buf = Vec::new();
            if matches!(ty, DataType::Float) {
                let narrowed = v as f32;
                if !narrowed.is_finite() {
                    return Err(bad(": out of range"));
                }
                write_f32(&mut buf, narrowed);
            } else {
                write_f64(&mut buf, v);
            }
            text = String::from_utf8_lossy(&buf).into_owned().into();
        }
        DataType::Binary => scalar::check_base64(key).map_err(|why| bad(&format!(": {why}")))?,
        DataType::Date => {
            scalar::parse_date(key).map_err(|why| bad(&format!(": {why}")))?;
        }
        DataType::Timestamp => {
            let millis = match key.parse::<i64>() {
                Ok(millis) => millis,
                Err(_) => scalar::parse_timestamp(key).map_err(|why| bad(&format!(": {why}")))?,
            };
            text = millis.to_string().into();
        }
        DataType::Struct(_) | DataType::Array { .. } | DataType::Map { .. } => {
            // Complex keys are written as the JSON text of the key value.
            let mut buf = out.is_some().then(Vec::new);
            run(ty, key, mode, buf.as_mut()).map_err(|e| bad(&format!(": {e}")))?;
            if let Some(buf) = buf {
                text = String::from_utf8_lossy(&buf).into_owned().into();
            }
        }
    }
    if let Some(out) = out {
        write_str(out, &text);
    }
    Ok(())
}

/// Finds a struct field by member name; `None` for an unknown member that may be skipped.
struct FieldKey<'s> {
    names: &'s [crate::types::Field],
    /// Where to look first: members usually arrive in schema order.
    hint: usize,
    ctx: &'s Ctx,
}

impl<'de> DeserializeSeed<'de> for FieldKey<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldKey<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        if let Some(i) = find_name(self.names.len(), |i| &self.names[i].name, self.hint, v) {
            return Ok(Some(i));
        }
        match self.ctx.mode {
            Strictness::IgnoreUnknownFields => Ok(None),
            Strictness::Strict => {
                self.ctx.push(Seg::Field(v.to_owned()));
                Err(self.ctx.fail(unknown_field_message(self.names)))
            }
        }
    }
}

/// Looks `name` up in `names`, trying position `hint` first.
pub(crate) fn find_name<'n>(
    len: usize,
    name_at: impl Fn(usize) -> &'n str,
    hint: usize,
    name: &str,
) -> Option<usize> {
    if hint < len && name_at(hint) == name {
        return Some(hint);
    }
    (0..len).find(|&i| name_at(i) == name)
}

fn unknown_field_message(fields: &[crate::types::Field]) -> String {
    const SHOWN: usize = 12;
    let mut names: Vec<&str> = fields.iter().take(SHOWN).map(|f| f.name.as_str()).collect();
    if fields.len() > SHOWN {
        names.push("…");
    }
    if names.is_empty() {
        "the field is not in the schema, which has no fields".to_owned()
    } else {
        format!(
            "the field is not in the schema (fields: {})",
            names.join(", ")
        )
    }
}

/// Reads a member name, borrowing it from the input when it has no escapes.
struct KeyText;

impl<'de> DeserializeSeed<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// A set of field positions; inline for the common case of at most 64 fields.
pub(crate) struct Seen {
    small: u64,
    large: Vec<u64>,
}

impl Seen {
    pub(crate) fn new(n: usize) -> Seen {
        let large = if n > 64 {
            vec![0; n.div_ceil(64)]
        } else {
            Vec::new()
        };
        Seen { small: 0, large }
    }

    /// Adds `i`; returns false if it was already present.
    pub(crate) fn insert(&mut self, i: usize) -> bool {
        let word = if self.large.is_empty() {
            &mut self.small
        } else {
            &mut self.large[i / 64]
        };
        let bit = 1u64 << (i % 64);
        let fresh = *word & bit == 0;
        *word |= bit;
        fresh
    }

    pub(crate) fn contains(&self, i: usize) -> bool {
        let word = if self.large.is_empty() {
            self.small
        } else {
            self.large[i / 64]
        };
        word & (1u64 << (i % 64)) != 0
    }
}

fn write_int(out: &mut Vec<u8>, v: i64) {
    let mut buf = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

fn write_f64(out: &mut Vec<u8>, v: f64) {
    // Negative zero equals zero, so it must encode the same.
    let v = if v == 0.0 { 0.0 } else { v };
    // serde_json writes finite floats in shortest round-trip form; writing to a Vec cannot
    // fail and callers only pass finite values.
    let _ = serde_json::to_writer(out, &v);
}

fn write_f32(out: &mut Vec<u8>, v: f32) {
    let v = if v == 0.0 { 0.0 } else { v };
    let _ = serde_json::to_writer(out, &v);
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

/// A float as serde_json would write it, for messages.
fn float_text(v: f64) -> String {
    let mut buf = Vec::new();
    write_f64(&mut buf, v);
    String::from_utf8_lossy(&buf).into_owned()
}
