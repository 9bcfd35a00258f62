"""What a PySpark user's file meets, under plain CPython: rows in PySpark's shape, output
rows and float columns as Spark writes them, the async handle's declarations with or without
``await``, the build-time checks' messages, and job scripts read by the recording stand-in.
The same behaviour in components is checked end to end by ``tests/all/pyspark_docs.rs``."""

import datetime
import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_host  # noqa: E402

fake_host.install()

from statebox import _checks, _codec, _component, _job, aio  # noqa: E402
from statebox.processor import _Codec  # noqa: E402
from statebox.row import Row  # noqa: E402
from statebox.types import parse_ddl  # noqa: E402


class InputRowsTest(unittest.TestCase):
    schema = parse_ddl(
        "id string, f float, m map<string, int>, st struct<city: string, zip: int>, "
        "ts timestamp, missing string"
    )

    def test_rows_follow_the_schema_with_absent_columns_none(self):
        rows = list(
            _component._Rows(
                [
                    '{"id":"a","f":0.1,"m":{"k1":1},"st":{"city":"Oslo","zip":5},'
                    '"ts":"2024-01-01T00:00:00Z"}',
                    '{"f":0.2,"id":"a"}',
                ],
                None,
                _codec.InputRows(self.schema),
            )
        )
        first, second = rows
        self.assertEqual(first.__fields__, ["id", "f", "m", "st", "ts", "missing"])
        self.assertEqual(first.f, 0.10000000149011612)
        self.assertEqual(first.m, [("k1", 1)])
        self.assertEqual(first.st, {"city": "Oslo", "zip": 5})
        self.assertEqual(
            first.ts, datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
        )
        self.assertIsNone(first.missing)
        self.assertEqual(tuple(second), ("a", 0.20000000298023224, None, None, None, None))

    def test_rows_by_position_are_reordered_to_the_schema(self):
        rows = _component._Rows(
            ['[[5,"b"],[null,"c"]]'], ["f", "id"], _codec.InputRows(parse_ddl("id string, f float"))
        )
        self.assertEqual([tuple(r) for r in rows], [("b", 5.0), ("c", None)])

    def test_without_a_schema_the_calls_columns_are_united(self):
        rows = list(_component._Rows(['{"a":1}', '{"b":2,"a":3}']))
        self.assertEqual([r.__fields__ for r in rows], [["a", "b"], ["a", "b"]])
        self.assertEqual([tuple(r) for r in rows], [(1, None), (3, 2)])


class OutputTest(unittest.TestCase):
    def test_a_row_leaving_out_a_column_emits_null_in_schema_order(self):
        encode = _codec.row_encoder(parse_ddl("id string, dbg string, extra long"))
        self.assertEqual(
            json.loads(encode(Row(extra=1, id="p"))), {"id": "p", "dbg": None, "extra": 1}
        )
        self.assertEqual(list(json.loads(encode(Row(extra=1, id="p")))), ["id", "dbg", "extra"])

    def test_float_columns_are_written_as_spark_writes_them(self):
        encode = _codec.row_encoder(parse_ddl("f float, d double"))
        self.assertEqual(encode(Row(f=0.1 + 0.2, d=0.1 + 0.2)), '{"f":0.3,"d":0.30000000000000004}')
        self.assertEqual(_codec.f32_text_value(16777217), 16777216.0)

    def test_the_key_tuple_in_a_string_column_is_refused_clearly(self):
        encode = _codec.row_encoder(parse_ddl("id string, n long"))
        with self.assertRaisesRegex(TypeError, r"output column 'id' is a string.*key\[0\]"):
            encode(Row(id=("a",), n=1))

    def test_float_state_reads_back_in_single_precision(self):
        codec = _Codec("f float", "a value")
        self.assertEqual(codec.loads('{"f":0.3}'), (0.30000001192092896,))


class AsyncHandleTest(unittest.TestCase):
    def test_declarations_work_with_and_without_await(self):
        from statebox.processor import StatefulProcessorHandle

        declared = []

        class Host:
            def get_value_state(self, name, ddl, ttl):
                declared.append(name)
                return object()

            def register_timer(self, ms):
                declared.append(ms)

        handle = aio.AsyncStatefulProcessorHandle(StatefulProcessorHandle(Host(), "none"))

        async def init():
            plain = handle.getValueState("a", "n long")
            awaited = await handle.getValueState("b", "n long")
            await handle.registerTimer(5)
            handle.registerTimer(6)
            return plain, awaited

        plain, awaited = aio.run(init())
        self.assertIsInstance(plain, aio.AsyncValueState)
        self.assertIsInstance(awaited, aio.AsyncValueState)
        self.assertEqual(declared, ["a", "b", 5, 6])


class ChecksTest(unittest.TestCase):
    def load(self, source):
        tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
        self.addCleanup(Path(tmp.name).unlink)
        with tmp:
            tmp.write(source)
        return tmp.name

    def test_imports_are_explained_with_the_line(self):
        path = self.load("x = 1\nimport pandas\n")
        with self.assertRaisesRegex(
            _component.ProcessorDefinitionError, r":2: import of 'pandas' failed: pandas needs native code"
        ):
            _component.load_module(path, path, "checks_pandas")

    def test_spark_in_a_handler_is_found_with_its_line(self):
        path = self.load(
            "from pyspark.sql.streaming import StatefulProcessor\n"
            "class P(StatefulProcessor):\n"
            "    def init(self, handle):\n"
            "        pass\n"
            "    def handleInputRows(self, key, rows, timerValues):\n"
            "        return spark.sql('SELECT 1').collect()\n"
        )
        module = _component.load_module(path, path, "checks_spark")
        line, message = _checks.undefined_globals(module.P, module, module.__statebox_code__, path)
        self.assertEqual(line, 6)
        self.assertIn("P.handleInputRows uses 'spark'", message)


class JobTest(unittest.TestCase):
    def test_a_job_script_is_recorded_and_unsupported_calls_named(self):
        script = Path(__file__).resolve().parents[3] / "tests/fixtures/pyspark/job/job.py"
        _job._RECORD["queries"].clear()
        record = _job.record_script(str(script))
        (query,) = record["queries"]
        self.assertEqual(query["key"], ["id"])
        self.assertEqual(query["processor_class"], "CountProcessor")
        self.assertEqual(query["output_schema"], "id string, count long")
        self.assertEqual(query["source"]["options"], {"maxFilesPerTrigger": 1})
        self.assertEqual(query["sink"]["options"]["checkpointLocation"], "checkpoint")
        self.assertEqual(query["sink"]["trigger"], "available-now")
        df = _job.SparkSession.builder.getOrCreate().readStream.json("in")
        with self.assertRaisesRegex(_job.UnsupportedCall, "DataFrame.select is not supported"):
            df.select("x")
        self.assertEqual(
            df.withWatermark("ts", "10 seconds").watermark, {"column": "ts", "delay_ms": 10000}
        )

    def test_a_json_sources_options_are_read_or_refused_by_name(self):
        spark = _job.SparkSession.builder.getOrCreate()
        # The path as an option, as Spark takes it; and options with the values Statebox
        # reads by, in any case.
        df = (
            spark.readStream.format("json")
            .option("PATH", "in")
            .option("multiLine", False)
            .option("latestFirst", "false")
            .option("mode", "FAILFAST")
            .option("maxBytesPerTrigger", "1m")
            .load()
        )
        self.assertEqual(df.source["path"], "in")
        self.assertEqual(spark.read.json("init", multiLine=None).source["options"], {})
        self.assertEqual(spark.read.option("path", "init").json(None).source["path"], "init")
        refused = [
            (lambda: spark.readStream.option("samplingRatio", 0.5).json("in"),
             r"spark.readStream JSON option 'samplingRatio' is not supported"),
            (lambda: spark.readStream.json("in", multiLine=True),
             r"spark.readStream JSON option multiLine=True is not supported by Statebox: "
             r"Statebox reads it as multiLine='false' only"),
            (lambda: spark.read.option("mode", "PERMISSIVE").json("init"),
             r"spark.read JSON option mode='PERMISSIVE' is not supported"),
            (lambda: spark.readStream.option("latestFirst", "true").json("in"),
             r"option latestFirst='true'"),
            (lambda: spark.readStream.option("path", "a").format("json").load("b"),
             r"both option 'path' and a load path is not supported by Statebox: give the "
             r"path once"),
        ]
        for call, message in refused:
            with self.assertRaisesRegex(_job.UnsupportedCall, message):
                call()
        # A Kafka source's options are the host's to check (with their own messages).
        kafka = spark.readStream.format("kafka").option("subscribe", "t").load()
        self.assertEqual(kafka.source["options"], {"subscribe": "t"})

    def test_columns_are_read_off_the_dataframe_as_in_pyspark(self):
        spark = _job.SparkSession.builder.getOrCreate()
        df = spark.readStream.schema("id string, Value long").json("in")
        self.assertEqual(df.columns, ["id", "Value"])
        self.assertEqual(_job._schema_ddl(df.schema), "id string, Value long")
        # Attribute, item (any case, as Spark resolves names) and position give the column.
        for column in (df.id, df["id"], df["ID"], df[0]):
            self.assertEqual(df.groupBy(column).keys, ["id"])
        self.assertEqual(df.groupBy(df[-1]).keys, ["Value"])
        with self.assertRaisesRegex(
            _job.UnsupportedCall,
            r"test_pyspark_compat.py:\d+: DataFrame\['nope'\]: the DataFrame has no column "
            r"'nope' \(its columns: id, Value\)",
        ):
            df["nope"]
        with self.assertRaisesRegex(
            _job.UnsupportedCall,
            r"DataFrame\[condition\] is not supported by Statebox: "
            r"filter the rows in the processor",
        ):
            df[df.id]
        # A name that is no column is a DataFrame method Statebox does not provide.
        with self.assertRaisesRegex(_job.UnsupportedCall, "DataFrame.where is not supported"):
            df.where("Value > 0")
        # Without a schema only the item form names a column.
        bare = spark.readStream.json("in")
        self.assertEqual(bare.groupBy(bare["k"]).keys, ["k"])
        with self.assertRaisesRegex(_job.UnsupportedCall, "DataFrame.k is not supported"):
            bare.k
        with self.assertRaisesRegex(
            _job.UnsupportedCall,
            r"DataFrame.schema of a source without a schema is not supported by Statebox: "
            r"give the reader its schema",
        ):
            bare.columns
        # A Kafka source has Spark's Kafka columns, and after parsing the value's fields.
        kafka = spark.readStream.format("kafka").option("subscribe", "t").load()
        self.assertEqual(kafka.columns[:2], ["key", "value"])
        parsed = kafka.select(
            _job.from_json(kafka.value.cast("string"), "user string").alias("d"), "timestamp"
        ).select("d.*", "timestamp")
        self.assertEqual(parsed.columns, ["user", "timestamp"])
        self.assertEqual(
            _job._schema_ddl(parsed.schema), "user string, timestamp timestamp"
        )
        self.assertEqual(
            _job._schema_ddl(kafka.schema),
            "key binary, value binary, topic string, partition int, offset long, "
            "timestamp timestamp, timestampType int",
        )
        self.assertEqual(parsed.groupBy(parsed.user).keys, ["user"])
        # transformWithState's result has the output schema's columns.
        out = df.groupBy("id").transformWithState(None, "id string, n long", "append", "none")
        self.assertEqual(out.columns, ["id", "n"])

    def test_triggers_are_recorded_as_spark_reads_them(self):
        spark = _job.SparkSession.builder.getOrCreate()
        writer = lambda: _job._Writer({})  # noqa: E731
        self.assertEqual(writer().trigger(once=True).sink["trigger"], "once")
        self.assertEqual(writer().trigger(availableNow=True).sink["trigger"], "available-now")
        self.assertEqual(
            writer().trigger(processingTime="5 seconds").sink["trigger"], {"interval_ms": 5000}
        )
        for kwargs in ({}, {"once": True, "availableNow": True}):
            with self.assertRaisesRegex(ValueError, "Only a single trigger is allowed"):
                writer().trigger(**kwargs)
        with self.assertRaisesRegex(ValueError, r"trigger\(once=False\): the value must be True"):
            writer().trigger(once=False)
        with self.assertRaisesRegex(_job.UnsupportedCall, r"trigger\(realTime=...\)"):
            writer().trigger(realTime="5 seconds")
        # processingTime 0 is Spark's default trigger; a negative interval or delay is refused.
        self.assertEqual(
            writer().trigger(processingTime="0 seconds").sink["trigger"], "available-now"
        )
        with self.assertRaisesRegex(
            _job.UnsupportedCall,
            r"test_pyspark_compat.py:\d+: processingTime '-1 second' should not be negative",
        ):
            writer().trigger(processingTime="-1 second")
        df = spark.readStream.schema("ts timestamp").json("in")
        with self.assertRaisesRegex(
            _job.UnsupportedCall, r"withWatermark delay '-5 seconds' should not be negative"
        ):
            df.withWatermark("ts", "-5 seconds")
        # spark.streams waits for the job's query, as awaitTermination does.
        self.assertTrue(spark.streams.awaitAnyTermination())
        spark.streams.resetTerminated()

    def test_a_source_without_a_format_is_sparks_default_source(self):
        spark = _job.SparkSession.builder.getOrCreate()
        # Spark's default source is Parquet, which Statebox does not read.
        with self.assertRaisesRegex(
            _job.UnsupportedCall,
            r"test_pyspark_compat.py:\d+: spark.readStream.load\(\) without a format is not "
            r"supported by Statebox: Spark would read 'parquet' \(spark.sql.sources.default\)",
        ):
            spark.readStream.load("in")
        with self.assertRaisesRegex(_job.UnsupportedCall, r"spark.read.load\(\) without"):
            spark.read.option("path", "init").load()
        # A job that made JSON the default reads JSON, as Spark would; a reader takes the
        # default when it is made, as Spark's does.
        made_before = spark.readStream
        spark.conf.set("spark.sql.sources.default", "JSON")
        try:
            self.assertEqual(spark.readStream.load("in").source["format"], "json")
            self.assertEqual(spark.read.option("path", "init").load().source["path"], "init")
            with self.assertRaisesRegex(_job.UnsupportedCall, r"Spark would read 'parquet'"):
                made_before.load("in")
        finally:
            spark.conf.unset("spark.sql.sources.default")


if __name__ == "__main__":
    unittest.main()
