//! The per-input-row scanner: validation plus capture of selected columns in one pass.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::types::{DataType, Schema, StructType};
use crate::value::{self, Ctx, Null, Seed, Seen, Seg, Strictness, ValueError};

/// Scans JSON object rows: validates each against an optional struct schema (ignoring
/// unknown fields, like Spark's JSON reader) and captures the raw JSON text of chosen
/// top-level columns, such as the grouping-key and event-time columns, in the same pass.
///
/// Captured values borrow from the input line, so scanning allocates nothing per field;
/// [`RowScanner::scan_into`] avoids even the result vector. A captured column holds its
/// JSON exactly as written (a string keeps its quotes and escapes; JSON `null` is captured
/// as `null`); canonicalise it with [`Schema::canonicalize`] before using it as a key.
#[derive(Clone, Debug)]
pub struct RowScanner {
    columns: Vec<String>,
    /// The schema's fields, if a struct schema was given.
    fields: Option<StructType>,
    /// Set when the schema given is not a struct, which no row can match.
    not_struct: Option<DataType>,
    /// Every member name the scanner cares about: schema fields first, then requested
    /// columns the schema does not name.
    entries: Vec<Entry>,
    /// `(from, to)` slots for a column requested more than once.
    repeats: Vec<(usize, usize)>,
}

#[derive(Clone, Debug)]
struct Entry {
    name: String,
    /// Position in the schema's fields.
    field: Option<usize>,
    /// Position in the requested columns.
    slot: Option<usize>,
}

impl RowScanner {
    /// A scanner that checks rows against `schema` (if any; it must be a struct) and
    /// captures `columns`, in that order, from each row.
    ///
    /// A non-struct schema makes every row fail, since rows are JSON objects.
    pub fn new(schema: Option<Schema>, columns: Vec<String>) -> RowScanner {
        let (fields, not_struct) = match schema.map(|s| s.root().clone()) {
            Some(DataType::Struct(st)) => (Some(st), None),
            Some(other) => (None, Some(other)),
            None => (None, None),
        };
        let first_slot = |name: &str| columns.iter().position(|c| c == name);
        let mut entries: Vec<Entry> = Vec::new();
        if let Some(st) = &fields {
            for (i, f) in st.fields.iter().enumerate() {
                entries.push(Entry {
                    name: f.name.clone(),
                    field: Some(i),
                    slot: first_slot(&f.name),
                });
            }
        }
        let mut repeats = Vec::new();
        for (slot, name) in columns.iter().enumerate() {
            match first_slot(name) {
                Some(first) if first != slot => repeats.push((first, slot)),
                _ => {
                    if !entries.iter().any(|e| e.name == *name) {
                        entries.push(Entry {
                            name: name.clone(),
                            field: None,
                            slot: Some(slot),
                        });
                    }
                }
            }
        }
        RowScanner {
            columns,
            fields,
            not_struct,
            entries,
            repeats,
        }
    }

    /// The requested columns, in capture order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Scans one row, returning the captured columns in the order they were requested
    /// (`None` for a column the row does not have).
    pub fn scan<'a>(&self, line: &'a str) -> Result<Vec<Option<&'a RawValue>>, ValueError> {
        let mut out = vec![None; self.columns.len()];
        self.scan_into(line, &mut out)?;
        Ok(out)
    }

    /// Like [`RowScanner::scan`], but writes the captured columns into `out`, which must
    /// have exactly one slot per requested column. Every slot is overwritten.
    ///
    /// # Panics
    ///
    /// If `out.len()` differs from the number of requested columns.
    pub fn scan_into<'a>(
        &self,
        line: &'a str,
        out: &mut [Option<&'a RawValue>],
    ) -> Result<(), ValueError> {
        assert_eq!(
            out.len(),
            self.columns.len(),
            "one output slot per requested column"
        );
        out.fill(None);
        if self.fields.is_none() && self.not_struct.is_none() && self.scan_flat(line, out) {
            for &(from, to) in &self.repeats {
                out[to] = out[from];
            }
            return Ok(());
        }
        out.fill(None);
        self.scan_general(line, out)
    }

    /// The general scan: serde's parser, with the schema's checks and errors that say what
    /// is wrong with the row.
    pub(crate) fn scan_general<'a>(
        &self,
        line: &'a str,
        out: &mut [Option<&'a RawValue>],
    ) -> Result<(), ValueError> {
        if let Some(ty) = &self.not_struct {
            return Err(ValueError::new(
                "",
                format!("the input schema must be a struct to check rows, but it is {ty}"),
            ));
        }
        let ctx = Ctx::new(Strictness::IgnoreUnknownFields);
        let mut de = serde_json::Deserializer::from_str(line);
        let visitor = RowVisitor {
            scanner: self,
            ctx: &ctx,
            out: &mut *out,
        };
        let result = de::Deserializer::deserialize_any(&mut de, visitor).and_then(|()| de.end());
        result.map_err(|e| ctx.into_error(e))?;
        for &(from, to) in &self.repeats {
            out[to] = out[from];
        }
        Ok(())
    }
}

/// The fast path of a scanner without a schema, for the rows most inputs are made of: an
/// object whose member names hold no escapes and name no captured column twice. Values are
/// checked for JSON's grammar as the general scan checks them (nested ones up to
/// [`FLAT_DEPTH`] deep). Anything else (an escaped name, a repeated capture, a deeper value,
/// or any malformed JSON) is left to the general scan, which then finds the same captures or
/// reports what is wrong: the fast path accepts only rows the general scan accepts, with the
/// same captures (checked by `tests.rs` on mutated rows).
impl RowScanner {
    /// Scans `line` if it is such a row (`true`); `false` leaves it to the general scan,
    /// with `out` partly written.
    pub(crate) fn scan_flat<'a>(&self, line: &'a str, out: &mut [Option<&'a RawValue>]) -> bool {
        let b = line.as_bytes();
        let start = skip_ws(b, 0);
        if b.get(start) != Some(&b'{') {
            return false;
        }
        let end = container(b, start, FLAT_DEPTH, |name, escaped, value| {
            if escaped {
                return None;
            }
            let column = &line[name];
            let Some(slot) = self
                .entries
                .iter()
                .find(|e| e.name == column)
                .and_then(|e| e.slot)
            else {
                return Some(());
            };
            if out[slot].is_some() {
                return None;
            }
            out[slot] = Some(serde_json::from_str::<&'a RawValue>(&line[value]).ok()?);
            Some(())
        });
        end.is_some_and(|end| skip_ws(b, end) == b.len())
    }
}

/// How deep the fast path follows arrays and objects inside a row's values.
const FLAT_DEPTH: usize = 32;

/// The first index at or after `i` that is not JSON whitespace.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// Where a string starting at `i` ends (past its closing quote), and whether it has escapes.
fn string(b: &[u8], i: usize) -> Option<(usize, bool)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let (mut j, mut escaped) = (i + 1, false);
    loop {
        match *b.get(j)? {
            b'"' => return Some((j + 1, escaped)),
            b'\\' => {
                escaped = true;
                j += match *b.get(j + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                    b'u' if b.get(j + 2..j + 6)?.iter().all(u8::is_ascii_hexdigit) => 6,
                    _ => return None,
                };
            }
            0..0x20 => return None,
            _ => j += 1,
        }
    }
}

/// Where a JSON value starting at `i` ends, following arrays and objects `depth` deep.
fn value(b: &[u8], i: usize, depth: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string(b, i).map(|(end, _)| end),
        b'-' | b'0'..=b'9' => number(b, i),
        b't' => b[i..].starts_with(b"true").then_some(i + 4),
        b'f' => b[i..].starts_with(b"false").then_some(i + 5),
        b'n' => b[i..].starts_with(b"null").then_some(i + 4),
        b'[' | b'{' if depth > 0 => container(b, i, depth - 1, |_, _, _| Some(())),
        _ => None,
    }
}

/// Where the array or object whose bracket is at `i` ends, its elements' values followed
/// `depth` deep. `member` is given each object member's name (between the quotes), whether
/// the name has escapes, and the member's value; returning `None` ends the scan.
fn container(
    b: &[u8],
    i: usize,
    depth: usize,
    mut member: impl FnMut(Range<usize>, bool, Range<usize>) -> Option<()>,
) -> Option<usize> {
    let object = b[i] == b'{';
    let close = if object { b'}' } else { b']' };
    let mut j = skip_ws(b, i + 1);
    if b.get(j) == Some(&close) {
        return Some(j + 1);
    }
    loop {
        let mut name = None;
        if object {
            let (name_end, escaped) = string(b, j)?;
            name = Some((j + 1..name_end - 1, escaped));
            j = skip_ws(b, name_end);
            if b.get(j) != Some(&b':') {
                return None;
            }
            j = skip_ws(b, j + 1);
        }
        let end = value(b, j, depth)?;
        if let Some((name, escaped)) = name {
            member(name, escaped, j..end)?;
        }
        j = skip_ws(b, end);
        match *b.get(j)? {
            b',' => j = skip_ws(b, j + 1),
            c if c == close => return Some(j + 1),
            _ => return None,
        }
    }
}

/// Where a number starting at `i` ends, if it has JSON's grammar:
/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn number(b: &[u8], mut i: usize) -> Option<usize> {
    let digits = |mut j: usize| {
        let start = j;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        (j > start).then_some(j)
    };
    if b[i] == b'-' {
        i += 1;
    }
    i = match b.get(i)? {
        b'0' => i + 1,
        b'1'..=b'9' => digits(i)?,
        _ => return None,
    };
    if b.get(i) == Some(&b'.') {
        i = digits(i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(i)?;
    }
    Some(i)
}

struct RowVisitor<'s, 'a, 'o> {
    scanner: &'s RowScanner,
    ctx: &'s Ctx,
    out: &'o mut [Option<&'a RawValue>],
}

impl RowVisitor<'_, '_, '_> {
    fn not_object<E: de::Error>(&self, found: &str) -> E {
        self.ctx
            .fail(format!("expected a JSON object (one row), found {found}"))
    }
}

impl<'a> Visitor<'a> for RowVisitor<'_, 'a, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'a>>(self, mut map: A) -> Result<(), A::Error> {
        let RowVisitor { scanner, ctx, out } = self;
        let entries = &scanner.entries;
        let mut seen = Seen::new(entries.len());
        let mut hint = 0;
        while let Some(found) = map.next_key_seed(EntryKey { entries, hint })? {
            let Some(i) = found else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let entry = &entries[i];
            if !seen.insert(i) {
                ctx.push(Seg::Field(entry.name.clone()));
                return Err(ctx.fail("the field appears more than once".to_owned()));
            }
            hint = i + 1;
            let field = entry
                .field
                .and_then(|f| scanner.fields.as_ref().map(|st| &st.fields[f]));
            let result = match (entry.slot, field) {
                (Some(slot), field) => map.next_value::<&'a RawValue>().and_then(|raw| {
                    out[slot] = Some(raw);
                    match field {
                        // The captured text is validated on its own; key columns are short,
                        // so the second look costs little and keeps capture zero-copy.
                        Some(f) => {
                            value::run_nested(&f.data_type, Null::field(f.nullable), raw.get(), ctx)
                        }
                        None => Ok(()),
                    }
                }),
                (None, Some(f)) => map.next_value_seed(Seed {
                    ty: &f.data_type,
                    null: Null::field(f.nullable),
                    ctx,
                    out: None,
                }),
                (None, None) => map.next_value::<IgnoredAny>().map(drop),
            };
            if let Err(e) = result {
                ctx.push(Seg::Field(entry.name.clone()));
                return Err(e);
            }
        }
        if let Some(st) = &scanner.fields {
            // Schema fields come first in `entries`, so entry `i` is field `i`.
            let missing = st
                .fields
                .iter()
                .enumerate()
                .find(|(i, f)| !f.nullable && !seen.contains(*i));
            if let Some((_, f)) = missing {
                ctx.push(Seg::Field(f.name.clone()));
                return Err(ctx.fail("the field is NOT NULL but missing".to_owned()));
            }
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(self.not_object("null"))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        Err(self.not_object(if v { "true" } else { "false" }))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(self.not_object("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(self.not_object("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(self.not_object("a number"))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(self.not_object("a string"))
    }

    fn visit_seq<A: de::SeqAccess<'a>>(self, _: A) -> Result<(), A::Error> {
        Err(self.not_object("an array"))
    }
}

/// Finds a member name among the scanner's entries; `None` for a member to skip.
struct EntryKey<'s> {
    entries: &'s [Entry],
    hint: usize,
}

impl<'de> DeserializeSeed<'de> for EntryKey<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for EntryKey<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a column name")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(value::find_name(
            self.entries.len(),
            |i| &self.entries[i].name,
            self.hint,
            v,
        ))
    }
}
