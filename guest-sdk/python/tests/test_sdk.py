"""Unit tests of the SDK's pure-Python parts (types, DDL, Row, value codec, async scheduler,
signature checks), under plain CPython: `python3 -m unittest discover -s guest-sdk/python/tests`.

The parts that talk to the host are tested end to end, in components, by the Rust test suite
(`tests/all/python.rs` and the `tests/scenarios/*-py.json` scenarios).
"""

import asyncio
import datetime
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from statebox import _codec, _component, aio  # noqa: E402
from statebox.processor import StatefulProcessor, _Codec  # noqa: E402
from statebox.row import Row  # noqa: E402
from statebox.types import (  # noqa: E402
    ArrayType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    parse_ddl,
    to_ddl,
)


class DdlTest(unittest.TestCase):
    def test_field_lists_and_single_types(self):
        self.assertEqual(
            parse_ddl("name string, visits int"),
            StructType([StructField("name", StringType()), StructField("visits", IntegerType())]),
        )
        self.assertEqual(parse_ddl("long"), LongType())
        self.assertEqual(parse_ddl("array<string>"), ArrayType(StringType()))
        self.assertEqual(
            parse_ddl("m map<string, array<long NOT NULL>>")["m"].dataType,
            MapType(StringType(), ArrayType(LongType(), False)),
        )
        nested = parse_ddl("address struct<city: string, zip: int> NOT NULL COMMENT 'x'")
        self.assertFalse(nested["address"].nullable)
        self.assertEqual(nested["address"].dataType.names, ["city", "zip"])
        self.assertEqual(parse_ddl("`odd name` bigint").names, ["odd name"])

    def test_struct_types_become_ddl_the_host_reads(self):
        schema = StructType().add("count", LongType()).add("tags", "array<string>")
        self.assertEqual(to_ddl(schema), "count long, tags array<string>")
        self.assertEqual(parse_ddl(to_ddl(schema)), schema)
        self.assertEqual(to_ddl(StructType([StructField("a b", LongType(), False)])), "`a b` long NOT NULL")

    def test_bad_ddl_is_named(self):
        with self.assertRaisesRegex(ValueError, "unknown type 'strng'"):
            parse_ddl("name strng")
        with self.assertRaisesRegex(ValueError, "duplicate field name 'a'"):
            parse_ddl("a int, a long")


class RowTest(unittest.TestCase):
    def test_named_fields(self):
        row = Row(user="u1", count=3)
        self.assertEqual(row, ("u1", 3))
        self.assertEqual((row.user, row["count"], row[0]), ("u1", 3, "u1"))
        self.assertEqual(row.asDict(), {"user": "u1", "count": 3})
        self.assertEqual(repr(row), "Row(user='u1', count=3)")
        self.assertIn("user", row)
        with self.assertRaises(AttributeError):
            row.missing

    def test_row_classes(self):
        Point = Row("x", "y")
        self.assertEqual(Point(1, 2).asDict(), {"x": 1, "y": 2})


class CodecTest(unittest.TestCase):
    def test_struct_values_are_tuples(self):
        codec = _Codec("time long, location string", "a value")
        self.assertEqual(codec.dumps((3, "SF")), '{"time":3,"location":"SF"}')
        self.assertEqual(codec.dumps(Row(location="SF", time=3)), '{"time":3,"location":"SF"}')
        self.assertEqual(codec.dumps({"time": 3, "location": "SF"}), '{"time":3,"location":"SF"}')
        value = codec.loads('{"location":"SF","time":3}')
        self.assertEqual(value, (3, "SF"))
        self.assertEqual(value.location, "SF")
        with self.assertRaisesRegex(ValueError, "needs 2 item"):
            codec.dumps((3,))
        with self.assertRaisesRegex(ValueError, "cannot be None"):
            codec.dumps(None)

    def test_single_types_are_bare_values(self):
        codec = _Codec("long", "a value")
        self.assertEqual(codec.dumps(5), "5")
        self.assertEqual(codec.loads("5"), 5)

    def test_nested_and_special_types(self):
        codec = _Codec(
            "at timestamp, day date, raw binary, tags array<string>, "
            "counts map<int, long>, home struct<city: string>",
            "a value",
        )
        at = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
        text = codec.dumps((at, datetime.date(2024, 1, 2), b"hi", ["a"], {1: 2}, ("Oslo",)))
        self.assertEqual(
            text,
            '{"at":1704067200000,"day":"2024-01-02","raw":"aGk=","tags":["a"],'
            '"counts":{"1":2},"home":{"city":"Oslo"}}',
        )
        back = codec.loads(text)
        self.assertEqual(back.at, at)
        self.assertEqual(back.day, datetime.date(2024, 1, 2))
        self.assertEqual(back.raw, b"hi")
        self.assertEqual(back.counts, {1: 2})
        self.assertEqual(back.home.city, "Oslo")

    def test_output_rows(self):
        encode = _codec.row_encoder(parse_ddl("key string, count long"))
        self.assertEqual(encode(Row(key="a", count=1)), '{"key":"a","count":1}')
        self.assertEqual(encode(("a", 1)), '{"key":"a","count":1}')
        self.assertEqual(encode({"key": "é", "count": 1}), '{"key":"é","count":1}')
        with self.assertRaisesRegex(ValueError, "output schema has 2 field"):
            encode(("a",))

    def test_input_rows_decode_lazily_and_name_bad_rows(self):
        rows = _component._Rows(['{"a":1,"b":{"c":2}}', '{"a":2}'])
        self.assertEqual(len(rows), 2)
        first, second = list(rows)
        self.assertEqual((first.a, first.b.c, second.a), (1, 2, 2))
        with self.assertRaises(_component.BadInputRow) as err:
            list(_component._Rows(['{"a":1}', "{nope"]))
        self.assertEqual(err.exception.index, 1)


class AsyncTest(unittest.TestCase):
    def test_gather_and_sleep(self):
        order = []

        async def work(name):
            order.append(name + "1")
            await aio.sleep(0)
            await asyncio.sleep(0)
            order.append(name + "2")
            return name

        async def main():
            return await aio.gather(work("a"), work("b"))

        self.assertEqual(aio.run(main()), ["a", "b"])
        self.assertEqual(order, ["a1", "b1", "a2", "b2"])

    def test_keys_interleave_but_each_keeps_its_order(self):
        log = []

        def call(key, n):
            async def go():
                log.append((key, n, "start"))
                await aio.sleep(0)
                log.append((key, n, "end"))
                return n

            return go

        results = aio.run_keys({"a": [call("a", 1), call("a", 2)], "b": [call("b", 1)]})
        self.assertEqual(results, {"a": [1, 2], "b": [1]})
        for key in ("a", "b"):
            mine = [entry for entry in log if entry[0] == key]
            self.assertEqual(mine, sorted(mine, key=lambda e: (e[1], e[2] == "end")))
        # Key b ran while key a was suspended.
        self.assertLess(log.index(("b", 1, "start")), log.index(("a", 1, "end")))

    def test_an_asyncio_future_is_refused_clearly(self):
        async def wait():
            await asyncio.sleep(1)

        with self.assertRaisesRegex(RuntimeError, "cannot wait for"):
            aio.run(wait())


class SignatureTest(unittest.TestCase):
    def test_pyspark_signatures_pass(self):
        class Good(StatefulProcessor):
            def init(self, handle):
                pass

            def handleInputRows(self, key, rows, timerValues):
                return []

            def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
                return []

        self.assertFalse(_component.check_processor(Good, "p.py"))

    def test_a_missing_parameter_is_named(self):
        class Bad(StatefulProcessor):
            def init(self, handle):
                pass

            def handleInputRows(self, key, rows):
                return []

        with self.assertRaisesRegex(
            _component.ProcessorDefinitionError,
            r"p\.py:\d+: Bad\.handleInputRows\(self, key, rows\) cannot be called",
        ):
            _component.check_processor(Bad, "p.py")


if __name__ == "__main__":
    unittest.main()
