"""A whole PySpark streaming job script, read the PySpark way: a recording stand-in for
``SparkSession`` (``pyspark.sql.SparkSession``), the streaming reader and writer and the
grouped ``transformWithState`` call.

``statebox run job.py`` runs the script under CPython with this stand-in
(``python3 -m statebox._job job.py``): every call the script makes on Spark objects is
recorded, nothing runs, and the query the script built is printed as JSON for the CLI,
which then runs it with the same meaning as its own flags. Inside the component (the same
file is built into the processor) the stand-in records silently and does nothing, so the
job's module-level code is harmless there; a handler that uses the session fails the
build (``_checks.undefined_globals``).

A call Statebox does not support raises :class:`UnsupportedCall`, naming the file, the line
and the call (``statebox run`` stops with it).
"""

import inspect
import json
import os
import sys

__all__ = ["SparkSession", "DataFrame", "UnsupportedCall", "record_script"]

_RECORD = {"queries": [], "conf": {}}


class UnsupportedCall(Exception):
    """A job script called something Statebox does not provide. The message starts with
    ``file:line:``."""


class SparkFunction:
    """A ``pyspark.sql.functions`` function Statebox does not provide. Importing it works (a
    pasted file often imports more than it uses, as PySpark's own examples import ``split``
    without calling it); calling it stops the job script, or fails the build, with the
    caller's file and line, and a handler that uses it fails the build (``_checks``)."""

    def __init__(self, name):
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise UnsupportedCall(
            f"{_caller()}: pyspark.sql.functions.{self.__name__} is not supported by "
            f"Statebox: a job script's query may use col and from_json, and a processor "
            f"runs its rows in Python without Spark's column functions"
        )

    def __repr__(self):
        return f"<pyspark.sql.functions.{self.__name__}: not provided by Statebox>"


def _caller():
    """``file:line`` of the innermost frame outside this module (the script's call)."""
    for frame in inspect.stack()[2:]:
        if frame.filename != __file__:
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>:1"


def _unsupported(what, hint=""):
    raise UnsupportedCall(
        f"{_caller()}: {what} is not supported by Statebox"
        + (f": {hint}" if hint else "")
    )


class _Strict:
    """Unknown attributes are unsupported calls, named by their Spark spelling."""

    _what = "object"

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _unsupported(f"{self._what}.{name}")


def _duration_ms(text, what):
    """Milliseconds of a Spark interval string: "10 seconds", "1 minute", "500 ms". Spark
    refuses a negative one (a watermark delay, a trigger's interval)."""
    ms = _interval(text, what)
    if ms < 0:
        raise UnsupportedCall(f"{_caller()}: {what} {text!r} should not be negative, as in Spark")
    return ms


def _interval(text, what):
    if isinstance(text, (int, float)):
        return int(text)
    words = str(text).strip().lower().split()
    units = {
        "ms": 1, "millisecond": 1, "milliseconds": 1,
        "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
        "m": 60000, "min": 60000, "minute": 60000, "minutes": 60000,
        "h": 3600000, "hour": 3600000, "hours": 3600000,
        "d": 86400000, "day": 86400000, "days": 86400000,
    }
    if len(words) == 1:
        digits = words[0].rstrip("abcdefghijklmnopqrstuvwxyz")
        words = [digits, words[0][len(digits):] or "ms"]
    if len(words) == 2 and words[1] in units:
        try:
            return int(float(words[0]) * units[words[1]])
        except ValueError:
            pass
    raise UnsupportedCall(f"{_caller()}: {what} {text!r} is not an interval such as '10 seconds'")


def _schema_ddl(schema):
    from .types import to_ddl

    return to_ddl(schema)


class Column:
    """``col("x")``: a column reference by name; for a Kafka source also
    ``col("value").cast("string")`` and ``from_json(...).alias(name)``."""

    def __init__(self, name, cast=None, json_schema=None, alias=None):
        self.name = name
        self._cast = cast
        self._json = json_schema
        self._alias = alias

    def cast(self, dataType):
        ddl = dataType if isinstance(dataType, str) else _schema_ddl(dataType)
        if str(ddl).strip().lower() != "string":
            _unsupported(f"Column.cast({dataType!r})", "only cast(\"string\") of a Kafka column")
        return Column(self.name, "string", self._json, self._alias)

    astype = cast

    def alias(self, *names, **kwargs):
        if len(names) != 1:
            _unsupported("Column.alias with several names")
        return Column(self.name, self._cast, self._json, str(names[0]))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _unsupported(f"Column.{name}", "group and watermark by plain column names")


def from_json(col, schema, options=None):
    """``from_json(col("value").cast("string"), schema)``: parse a Kafka record's value."""
    if options:
        _unsupported("from_json(..., options)")
    if isinstance(col, str):
        col = Column(col)
    if not isinstance(col, Column) or col._json is not None:
        _unsupported(f"from_json of {col!r}", "parse col(\"value\").cast(\"string\")")
    return Column(col.name, col._cast, _schema_ddl(schema), None)


def _column_name(c, what):
    if isinstance(c, str):
        return c
    if isinstance(c, Column) and c._cast is None and c._json is None:
        return c.name
    _unsupported(f"{what} with {c!r}", "use column names")


# A Kafka DataFrame's columns, as Spark's Kafka source has them: name -> kind. Statebox
# splices the record's key (as a string), topic, partition, offset and timestamp into the
# row it parses from the value (`--kafka-columns`).
_KAFKA_COLUMNS = {
    "key": "binary",
    "value": "binary",
    "topic": "topic",
    "partition": "partition",
    "offset": "offset",
    "timestamp": "timestamp",
    "timestampType": "timestampType",
}
# The Spark type of each kind of column (the value's fields are the parsed schema's; a
# key cast to a string is kind "string").
_KAFKA_TYPES = {
    "binary": "binary",
    "string": "string",
    "topic": "string",
    "partition": "int",
    "offset": "long",
    "timestamp": "timestamp",
    "timestampType": "int",
}
_PARSE_HINT = (
    "parse the value as Spark's documentation does: "
    ".select(from_json(col(\"value\").cast(\"string\"), schema).alias(\"data\"))"
    ".select(\"data.*\")"
)


def _kafka_select(columns, cols):
    """The columns of ``select(*cols)`` over a Kafka DataFrame's ``columns``."""
    out = {}
    for c in cols:
        if isinstance(c, str) and c.endswith(".*"):
            kind = columns.get(c[:-2])
            if not (isinstance(kind, tuple) and kind[0] == "json"):
                _unsupported(f"select({c!r})", _PARSE_HINT)
            out[c[:-2] + ".*"] = ("fields", kind[1])
            continue
        if isinstance(c, str):
            c = Column(c)
        if not isinstance(c, Column):
            _unsupported(f"select({c!r})", _PARSE_HINT)
        kind = columns.get(c.name)
        if kind is None:
            _unsupported(f"select of column {c.name!r}, which the Kafka source does not have")
        if c._cast == "string":
            if kind not in ("binary", "string"):
                _unsupported(f"cast of Kafka column {c.name!r}")
            kind = "string"
        if c._json is not None:
            if c.name != "value" or kind != "string":
                _unsupported("from_json of a column other than the value cast to string",
                             _PARSE_HINT)
            kind = ("json", c._json)
        name = c._alias or c.name
        if kind in ("binary", "string", "timestampType") and not (
            kind == "string" and c.name == "key" and name == "key"
        ):
            _unsupported(
                f"select of Kafka column {name!r} ({c.name}, {kind})",
                "Statebox parses each record's value as a JSON row; of the other columns it "
                "adds key (as a string), topic, partition, offset and timestamp, by those names",
            )
        if isinstance(kind, str) and name != c.name:
            _unsupported(f"Kafka column {c.name!r} renamed to {name!r}", "keep Kafka's names")
        out[name] = kind
    return out


_CAST_EXPR = None


def _kafka_select_expr(columns, exprs):
    import re

    global _CAST_EXPR
    if _CAST_EXPR is None:
        _CAST_EXPR = re.compile(r"^\s*CAST\s*\(\s*(\w+)\s+AS\s+STRING\s*\)(?:\s+AS\s+(\w+))?\s*$", re.I)
    cols = []
    for e in exprs:
        m = _CAST_EXPR.match(str(e))
        if m:
            cols.append(Column(m.group(1), "string", None, m.group(2)))
        elif str(e).strip() in columns:
            cols.append(Column(str(e).strip()))
        else:
            _unsupported(f"selectExpr({e!r})", "CAST(value AS STRING) and Kafka column names")
    return _kafka_select(columns, cols)


class _Conf(_Strict):
    _what = "spark.conf"

    def set(self, key, value):
        _RECORD["conf"][str(key)] = str(value)

    def get(self, key, default=None):
        return _RECORD["conf"].get(str(key), default)

    def unset(self, key):
        _RECORD["conf"].pop(str(key), None)


class _SparkContext(_Strict):
    _what = "spark.sparkContext"

    def setLogLevel(self, level):
        pass


class _Builder(_Strict):
    _what = "SparkSession.builder"

    def appName(self, name):
        _RECORD["conf"]["spark.app.name"] = str(name)
        return self

    def master(self, master):
        return self

    def config(self, key=None, value=None, conf=None, map=None):
        if key is not None:
            _RECORD["conf"][str(key)] = str(value)
        for k, v in (map or {}).items():
            _RECORD["conf"][str(k)] = str(v)
        return self

    def enableHiveSupport(self):
        return self

    def getOrCreate(self):
        return SparkSession._active()

    def remote(self, url):
        return self


class SparkSession(_Strict):
    """The recording session: ``SparkSession.builder...getOrCreate()``, ``spark.conf``,
    ``spark.readStream`` and ``spark.read`` (for an initial state)."""

    _what = "spark"
    _instance = None

    class _BuilderDescriptor:
        def __get__(self, obj, cls):
            return _Builder()

    builder = _BuilderDescriptor()

    @classmethod
    def _active(cls):
        if cls._instance is None:
            cls._instance = SparkSession()
        return cls._instance

    @classmethod
    def getActiveSession(cls):
        return cls._active()

    @property
    def conf(self):
        return _Conf()

    @property
    def sparkContext(self):
        return _SparkContext()

    @property
    def readStream(self):
        return _Reader(streaming=True)

    @property
    def streams(self):
        return _Streams()

    @property
    def read(self):
        return _Reader(streaming=False)

    def stop(self):
        pass


class _Streams(_Strict):
    """``spark.streams``: the job's query, and waiting for it (which returns at once, as
    ``StreamingQuery.awaitTermination`` does)."""

    _what = "spark.streams"

    @property
    def active(self):
        return [StreamingQuery() for _ in _RECORD["queries"]]

    def awaitAnyTermination(self, timeout=None):
        return True

    def resetTerminated(self):
        pass


class _Reader(_Strict):
    _what = "spark.readStream"

    def __init__(self, streaming):
        self.streaming = streaming
        self._what = "spark.readStream" if streaming else "spark.read"
        self.spec = {"format": None, "schema": None, "options": {}}
        # As in Spark, a reader takes spark.sql.sources.default when it is made: the source
        # a load() without a format reads (Parquet unless the job set it).
        self._default = _RECORD["conf"].get("spark.sql.sources.default", "parquet").lower()

    def format(self, source):
        self.spec["format"] = str(source).lower()
        return self

    def schema(self, schema):
        self.spec["schema"] = _schema_ddl(schema)
        return self

    def option(self, key, value):
        self.spec["options"][str(key)] = value if isinstance(value, (int, float)) else str(value)
        return self

    def options(self, **options):
        for k, v in options.items():
            self.option(k, v)
        return self

    def load(self, path=None):
        given = self.spec["format"]
        fmt = self._default if given is None else given
        if fmt not in ("json", "kafka"):
            if given is None:
                _unsupported(
                    f"{self._what}.load() without a format",
                    f"Spark would read {fmt!r} (spark.sql.sources.default); Statebox reads "
                    "JSON Lines files and Kafka topics: give .format(\"json\")",
                )
            _unsupported(
                f"{self._what}.format({fmt!r})",
                "Statebox reads JSON Lines files and Kafka topics",
            )
        if fmt == "json":
            path = self._json_path(path)
        if path is not None:
            self.spec["path"] = str(path)
        self.spec["format"] = fmt
        self.spec["at"] = _caller()
        return DataFrame(source=dict(self.spec), streaming=self.streaming)

    # The JSON source's options Statebox reads, by lower-case name, and for each the values
    # it accepts (None: any). Spark reads JSON Lines, newest files not first, and a query
    # stops at a malformed row only under mode FAILFAST: those are what Statebox does, so
    # other values, and other options, would silently mean something else.
    _JSON_OPTIONS = {
        "path": None,
        "maxfilespertrigger": None,
        "maxbytespertrigger": None,
        "multiline": ("false",),
        "latestfirst": ("false",),
        "mode": ("failfast",),
    }

    def _json_path(self, path):
        """Checks a JSON source's options and returns its path: the argument of ``load``
        or ``json``, or option ``path`` (not both, as in Spark)."""
        option_path = None
        for name, value in self.spec["options"].items():
            lower = name.lower()
            if lower not in self._JSON_OPTIONS:
                _unsupported(
                    f"{self._what} JSON option {name!r}",
                    "it reads path, maxFilesPerTrigger, maxBytesPerTrigger, and "
                    "multiLine=false, latestFirst=false, mode=FAILFAST (a malformed row "
                    "stops the query)",
                )
            accepted = self._JSON_OPTIONS[lower]
            if accepted is not None and str(value).lower() not in accepted:
                _unsupported(
                    f"{self._what} JSON option {name}={value!r}",
                    f"Statebox reads it as {name}={accepted[0]!r} only",
                )
            if lower == "path":
                option_path = value
        if option_path is not None:
            if path is not None:
                _unsupported(
                    f"{self._what} with both option 'path' and a load path",
                    "give the path once",
                )
            path = option_path
        return path

    def json(self, path, schema=None, **options):
        if schema is not None:
            self.schema(schema)
        # As PySpark, a keyword left None sets no option.
        self.options(**{k: v for k, v in options.items() if v is not None})
        self.spec["format"] = "json"
        return self.load(path)


class DataFrame(_Strict):
    """A recorded (streaming) DataFrame: its source, watermark and grouping."""

    _what = "DataFrame"

    def __init__(self, source, streaming=True, watermark=None, kafka=None):
        self.source = source
        self.streaming = streaming
        self.watermark = watermark
        # A Kafka source's columns after select/selectExpr (None before any).
        self.kafka = kafka

    @property
    def isStreaming(self):
        return self.streaming

    def _ddl(self):
        """The DataFrame's schema as DDL (None for a file source without a schema): the
        source's; for a Kafka source, Spark's Kafka columns, or those select kept."""
        kafka = self._kafka_columns()
        if kafka is None:
            return None if self.source is None else self.source.get("schema")
        fields = []
        for name, kind in kafka.items():
            if isinstance(kind, tuple):
                fields.append(kind[1] if kind[0] == "fields" else f"{name} struct<{kind[1]}>")
            else:
                fields.append(f"{name} {_KAFKA_TYPES[kind]}")
        return ", ".join(fields)

    def _column_names(self):
        from .types import parse_ddl

        ddl = self._ddl()
        return None if ddl is None else parse_ddl(ddl).names

    @property
    def schema(self):
        from .types import parse_ddl

        ddl = self._ddl()
        if ddl is None:
            _unsupported("DataFrame.schema of a source without a schema",
                         "give the reader its schema: .schema(...)")
        return parse_ddl(ddl)

    @property
    def columns(self):
        return self.schema.names

    def __getattr__(self, name):
        # `df.id` is the column, as in PySpark; any other name is a method Statebox lacks.
        if not name.startswith("_") and name in (self._column_names() or ()):
            return Column(name)
        return _Strict.__getattr__(self, name)

    def __getitem__(self, item):
        # `df["id"]` (any case, as Spark resolves names) and `df[0]` are columns.
        names = self._column_names()
        if isinstance(item, str):
            if names is None:
                return Column(item)
            found = [n for n in names if n == item] or [
                n for n in names if n.lower() == item.lower()
            ]
            if len(found) != 1:
                raise UnsupportedCall(
                    f"{_caller()}: DataFrame[{item!r}]: the DataFrame has no column {item!r} "
                    f"(its columns: {', '.join(names)})"
                )
            return Column(found[0])
        if isinstance(item, int) and not isinstance(item, bool) and names is not None:
            return Column(names[item])
        if isinstance(item, Column):
            # Spark's df[condition] filters the rows.
            _unsupported("DataFrame[condition]", "filter the rows in the processor")
        _unsupported(f"DataFrame[{item!r}]", "name a column: df[\"name\"] or col(\"name\")")

    def withWatermark(self, eventTime, delayThreshold):
        return DataFrame(
            self.source,
            self.streaming,
            {"column": _column_name(eventTime, "withWatermark"),
             "delay_ms": _duration_ms(delayThreshold, "withWatermark delay")},
            self.kafka,
        )

    def _kafka_columns(self):
        if self.source is None or self.source.get("format") != "kafka":
            return None
        return self.kafka if self.kafka is not None else dict(_KAFKA_COLUMNS)

    def select(self, *cols):
        columns = self._kafka_columns()
        if columns is None:
            _unsupported("DataFrame.select", "Statebox hands the source's rows to the processor")
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        return DataFrame(self.source, self.streaming, self.watermark, _kafka_select(columns, cols))

    def selectExpr(self, *exprs):
        columns = self._kafka_columns()
        if columns is None:
            _unsupported("DataFrame.selectExpr", "Statebox hands the source's rows to the processor")
        return DataFrame(
            self.source, self.streaming, self.watermark, _kafka_select_expr(columns, exprs)
        )

    def _parsed_source(self):
        """The source as the query records it: for a parsed Kafka source, the value's schema
        with the Kafka columns it keeps (``kafka_columns``)."""
        if self.kafka is None:
            return self.source
        fields = [k for k, v in self.kafka.items() if isinstance(v, tuple) and v[0] == "fields"]
        if len(fields) != 1 or any(isinstance(v, tuple) and v[0] == "json" for v in self.kafka.values()):
            _unsupported("a Kafka source grouped before its value is parsed", _PARSE_HINT)
        extra = [k for k, v in self.kafka.items() if not isinstance(v, tuple)]
        source = dict(self.source)
        schema = self.kafka[fields[0]][1]
        source["schema"] = ", ".join(
            [schema] + [f"{k} {_KAFKA_TYPES[self.kafka[k]]}" for k in extra]
        )
        source["kafka_columns"] = extra
        return source

    def groupBy(self, *cols):
        if len(cols) == 1 and isinstance(cols[0], (list, tuple)):
            cols = tuple(cols[0])
        return GroupedData(self, [_column_name(c, "groupBy") for c in cols])

    groupby = groupBy

    def printSchema(self):
        pass

    @property
    def writeStream(self):
        _unsupported(
            "DataFrame.writeStream before transformWithState",
            "Statebox runs one groupBy(...).transformWithState(...) query",
        )


class GroupedData(_Strict):
    _what = "GroupedData"

    def __init__(self, df, keys):
        self.df = df
        self.keys = keys

    def transformWithState(
        self,
        statefulProcessor,
        outputStructType,
        outputMode,
        timeMode,
        initialState=None,
        eventTimeColumnName="",
    ):
        initial = None
        if initialState is not None:
            if not isinstance(initialState, GroupedData) or initialState.df.streaming:
                _unsupported(
                    "transformWithState(initialState=...) other than a batch DataFrame "
                    "grouped by the same key columns",
                    "spark.read.json(path).groupBy(...)",
                )
            initial = initialState.df.source.get("path")
        query = {
            "source": self.df._parsed_source(),
            "watermark": self.df.watermark,
            "key": self.keys,
            "processor_class": type(statefulProcessor).__name__,
            "output_schema": _schema_ddl(outputStructType),
            "output_mode": str(outputMode).lower(),
            "time_mode": str(timeMode).lower(),
            "initial_state": initial,
            "event_time_column": eventTimeColumnName or None,
            "at": _caller(),
        }
        return _Transformed(query)

    def transformWithStateInPandas(self, *args, **kwargs):
        _unsupported(
            "GroupedData.transformWithStateInPandas",
            "write the processor with the row-based API and call transformWithState",
        )


class _Transformed(DataFrame):
    _what = "DataFrame"

    def __init__(self, query):
        super().__init__(source=None)
        self.query = query

    def _ddl(self):
        return self.query["output_schema"]

    @property
    def writeStream(self):
        return _Writer(self.query)


class _Writer(_Strict):
    _what = "DataFrame.writeStream"

    def __init__(self, query):
        self.query = query
        self.sink = {"format": "json", "options": {}, "output_mode": None, "trigger": None}

    def format(self, fmt):
        fmt = str(fmt).lower()
        if fmt not in ("json", "console", "memory", "kafka"):
            _unsupported(
                f"writeStream.format({fmt!r})",
                "Statebox writes JSON Lines (json), the console, memory or Kafka",
            )
        self.sink["format"] = fmt
        return self

    def option(self, key, value):
        self.sink["options"][str(key)] = str(value)
        return self

    def options(self, **options):
        for k, v in options.items():
            self.option(k, v)
        return self

    def outputMode(self, mode):
        self.sink["output_mode"] = str(mode).lower()
        return self

    def queryName(self, name):
        self.sink["query_name"] = str(name)
        return self

    def trigger(self, processingTime=None, once=None, availableNow=None, continuous=None,
                realTime=None):
        # As PySpark: exactly one trigger, and once/availableNow only as True.
        given = [processingTime, once, availableNow, continuous, realTime]
        if len(given) - given.count(None) != 1:
            raise ValueError("Only a single trigger is allowed.")
        if continuous is not None or realTime is not None:
            _unsupported(
                "trigger(continuous=...)" if realTime is None else "trigger(realTime=...)",
                "use availableNow=True or processingTime",
            )
        if processingTime is not None:
            ms = _duration_ms(processingTime, "processingTime")
            # Spark's default trigger is processingTime 0: batches one after another.
            self.sink["trigger"] = {"interval_ms": ms} if ms > 0 else "available-now"
            return self
        name, value = ("once", once) if once is not None else ("availableNow", availableNow)
        if value is not True:
            raise ValueError(f"trigger({name}={value!r}): the value must be True")
        # Spark's once trigger reads everything available in one batch, whatever the
        # source's per-trigger limits; availableNow keeps to them over several batches.
        self.sink["trigger"] = "once" if once else "available-now"
        return self

    def foreachBatch(self, func):
        _unsupported("writeStream.foreachBatch", "write to json, console or memory")

    def start(self, path=None, **options):
        self.options(**options)
        if path is not None:
            self.sink["options"]["path"] = str(path)
        query = dict(self.query)
        query["sink"] = self.sink
        query["start_at"] = _caller()
        _RECORD["queries"].append(query)
        return StreamingQuery()

    def toTable(self, name):
        _unsupported("writeStream.toTable", "write to a path with format json")


class StreamingQuery(_Strict):
    _what = "StreamingQuery"

    def awaitTermination(self, timeout=None):
        return True

    def stop(self):
        pass

    def processAllAvailable(self):
        pass

    @property
    def id(self):
        return "statebox"


def col(name):
    return Column(str(name))


column = col


def record_script(path):
    """Runs the job script at ``path`` with the recording stand-in and returns what it
    recorded: ``{"conf": {...}, "queries": [...]}``."""
    from . import _env
    from ._component import load_module

    display = os.path.abspath(path)
    environ = _env.record_reads()
    load_module(display, display, "__statebox_job__")
    # The variables the script read go to the build of its processor, which runs the file
    # again inside the sandbox (where it sees only what the build is given).
    return dict(_RECORD, env=environ.variables_read())


def main(argv):
    if len(argv) != 2:
        print("usage: python -m statebox._job JOB.py", file=sys.stderr)
        return 2
    # Run as `python -m statebox._job`, this file is `__main__`; the script's `pyspark`
    # imports reach `statebox._job`, which is where the calls are recorded.
    from statebox import _job

    try:
        record = _job.record_script(argv[1])
    except _job.UnsupportedCall as e:
        print(json.dumps({"error": str(e)}))
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the CLI with the script's line
        from ._checks import line_in

        line = line_in(e.__traceback__, os.path.abspath(argv[1]))
        message = getattr(e, "args", [""])[0] if type(e).__name__ == "ProcessorDefinitionError" else None
        print(json.dumps({"error": message or f"{os.path.abspath(argv[1])}:{line}: {type(e).__name__}: {e}"}))
        return 0
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
