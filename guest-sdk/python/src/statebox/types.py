"""Spark SQL data types, as far as Statebox schemas need them.

Mirrors ``pyspark.sql.types``: ``StructType``, ``StructField`` and the atomic types, so a
processor written for Spark declares its state schemas unchanged. Statebox sends schemas to
the host as Spark DDL strings; :func:`to_ddl` turns a type into one, and :func:`parse_ddl`
reads one back (the host's grammar: ``"count long"``, ``"name string, visits int"``,
``"array<string>"``, ``"struct<city: string, zip: int>"``).
"""

__all__ = [
    "DataType",
    "NullType",
    "StringType",
    "BinaryType",
    "BooleanType",
    "DateType",
    "TimestampType",
    "TimestampNTZType",
    "FloatType",
    "DoubleType",
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "ArrayType",
    "MapType",
    "StructField",
    "StructType",
    "Row",
    "parse_ddl",
    "to_ddl",
]

from .row import Row


class DataType:
    """The base of every type."""

    #: The type's name in Statebox DDL.
    _ddl = ""

    def __repr__(self):
        return f"{type(self).__name__}()"

    def __eq__(self, other):
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash(str(self))

    def simpleString(self):
        return self._ddl

    def typeName(self):
        return self._ddl

    def jsonValue(self):
        return self._ddl


class NullType(DataType):
    _ddl = "void"


class StringType(DataType):
    _ddl = "string"


class BinaryType(DataType):
    _ddl = "binary"


class BooleanType(DataType):
    _ddl = "boolean"


class DateType(DataType):
    _ddl = "date"


class TimestampType(DataType):
    _ddl = "timestamp"


class TimestampNTZType(DataType):
    _ddl = "timestamp_ntz"


class FloatType(DataType):
    _ddl = "float"


class DoubleType(DataType):
    _ddl = "double"


class ByteType(DataType):
    _ddl = "tinyint"


class ShortType(DataType):
    _ddl = "smallint"


class IntegerType(DataType):
    _ddl = "int"


class LongType(DataType):
    _ddl = "long"


class ArrayType(DataType):
    """An array of ``elementType``."""

    def __init__(self, elementType, containsNull=True):
        self.elementType = elementType
        self.containsNull = containsNull

    def simpleString(self):
        not_null = "" if self.containsNull else " NOT NULL"
        return f"array<{self.elementType.simpleString()}{not_null}>"

    def __repr__(self):
        return f"ArrayType({self.elementType!r}, {self.containsNull})"


class MapType(DataType):
    """A map from ``keyType`` to ``valueType``."""

    def __init__(self, keyType, valueType, valueContainsNull=True):
        self.keyType = keyType
        self.valueType = valueType
        self.valueContainsNull = valueContainsNull

    def simpleString(self):
        not_null = "" if self.valueContainsNull else " NOT NULL"
        return f"map<{self.keyType.simpleString()}, {self.valueType.simpleString()}{not_null}>"

    def __repr__(self):
        return f"MapType({self.keyType!r}, {self.valueType!r}, {self.valueContainsNull})"


class StructField(DataType):
    """A named field of a :class:`StructType`."""

    def __init__(self, name, dataType, nullable=True, metadata=None):
        if not isinstance(name, str):
            raise TypeError(f"a StructField name must be a string, got {name!r}")
        if not isinstance(dataType, DataType):
            raise TypeError(f"the type of field {name!r} must be a DataType, got {dataType!r}")
        self.name = name
        self.dataType = dataType
        self.nullable = nullable
        self.metadata = metadata or {}

    def simpleString(self):
        not_null = "" if self.nullable else " NOT NULL"
        return f"{_quote(self.name)} {self.dataType.simpleString()}{not_null}"

    def __repr__(self):
        return f"StructField({self.name!r}, {self.dataType!r}, {self.nullable})"


class StructType(DataType):
    """A struct: an ordered list of :class:`StructField`. Values of a struct type are tuples
    (or :class:`Row`s) with one item per field, in field order."""

    def __init__(self, fields=None):
        self.fields = list(fields or [])
        for f in self.fields:
            if not isinstance(f, StructField):
                raise TypeError(f"StructType takes StructFields, got {f!r}")
        self.names = [f.name for f in self.fields]

    def add(self, field, data_type=None, nullable=True, metadata=None):
        """Appends a field, like ``pyspark.sql.types.StructType.add``; returns ``self``."""
        if isinstance(field, StructField):
            self.fields.append(field)
        else:
            if data_type is None:
                raise ValueError("StructType.add needs a data type with a field name")
            if isinstance(data_type, str):
                data_type = parse_ddl(data_type)
            self.fields.append(StructField(field, data_type, nullable, metadata))
        self.names = [f.name for f in self.fields]
        return self

    def fieldNames(self):
        return list(self.names)

    def __iter__(self):
        return iter(self.fields)

    def __len__(self):
        return len(self.fields)

    def __getitem__(self, key):
        if isinstance(key, str):
            for f in self.fields:
                if f.name == key:
                    return f
            raise KeyError(f"no field named {key!r}")
        return self.fields[key]

    def simpleString(self):
        return "struct<" + ", ".join(f.simpleString() for f in self.fields) + ">"

    def toDDL(self):
        """The field list in DDL, e.g. ``"name string, visits int"``."""
        return ", ".join(f.simpleString() for f in self.fields)

    def __repr__(self):
        return f"StructType([{', '.join(repr(f) for f in self.fields)}])"

    @classmethod
    def fromDDL(cls, ddl):
        parsed = parse_ddl(ddl)
        if not isinstance(parsed, StructType):
            raise ValueError(f"{ddl!r} is a single type, not a list of fields")
        return parsed


def _quote(name):
    if name and all(c.isalnum() or c == "_" for c in name):
        return name
    return "`" + name.replace("`", "``") + "`"


def to_ddl(schema):
    """The DDL string of a schema given as a ``StructType``, another ``DataType``, or already
    as a DDL string (returned unchanged)."""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, StructType):
        return schema.toDDL()
    if isinstance(schema, DataType):
        return schema.simpleString()
    raise TypeError(
        f"a schema must be a StructType, a DataType or a DDL string such as 'count long', "
        f"got {schema!r}"
    )


_ATOMIC = {
    "boolean": BooleanType,
    "bool": BooleanType,
    "int": IntegerType,
    "integer": IntegerType,
    "smallint": ShortType,
    "short": ShortType,
    "tinyint": ByteType,
    "byte": ByteType,
    "bigint": LongType,
    "long": LongType,
    "float": FloatType,
    "real": FloatType,
    "double": DoubleType,
    "string": StringType,
    "varchar": StringType,
    "char": StringType,
    "character": StringType,
    "binary": BinaryType,
    "timestamp": TimestampType,
    "timestamp_ltz": TimestampType,
    "timestamp_ntz": TimestampNTZType,
    "date": DateType,
}


class _Parser:
    """A recursive-descent reader of the host's DDL grammar (host/schema/src/ddl.rs)."""

    def __init__(self, text):
        self.text = text
        self.pos = 0

    def error(self, message):
        return ValueError(f"invalid schema {self.text!r}: {message} at column {self.pos}")

    def ws(self):
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self):
        self.ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def eat(self, ch):
        if self.peek() == ch:
            self.pos += 1
            return True
        return False

    def expect(self, ch):
        if not self.eat(ch):
            found = self.peek() or "the end"
            raise self.error(f"expected {ch!r}, found {found!r}")

    def word(self):
        self.ws()
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isalnum() or self.text[self.pos] == "_"
        ):
            self.pos += 1
        return self.text[start : self.pos]

    def keyword(self, kw):
        start = self.pos
        if self.word().lower() == kw:
            return True
        self.pos = start
        return False

    def name(self):
        if self.eat("`"):
            out = []
            while True:
                end = self.text.find("`", self.pos)
                if end < 0:
                    raise self.error("unterminated backquoted name")
                out.append(self.text[self.pos : end])
                self.pos = end + 1
                if self.pos < len(self.text) and self.text[self.pos] == "`":
                    out.append("`")
                    self.pos += 1
                    continue
                return "".join(out)
        name = self.word()
        if not name:
            raise self.error(f"expected a field name, found {self.peek() or 'the end'!r}")
        return name

    def skip_string(self):
        quote = self.peek()
        if quote not in ("'", '"'):
            raise self.error("expected a quoted COMMENT text")
        self.pos += 1
        while self.pos < len(self.text):
            c = self.text[self.pos]
            self.pos += 1
            if c == "\\":
                self.pos += 1
            elif c == quote:
                return
        raise self.error("unterminated string")

    def not_null(self):
        start = self.pos
        if self.keyword("not"):
            if not self.keyword("null"):
                raise self.error("expected NULL after NOT")
            return True
        self.pos = start
        return False

    def field(self):
        name = self.name()
        self.eat(":")
        data_type = self.type()
        nullable = True
        while True:
            if self.not_null():
                nullable = False
            elif self.keyword("comment"):
                self.skip_string()
            else:
                break
        return StructField(name, data_type, nullable)

    def fields(self, closing):
        fields = []
        if closing and self.eat(closing):
            return fields
        while True:
            f = self.field()
            if any(g.name == f.name for g in fields):
                raise self.error(f"duplicate field name {f.name!r}")
            fields.append(f)
            if self.eat(","):
                continue
            if closing:
                self.expect(closing)
            return fields

    def type(self):
        word = self.word()
        lower = word.lower()
        if lower in _ATOMIC:
            if lower in ("varchar", "char", "character") and self.eat("("):
                self.word()
                self.expect(")")
            return _ATOMIC[lower]()
        if lower == "array":
            self.expect("<")
            element = self.type()
            contains_null = not self.not_null()
            self.expect(">")
            return ArrayType(element, contains_null)
        if lower == "map":
            self.expect("<")
            key = self.type()
            self.expect(",")
            value = self.type()
            value_contains_null = not self.not_null()
            self.expect(">")
            return MapType(key, value, value_contains_null)
        if lower == "struct":
            self.expect("<")
            return StructType(self.fields(">"))
        if not word:
            raise self.error(f"expected a type name, found {self.peek() or 'the end'!r}")
        raise self.error(f"unknown type {word!r}")

    def schema(self):
        start = self.pos
        word = self.word()
        single = bool(word) and (self.peek() in ("", "<", "("))
        self.pos = start
        if single:
            parsed = self.type()
        else:
            parsed = StructType(self.fields(None))
        if self.peek():
            raise self.error("expected ',' or the end of the schema")
        return parsed


def parse_ddl(ddl):
    """Parses a DDL schema: a field list gives a ``StructType``, a single type its
    ``DataType`` (``"long"`` → ``LongType()``)."""
    if not isinstance(ddl, str):
        raise TypeError(f"a DDL schema is a string, got {ddl!r}")
    if not ddl.strip():
        raise ValueError("the schema is empty; expected a type such as 'long' or fields such as 'name string'")
    return _Parser(ddl).schema()


def as_type(schema):
    """A schema given as a DDL string or a ``DataType``, as a ``DataType``."""
    if isinstance(schema, str):
        return parse_ddl(schema)
    if isinstance(schema, DataType):
        return schema
    raise TypeError(
        f"a schema must be a StructType, a DataType or a DDL string such as 'count long', "
        f"got {schema!r}"
    )
