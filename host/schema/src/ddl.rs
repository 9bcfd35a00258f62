//! A recursive-descent parser for Spark's DDL schema syntax.

use std::fmt;

use crate::types::{DataType, Field, StructType};

/// How deeply types may nest. Schemas come from untrusted processors, so recursion must be
/// bounded; real schemas stay far below this.
const MAX_DEPTH: usize = 64;

/// A DDL schema that did not parse: what is wrong and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SchemaError {
    /// The DDL text as given.
    pub ddl: String,
    /// Where the problem is, in characters from the start of `ddl` (0-based).
    pub position: usize,
    /// What is wrong, e.g. "unknown type `strng`".
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid schema `{}`: {} at column {}",
            self.ddl,
            self.message,
            self.position + 1
        )
    }
}

/// Parses a whole DDL string: a single type, or a field list read as a struct.
pub(crate) fn parse(ddl: &str) -> Result<DataType, SchemaError> {
    let mut p = Parser {
        src: ddl,
        pos: 0,
        depth: 0,
    };
    p.skip_ws();
    if p.at_end() {
        return Err(p.error(
            "the schema is empty; expected a type such as `long` or fields such as `name string`",
        ));
    }
    if p.starts_single_type() {
        let ty = p.parse_type()?;
        p.skip_ws();
        if !p.at_end() {
            return Err(p.error("expected the end of the schema after the type"));
        }
        return Ok(ty);
    }
    let mut fields: Vec<Field> = Vec::new();
    loop {
        p.parse_field_into(&mut fields)?;
        p.skip_ws();
        if p.eat(b',') {
            continue;
        }
        if p.at_end() {
            break;
        }
        return Err(p.error("expected `,` or the end of the schema"));
    }
    Ok(DataType::Struct(StructType::new(fields)))
}

struct Parser<'a> {
    src: &'a str,
    /// Byte offset of the next unread character.
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn error_at(&self, byte_pos: usize, message: impl Into<String>) -> SchemaError {
        SchemaError {
            ddl: self.src.to_owned(),
            position: self.src[..byte_pos].chars().count(),
            message: message.into(),
        }
    }

    fn error(&self, message: impl Into<String>) -> SchemaError {
        self.error_at(self.pos, message)
    }

    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, b: u8, after: &str) -> Result<(), SchemaError> {
        self.skip_ws();
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.error(format!(
                "expected `{}` {after}, found {}",
                b as char,
                self.found()
            )))
        }
    }

    /// Describes the next token for error messages.
    fn found(&self) -> String {
        let rest = &self.src[self.pos..];
        match rest.chars().next() {
            None => "the end of the schema".to_owned(),
            Some(c) if c.is_ascii_alphanumeric() || c == '_' => {
                let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
                format!("`{}`", &rest[..len.unwrap_or(rest.len())])
            }
            Some(c) => format!("`{c}`"),
        }
    }

    /// Reads a bare word (`[A-Za-z0-9_]+`) without skipping whitespace first.
    fn word(&mut self) -> Option<&'a str> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| &self.src[start..self.pos])
    }

    /// Whether the next bare word, case-insensitively, is `keyword`; consumes it if so.
    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let start = self.pos;
        match self.word() {
            Some(w) if w.eq_ignore_ascii_case(keyword) => true,
            _ => {
                self.pos = start;
                false
            }
        }
    }

    /// A top-level schema is a single type when it is one bare word alone (`long`) or a
    /// word followed by `<` or `(` (`array<string>`, `varchar(10)`); anything else is a
    /// field list.
    fn starts_single_type(&mut self) -> bool {
        let start = self.pos;
        let single = self.word().is_some() && {
            self.skip_ws();
            self.at_end() || matches!(self.peek(), Some(b'<' | b'('))
        };
        self.pos = start;
        single
    }

    /// Parses `name [:] type [NOT NULL] [COMMENT '...']` and appends it to `fields`,
    /// rejecting a name already present.
    fn parse_field_into(&mut self, fields: &mut Vec<Field>) -> Result<(), SchemaError> {
        self.skip_ws();
        let name_pos = self.pos;
        let name = self.field_name()?;
        if fields.iter().any(|f| f.name == name) {
            return Err(self.error_at(name_pos, format!("duplicate field name `{name}`")));
        }
        self.skip_ws();
        self.eat(b':');
        let data_type = self.parse_type()?;
        let mut nullable = true;
        loop {
            self.skip_ws();
            if self.eat_keyword("not") {
                self.skip_ws();
                if !self.eat_keyword("null") {
                    return Err(
                        self.error(format!("expected NULL after NOT, found {}", self.found()))
                    );
                }
                nullable = false;
            } else if self.eat_keyword("comment") {
                self.skip_ws();
                self.string_literal()?;
            } else {
                break;
            }
        }
        fields.push(Field {
            name,
            data_type,
            nullable,
        });
        Ok(())
    }

    /// A bare identifier or a backquoted name (with ``` `` ``` standing for one backquote).
    fn field_name(&mut self) -> Result<String, SchemaError> {
        let start = self.pos;
        if self.eat(b'`') {
            let mut name = String::new();
            loop {
                let rest = &self.src[self.pos..];
                let Some(end) = rest.find('`') else {
                    return Err(self.error_at(start, "unterminated backquoted name"));
                };
                name.push_str(&rest[..end]);
                self.pos += end + 1;
                if self.eat(b'`') {
                    name.push('`');
                } else {
                    break;
                }
            }
            if name.is_empty() {
                return Err(self.error_at(start, "a field name may not be empty"));
            }
            return Ok(name);
        }
        match self.word() {
            Some(w) => Ok(w.to_owned()),
            None => Err(self.error(format!("expected a field name, found {}", self.found()))),
        }
    }

    /// Skips a `'...'` or `"..."` literal with backslash escapes (COMMENT text is ignored).
    fn string_literal(&mut self) -> Result<(), SchemaError> {
        let start = self.pos;
        let Some(quote @ (b'\'' | b'"')) = self.peek() else {
            return Err(self.error(format!(
                "expected a quoted comment after COMMENT, found {}",
                self.found()
            )));
        };
        self.pos += 1;
        loop {
            match self.peek() {
                None => return Err(self.error_at(start, "unterminated comment string")),
                Some(b'\\') => self.pos += 2.min(self.src.len() - self.pos),
                Some(b) if b == quote => {
                    self.pos += 1;
                    // SQL writes a quote inside a literal by doubling it.
                    if self.peek() != Some(quote) {
                        return Ok(());
                    }
                    self.pos += 1;
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    fn parse_type(&mut self) -> Result<DataType, SchemaError> {
        self.skip_ws();
        if self.depth >= MAX_DEPTH {
            return Err(self.error(format!("types nest more than {MAX_DEPTH} levels deep")));
        }
        self.depth += 1;
        let ty = self.parse_type_inner();
        self.depth -= 1;
        ty
    }

    fn parse_type_inner(&mut self) -> Result<DataType, SchemaError> {
        let start = self.pos;
        let Some(word) = self.word() else {
            return Err(self.error(format!("expected a type name, found {}", self.found())));
        };
        let ty = match word.to_ascii_lowercase().as_str() {
            "boolean" | "bool" => DataType::Boolean,
            // Statebox has one 32-bit integer type; narrower Spark integers widen to it.
            "int" | "integer" | "smallint" | "short" | "tinyint" | "byte" => DataType::Int,
            "bigint" | "long" => DataType::Long,
            "float" | "real" => DataType::Float,
            "double" => DataType::Double,
            "string" => DataType::String,
            "varchar" | "char" | "character" => {
                self.length_suffix(word)?;
                DataType::String
            }
            "binary" => DataType::Binary,
            "timestamp" | "timestamp_ltz" | "timestamp_ntz" => DataType::Timestamp,
            "date" => DataType::Date,
            "array" => {
                self.expect(b'<', "after `array`")?;
                let element = self.parse_type()?;
                let contains_null = !self.not_null()?;
                self.expect(b'>', "to close `array<`")?;
                DataType::Array {
                    element: Box::new(element),
                    contains_null,
                }
            }
            "map" => {
                self.expect(b'<', "after `map`")?;
                let key = self.parse_type()?;
                self.expect(b',', "between the key and value types of `map<`")?;
                let value = self.parse_type()?;
                let value_contains_null = !self.not_null()?;
                self.expect(b'>', "to close `map<`")?;
                DataType::Map {
                    key: Box::new(key),
                    value: Box::new(value),
                    value_contains_null,
                }
            }
            "struct" => {
                self.expect(b'<', "after `struct`")?;
                let mut fields = Vec::new();
                self.skip_ws();
                if !self.eat(b'>') {
                    loop {
                        self.parse_field_into(&mut fields)?;
                        self.skip_ws();
                        if self.eat(b',') {
                            continue;
                        }
                        if self.eat(b'>') {
                            break;
                        }
                        return Err(self.error(format!(
                            "expected `,` or `>` in `struct<`, found {}",
                            self.found()
                        )));
                    }
                }
                DataType::Struct(StructType::new(fields))
            }
            "decimal" | "dec" | "numeric" | "interval" | "void" | "variant" | "object" | "time" => {
                return Err(self.error_at(
                    start,
                    format!(
                        "type `{word}` is not supported (supported: boolean, int, long, float, \
                         double, string, binary, timestamp, date, array, map, struct)"
                    ),
                ));
            }
            _ => return Err(self.error_at(start, format!("unknown type `{word}`"))),
        };
        Ok(ty)
    }

    /// Parses the optional `NOT NULL` after an array element or map value type.
    fn not_null(&mut self) -> Result<bool, SchemaError> {
        self.skip_ws();
        if !self.eat_keyword("not") {
            return Ok(false);
        }
        self.skip_ws();
        if !self.eat_keyword("null") {
            return Err(self.error(format!("expected NULL after NOT, found {}", self.found())));
        }
        Ok(true)
    }

    /// Parses the `(n)` of `varchar(n)` / `char(n)`; the length is not enforced.
    fn length_suffix(&mut self, word: &str) -> Result<(), SchemaError> {
        self.expect(b'(', &format!("and a length after `{word}`"))?;
        self.skip_ws();
        if !self
            .word()
            .is_some_and(|w| w.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(self.error(format!("expected a length in `{word}(...)`")));
        }
        self.expect(b')', &format!("to close `{word}(`"))
    }
}
