"""Converting Python values to and from the JSON the host stores, given a schema.

A struct is a tuple (or ``Row``) on the Python side and a JSON object on the host's; arrays
are lists, maps dicts, ``timestamp`` a ``datetime`` (UTC), ``date`` a ``date``, ``binary``
``bytes``. Converters are built once per state variable, and types whose JSON is already
the Python value (numbers, strings, booleans) cost nothing.
"""

import base64
import datetime
import functools
import json
import struct as _struct

from .row import Row, row_maker
from .types import (
    ArrayType,
    BinaryType,
    DateType,
    DoubleType,
    FloatType,
    MapType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

def _unsupported(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _fast_json():
    """Compact JSON encoding and decoding through the C accelerators directly.

    ``json.dumps``/``json.loads`` go through two or three Python-level calls before reaching
    the C code; for the small values a processor exchanges with the host on every state
    operation, calling it directly is about three times faster. Falls back to the public
    functions if this CPython's accelerators differ."""
    encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    loads = json.loads
    try:
        from json.encoder import c_make_encoder, encode_basestring

        chunks = c_make_encoder(
            None, _unsupported, encode_basestring, None, ":", ",", False, False, True
        )
        scan = json.JSONDecoder().scan_once
        sample = {"a": [1, 2.5, "é\"", None, True]}
        if "".join(chunks(sample, 0)) != encode(sample) or scan(encode(sample), 0)[0] != sample:
            return encode, loads
    except (ImportError, TypeError, ValueError):
        return encode, loads

    def fast_dumps(value):
        return "".join(chunks(value, 0))

    def fast_loads(text):
        # The host sends compact, valid JSON: no surrounding whitespace to skip, and nothing
        # after the value.
        try:
            return scan(text, 0)[0]
        except StopIteration:
            return loads(text)

    return fast_dumps, fast_loads


_dumps, _loads = _fast_json()
# The C scanner when the fast JSON path is available (``scan(text, 0)[0]`` decodes a whole
# valid text; it raises StopIteration on invalid input), else None.
scan = json.JSONDecoder().scan_once if _loads is not json.loads else None
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def dumps(value):
    """Compact JSON text of an already converted value."""
    return _dumps(value)


def loads(text):
    return _loads(text)


def _ts_from_json(v):
    if isinstance(v, int):
        return _EPOCH + datetime.timedelta(milliseconds=v)
    if isinstance(v, str):
        text = v.replace(" ", "T", 1)
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        parsed = datetime.datetime.fromisoformat(text)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.timezone.utc)
        return parsed
    return v


def _ts_to_json(v):
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.timezone.utc)
        return (v - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(v, datetime.date):
        return v.isoformat()
    return v


def _date_from_json(v):
    return datetime.date.fromisoformat(v) if isinstance(v, str) else v


def _date_to_json(v):
    if isinstance(v, datetime.datetime):
        return v.date().isoformat()
    if isinstance(v, datetime.date):
        return v.isoformat()
    return v


def _binary_from_json(v):
    return base64.b64decode(v) if isinstance(v, str) else v


def _binary_to_json(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    return v


def _float_to_json(v):
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _map_key_from_json(key_type):
    dec = decoder(key_type)
    if isinstance(key_type, (StructType, ArrayType, MapType)):
        return lambda k: dec(_loads(k))
    from .types import BooleanType, ByteType, IntegerType, LongType, ShortType

    if isinstance(key_type, (IntegerType, LongType, ShortType, ByteType)):
        return int
    if isinstance(key_type, (FloatType, DoubleType)):
        return float
    if isinstance(key_type, BooleanType):
        return lambda k: k == "true"
    return dec or (lambda k: k)


def _map_key_to_json(key_type):
    enc = encoder(key_type)
    if isinstance(key_type, (StructType, ArrayType, MapType)):
        return lambda k: _dumps(enc(k) if enc else k)

    def key(k):
        if enc:
            k = enc(k)
        if isinstance(k, bool):
            return "true" if k else "false"
        return k if isinstance(k, str) else str(k)

    return key


def plain_struct_fields(dt):
    """For a struct whose fields all read as their JSON values: ``(names, make)``, the field
    names and the C-level constructor of its Rows (what :func:`decoder` builds such a Row
    with), else None."""
    if not isinstance(dt, StructType) or any(decoder(f.dataType) for f in dt.fields):
        return None
    fields = tuple(dt.names)
    return fields, row_maker(fields)


def decoder(dt):
    """A function from the host's JSON value (already parsed) to the Python value, or
    ``None`` when they are the same."""
    if isinstance(dt, StructType):
        names = list(dt.names)
        subs = [decoder(f.dataType) for f in dt.fields]
        make = Row._make
        if not any(subs):
            fields = tuple(names)
            fast = row_maker(fields)

            def struct(obj):
                if obj is None:
                    return None
                return fast(map(obj.get, fields))

            return struct
        pairs = list(zip(names, subs))

        def struct_conv(obj):
            if obj is None:
                return None
            values = []
            for n, s in pairs:
                v = obj.get(n)
                values.append(s(v) if s is not None and v is not None else v)
            return make(names, values)

        return struct_conv
    if isinstance(dt, ArrayType):
        sub = decoder(dt.elementType)
        if sub is None:
            return None
        return lambda arr: None if arr is None else [None if x is None else sub(x) for x in arr]
    if isinstance(dt, MapType):
        key = _map_key_from_json(dt.keyType)
        sub = decoder(dt.valueType)
        return lambda obj: None if obj is None else {
            key(k): (sub(v) if sub is not None and v is not None else v) for k, v in obj.items()
        }
    if isinstance(dt, (TimestampType, TimestampNTZType)):
        return _ts_from_json
    if isinstance(dt, DateType):
        return _date_from_json
    if isinstance(dt, BinaryType):
        return _binary_from_json
    if isinstance(dt, FloatType):
        # Spark's float state holds single precision: 0.1 + 0.2 reads back as
        # 0.30000001192092896.
        return to_f32
    return None


def encoder(dt):
    """A function from a Python value to its JSON value for the host (before ``dumps``), or
    ``None`` when they are the same."""
    if isinstance(dt, StructType):
        names = list(dt.names)
        subs = [encoder(f.dataType) for f in dt.fields]
        plain = not any(subs)
        width = len(names)

        def struct(value):
            if value is None:
                return None
            if isinstance(value, dict):
                items = [value.get(n) for n in names]
            elif isinstance(value, tuple):
                fields = getattr(value, "__fields__", None)
                if fields is not None and fields != names:
                    if len(fields) != width or set(fields) != set(names):
                        raise ValueError(
                            f"Row fields {fields} do not match the schema's fields {names}"
                        )
                    value = [value[fields.index(n)] for n in names]
                elif len(value) != width:
                    raise ValueError(
                        f"a value of schema ({', '.join(names)}) needs {width} item(s), "
                        f"got {len(value)}: {value!r}"
                    )
                items = value
            elif width == 1:
                # A one-field struct given as its bare value, a common slip; accept it.
                items = (value,)
            else:
                raise TypeError(
                    f"a value of schema ({', '.join(names)}) must be a tuple, Row or dict, "
                    f"got {type(value).__name__}"
                )
            if plain:
                return dict(zip(names, items))
            return {
                n: (s(v) if s is not None and v is not None else v)
                for n, s, v in zip(names, subs, items)
            }

        return struct
    if isinstance(dt, ArrayType):
        sub = encoder(dt.elementType)
        if sub is None:
            return lambda arr: None if arr is None else list(arr)
        return lambda arr: None if arr is None else [None if x is None else sub(x) for x in arr]
    if isinstance(dt, MapType):
        key = _map_key_to_json(dt.keyType)
        sub = encoder(dt.valueType)
        return lambda obj: None if obj is None else {
            key(k): (sub(v) if sub is not None and v is not None else v) for k, v in obj.items()
        }
    if isinstance(dt, (TimestampType, TimestampNTZType)):
        return _ts_to_json
    if isinstance(dt, DateType):
        return _date_to_json
    if isinstance(dt, BinaryType):
        return _binary_to_json
    if isinstance(dt, (FloatType, DoubleType)):
        return _float_to_json
    return None


# --- input rows, as PySpark hands them to handleInputRows ---------------------------------

_F32 = _struct.Struct("<f")


def to_f32(v):
    """A number rounded to single precision, as Spark's ``float`` holds it (0.1 reads back
    as 0.10000000149011612). Values out of its range become +/-inf, as a Java float cast."""
    if v is None or isinstance(v, bool):
        return v
    try:
        return _F32.unpack(_F32.pack(v))[0]
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")
    except _struct.error:
        return v


def _input_ts(v):
    # Spark hands timestamps over in the session time zone; Statebox's is UTC.
    return _ts_from_json(v).astimezone(datetime.timezone.utc) if v is not None else None


def _input_ts_ntz(v):
    if v is None:
        return None
    parsed = _ts_from_json(v)
    return parsed.replace(tzinfo=None) if isinstance(parsed, datetime.datetime) else parsed


def input_value(dt):
    """A function from an input column's JSON value to the Python value PySpark 4.3 hands a
    row-based handler for type ``dt``, or None when they are the same: ``float`` rounded to
    single precision, ``struct`` a ``dict``, ``map`` a list of ``(key, value)`` tuples,
    ``timestamp`` an aware ``datetime`` (UTC), ``date`` a ``date``, ``binary`` ``bytes``."""
    from .types import FloatType as _Float

    if isinstance(dt, _Float):
        return to_f32
    if isinstance(dt, StructType):
        subs = [(f.name, input_value(f.dataType)) for f in dt.fields]

        def struct(obj):
            if obj is None:
                return None
            if isinstance(obj, list):
                obj = dict(zip((n for n, _ in subs), obj))
            return {
                n: (s(obj.get(n)) if s is not None and obj.get(n) is not None else obj.get(n))
                for n, s in subs
            }

        return struct
    if isinstance(dt, MapType):
        key = _map_key_from_json(dt.keyType)
        sub = input_value(dt.valueType)

        def pairs(obj):
            if obj is None:
                return None
            return [
                (key(k), sub(v) if sub is not None and v is not None else v)
                for k, v in obj.items()
            ]

        return pairs
    if isinstance(dt, ArrayType):
        sub = input_value(dt.elementType)
        if sub is None:
            return None
        return lambda arr: None if arr is None else [None if x is None else sub(x) for x in arr]
    if isinstance(dt, TimestampType):
        return _input_ts
    if isinstance(dt, TimestampNTZType):
        return _input_ts_ntz
    if isinstance(dt, DateType):
        return _date_from_json
    if isinstance(dt, BinaryType):
        return _binary_from_json
    return None


class InputRows:
    """Makes the input rows of a call the way PySpark hands them over: a ``Row`` per record
    with the input schema's columns in the schema's order, a column absent from the record
    as ``None``, and values of the schema's types (see :func:`input_value`).

    Without a schema (no ``INPUT_SCHEMA``), the columns are those of the call's records, in
    the order first seen, and a column a record lacks reads as ``None``, as it would under
    the schema Spark infers from JSON; nested objects are ``dict``s, as Spark's inferred
    structs are."""

    __slots__ = ("names", "convs", "plain", "_make")

    def __init__(self, schema=None):
        if schema is None:
            self.names = None
            self.convs = None
            self.plain = True
            self._make = None
        else:
            self.names = tuple(schema.names)
            self.convs = [input_value(f.dataType) for f in schema.fields]
            self.plain = not any(self.convs)
            self._make = row_maker(self.names)

    def lists_reader(self, columns):
        """``from_lists`` for ``columns``, made once for the many keys of a call: a function
        from a list of value arrays to an iterator of Rows (C-level ``map`` when the values
        need no conversion)."""
        names = self.names
        if self.plain and (names is None or tuple(columns) == names):
            make = self._make if names is not None else row_maker(tuple(columns))
            return functools.partial(map, make)
        return functools.partial(self.from_lists, columns)

    def from_lists(self, columns, lists):
        """Rows from value arrays whose items are the values of ``columns``, in order."""
        names = self.names
        if names is None or tuple(columns) == names:
            make = self._make if names is not None else row_maker(tuple(columns))
            if self.plain:
                return map(make, lists)
            convs = self.convs
            return (
                make([v if c is None or v is None else c(v) for c, v in zip(convs, values)])
                for values in lists
            )
        index = {c: i for i, c in enumerate(columns)}
        picks = [(index.get(n), c) for n, c in zip(names, self.convs)]
        make = self._make

        def one(values):
            out = []
            for i, c in picks:
                v = None if i is None else values[i]
                out.append(v if c is None or v is None else c(v))
            return make(out)

        return map(one, lists)

    def from_dicts(self, dicts):
        """Rows from JSON objects (column name -> value)."""
        names = self.names
        if names is None:
            shapes = set(map(tuple, dicts))
            if len(shapes) == 1:
                return map(row_maker(shapes.pop()), map(dict.values, dicts))
            seen = {}
            for d in dicts:
                for k in d:
                    seen.setdefault(k, None)
            names = tuple(seen)
            make = row_maker(names)
            return (make(map(d.get, names)) for d in dicts)
        make = self._make
        if self.plain:
            return (make(map(d.get, names)) for d in dicts)
        pairs = list(zip(names, self.convs))
        return (
            make([
                v if c is None or v is None else c(v)
                for v, c in ((d.get(n), c) for n, c in pairs)
            ])
            for d in dicts
        )


def plain(value):
    """An output value as JSON-able data without a schema: Rows with names become objects,
    tuples and lists arrays, datetimes epoch milliseconds, bytes base64."""
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if isinstance(value, Row):
        fields = getattr(value, "__fields__", None)
        if fields is not None:
            return {k: plain(v) for k, v in zip(fields, value)}
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, datetime.datetime):
        return _ts_to_json(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _binary_to_json(value)
    raise TypeError(f"cannot emit a value of type {t.__name__}: {value!r}")


def f32_text_value(v):
    """A float column's value as Spark writes it: rounded to single precision, as the
    shortest decimal that reads back to the same single-precision value (``0.1 + 0.2``
    stored as ``float`` is written ``0.3``, as Java's ``Float.toString`` prints it)."""
    if type(v) is bool or not isinstance(v, (int, float)):
        return v
    narrowed = to_f32(v)
    if narrowed != narrowed or narrowed in (float("inf"), float("-inf")):
        return narrowed
    for digits in range(1, 10):
        short = float("%.*g" % (digits, narrowed))
        if to_f32(short) == narrowed:
            return short
    return narrowed


def _output_fixers(output_schema):
    """Per output column, a function that turns an emitted value into the JSON value for the
    host, or None when nothing needs doing (most columns)."""
    from .types import StringType

    fixers = {}
    for f in output_schema.fields:
        if isinstance(f.dataType, FloatType):
            fixers[f.name] = f32_text_value
        elif isinstance(f.dataType, StringType):
            name = f.name

            def string_column(v, name=name):
                if isinstance(v, tuple):
                    # Most often `Row(id=key)` with the key tuple: PySpark fails on it too
                    # (pyarrow: "Expected bytes, got a 'tuple' object").
                    raise TypeError(
                        f"output column {name!r} is a string but the row gives the tuple "
                        f"{v!r}; the grouping key is a tuple of the key columns' values: "
                        f"emit key[0] for a single key column"
                    )
                return v

            fixers[f.name] = string_column
    return fixers


def row_encoder(output_schema):
    """A function from an emitted row (a ``Row``, a ``dict``, or a plain tuple in the output
    schema's field order) to its JSON text. As in PySpark, a ``Row`` or dict that leaves out
    a column of the schema emits that column as ``null`` (the host refuses it if the column
    is NOT NULL), ``float`` columns hold single-precision values, and columns are written in
    the schema's order."""
    names = list(output_schema.names) if isinstance(output_schema, StructType) else None
    prims = (str, int, float, bool, type(None))
    texts = _struct_texts(output_schema)
    # Takes a Row as it is (no copy into a plain tuple): its fields are checked first.
    text = texts[1] if texts is not None else None
    width = len(names) if names is not None else -1
    fixers = _output_fixers(output_schema) if names is not None else {}

    def fill(pairs):
        # Schema columns first, in order (absent ones null), then any extra the host refuses.
        obj = dict.fromkeys(names) if names is not None else {}
        for k, v in pairs:
            fix = fixers.get(k)
            if fix is not None and v is not None:
                v = fix(v)
            obj[k] = v if type(v) in prims else plain(v)
        return obj

    def encode(row):
        if isinstance(row, tuple):
            fields = getattr(row, "__fields__", None)
            if text is not None and len(row) == width and (fields is None or fields == names):
                # Fields in the schema's order, plain values: concatenate the text.
                fast = text(row)
                if fast is not None:
                    return fast
            if fields is None:
                if names is None:
                    raise TypeError("emitted rows must be Rows with field names or dicts")
                if len(row) != len(names):
                    raise ValueError(
                        f"an emitted tuple has {len(row)} item(s) but the output schema has "
                        f"{len(names)} field(s) ({', '.join(names)}): {row!r}"
                    )
                fields = names
            if not fixers and fields == names:
                obj = {}
                for k, v in zip(fields, row):
                    obj[k] = v if type(v) in prims else plain(v)
                return _dumps(obj)
            return _dumps(fill(zip(fields, row)))
        if isinstance(row, dict):
            return _dumps(fill((str(k), v) for k, v in row.items()))
        raise TypeError(
            f"a processor must emit Rows (or dicts or tuples), got {type(row).__name__}: {row!r}"
        )

    return encode


def struct_text(dt, fallback=None):
    """For a struct whose fields are all strings, integers or booleans: a function from a
    plain tuple to its JSON object text, built by string concatenation (about three times
    faster than through a dict and the JSON encoder). For any other value it returns
    ``fallback(value)`` (None without a fallback), which then takes the general path. None if
    the schema is not such a struct.

    The function is on every state write's path, so it runs one Python frame: the common
    types are handled inline, and the fallback is called only for what it cannot write."""
    texts = _struct_texts(dt, fallback)
    return None if texts is None else texts[0]


def _struct_texts(dt, fallback=None):
    """``(checked, unchecked)``: ``checked`` is :func:`struct_text`'s function; ``unchecked``
    takes any tuple of the struct's width (a ``Row`` whose fields the caller has matched to
    the schema's), so the caller need not copy it into a plain tuple first."""
    from .types import BooleanType, ByteType, IntegerType, LongType, ShortType, StringType

    plain = (BooleanType, ByteType, IntegerType, LongType, ShortType, StringType)
    if not isinstance(dt, StructType) or not dt.fields:
        return None
    if not all(isinstance(f.dataType, plain) for f in dt.fields):
        return None
    from json.encoder import encode_basestring

    if fallback is None:

        def fallback(value):
            return None

    quote = encode_basestring
    prefixes = tuple(("{" if i == 0 else ",") + quote(n) + ":" for i, n in enumerate(dt.names))
    width = len(prefixes)

    if width == 1:
        (p0,) = prefixes

        def one_unchecked(value, _int=int, _str=str, _repr=int.__repr__):
            v = value[0]
            t = type(v)
            if t is _int:
                return p0 + _repr(v) + "}"
            if t is _str:
                return p0 + quote(v) + "}"
            if v is None:
                return p0 + "null}"
            if t is bool:
                return p0 + ("true}" if v else "false}")
            return fallback(value)

        def one(value, _tuple=tuple, _int=int, _str=str, _repr=int.__repr__):
            if type(value) is _tuple and len(value) == 1:
                v = value[0]
                t = type(v)
                if t is _int:
                    return p0 + _repr(v) + "}"
                if t is _str:
                    return p0 + quote(v) + "}"
            return fallback(value)

        return one, one_unchecked

    def many_unchecked(value, _int=int, _str=str, _repr=int.__repr__):
        parts = []
        append = parts.append
        for p, v in zip(prefixes, value):
            t = type(v)
            if t is _int:
                append(p + _repr(v))
            elif t is _str:
                append(p + quote(v))
            elif v is None:
                append(p + "null")
            elif t is bool:
                append(p + ("true" if v else "false"))
            else:
                return fallback(value)
        append("}")
        return "".join(parts)

    def many(value, _tuple=tuple):
        if type(value) is not _tuple or len(value) != width:
            return fallback(value)
        return many_unchecked(value)

    return many, many_unchecked
