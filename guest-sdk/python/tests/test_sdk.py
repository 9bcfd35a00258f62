"""Unit tests of the SDK's pure-Python parts (types, DDL, Row, value codec, async scheduler,
signature checks), under plain CPython: `python3 -m unittest discover -s guest-sdk/python/tests`.

The parts that talk to the host are tested end to end, in components, by the Rust test suite
(`tests/all/python.rs` and the `tests/scenarios/*-py.json` scenarios).
"""

import asyncio
import datetime
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The generated bindings' stand-ins, before the SDK binds them.
import fake_host  # noqa: E402

fake_host.install()

from statebox import _component, _codec, aio  # noqa: E402
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

    def test_the_fast_paths_write_and_read_what_the_general_path_does(self):
        # `dumps` and `loads` of a struct of strings, integers and booleans concatenate the
        # text and build the Row in one frame; every value must come out as the general
        # path (a dict through the JSON encoder, then the struct decoder) makes it.
        import json

        cases = {
            "count long": [(5,), (-7,), (2**70,), (True,), (None,), ("x",), (1.5,), Row(count=3)],
            "name string": [("calls",), ('q"uo\\te',), ("é\u2028",), (None,), (3,)],
            "a long, b string, c boolean": [
                (1, "x", True),
                (None, None, None),
                (0, "", False),
                (2.5, "y", True),
                Row(a=1, b="z", c=False),
                Row(c=True, b="w", a=2),
                {"a": 1, "b": "d", "c": True},
            ],
        }
        for ddl, values in cases.items():
            codec = _Codec(ddl, "a value")
            dt = parse_ddl(ddl)
            enc, dec = _codec.encoder(dt), _codec.decoder(dt)
            for value in values:
                with self.subTest(ddl=ddl, value=value):
                    expected = json.dumps(enc(value), separators=(",", ":"), ensure_ascii=False)
                    text = codec.dumps(value)
                    self.assertEqual(text, expected)
                    back = codec.loads(text)
                    self.assertEqual(back, dec(json.loads(text)))
                    self.assertEqual(back.__fields__, list(dt.names))
        with self.assertRaisesRegex(ValueError, "needs 3 item"):
            _Codec("a long, b string, c boolean", "a value").dumps((1, "x"))
        with self.assertRaisesRegex(TypeError, "must be a tuple, Row or dict"):
            _Codec("a long, b string", "a value").dumps(5)
        self.assertEqual(_Codec("count long", "a value").dumps(5), '{"count":5}')

    def test_output_rows_fast_and_general_paths_agree(self):
        import json

        encode = _codec.row_encoder(parse_ddl("key string, count long, ok boolean"))
        for row in (
            Row(key="a", count=1, ok=True),
            ("b", None, False),
            Row(count=2, key="c", ok=None),
            Row(key='q"', count=2**65, ok=False),
            {"key": "d", "count": 4},
        ):
            with self.subTest(row=row):
                names = ["key", "count", "ok"]
                if isinstance(row, dict):
                    obj = {n: row.get(n) for n in names}
                elif hasattr(row, "__fields__"):
                    obj = {n: row[n] for n in names}
                else:
                    obj = dict(zip(names, row))
                self.assertEqual(encode(row), json.dumps(obj, separators=(",", ":")))
        with self.assertRaisesRegex(TypeError, "emit key\\[0\\]"):
            encode(Row(key=("a",), count=1, ok=True))
        with self.assertRaisesRegex(ValueError, "output schema has 3 field"):
            encode(("a", 1))

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
        # As under the schema Spark infers from JSON: nested objects are dicts, and a column
        # one record lacks reads as None.
        self.assertEqual((first.a, first.b["c"], second.a, second.b), (1, 2, 2, None))
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


class SchedulerKeyTest(unittest.TestCase):
    """The scheduler selects a task's key (``switch``, the host's ``use-key``) before
    resuming it, as the batched export needs."""

    def run_entries(self, coros):
        self.current = None
        self.switches = []

        def switch(key):
            self.switches.append(key)
            self.current = key

        return aio.run_entries(coros, switch)

    def test_keys_interleave_each_with_its_key_current_and_in_order(self):
        log = []

        async def handler(key, steps):
            for step in range(steps):
                log.append((key, step, self.current))
                await aio.sleep(0)
            log.append((key, steps, self.current))
            return key * 10

        tasks = self.run_entries([handler(0, 2), handler(1, 2), handler(2, 1)])
        self.assertEqual([t.result for t in tasks], [0, 10, 20])
        # Every step ran with its own key current.
        self.assertTrue(all(key == current for key, _, current in log), log)
        # Each key's steps in order.
        for key in range(3):
            steps = [step for k, step, _ in log if k == key]
            self.assertEqual(steps, sorted(steps))
        # Keys interleaved: key 1 started before key 0 finished.
        self.assertLess(log.index((1, 0, 1)), log.index((0, 2, 0)))
        self.assertEqual(
            [(k, s) for k, s, _ in log],
            [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2)],
        )

    def test_no_redundant_switches(self):
        async def straight(key):
            return key

        async def suspends_once(key):
            await asyncio.sleep(0)
            return key

        self.run_entries([straight(0), straight(1), straight(2)])
        self.assertEqual(self.switches, [0, 1, 2])
        # One key alone is selected once, however often it suspends.
        self.run_entries([suspends_once(0)])
        self.assertEqual(self.switches, [0])
        self.run_entries([suspends_once(0), straight(1)])
        self.assertEqual(self.switches, [0, 1, 0])
        for previous, following in zip(self.switches, self.switches[1:]):
            self.assertNotEqual(previous, following)

    def test_gathered_coroutines_inherit_their_key(self):
        seen = []

        async def child(key, name):
            seen.append((key, name, self.current))
            await aio.sleep(0)
            seen.append((key, name, self.current))
            return name

        async def parent(key):
            first = await aio.gather(child(key, "a"), child(key, "b"))
            second = await aio.gather(child(key, "c"))
            return first + second

        async def other(key):
            for _ in range(3):
                seen.append((key, "other", self.current))
                await aio.sleep(0)

        tasks = self.run_entries([parent(0), other(1)])
        self.assertEqual(tasks[0].result, ["a", "b", "c"])
        self.assertTrue(all(key == current for key, _, current in seen), seen)
        # The two keys' work interleaved, so switches happened in between.
        self.assertIn((1, "other", 1), seen[: seen.index((0, "c", 0))])
        for previous, following in zip(self.switches, self.switches[1:]):
            self.assertNotEqual(previous, following)

    def test_errors_stay_with_their_key_and_a_failed_switch_fails_its_task(self):
        async def fails(key):
            await aio.sleep(0)
            raise ValueError(f"key {key}")

        async def fine(key):
            await aio.sleep(0)
            return key

        tasks = self.run_entries([fine(0), fails(1), fine(2)])
        self.assertEqual([t.result for t in tasks], [0, None, 2])
        self.assertEqual(str(tasks[1].error), "key 1")

        def switch(key):
            if key == 1:
                raise RuntimeError("no such entry")

        tasks = aio.run_entries([fine(0), fine(1)], switch)
        self.assertEqual(tasks[0].result, 0)
        self.assertEqual(str(tasks[1].error), "no such entry")

    def test_run_keys_switches_per_chain(self):
        order = []

        def call(key, n):
            async def go():
                order.append((key, n, self.current))
                await aio.sleep(0)
                return n

            return go

        self.current = None

        def switch(key):
            self.current = key

        results = aio.run_keys({"a": [call("a", 1), call("a", 2)], "b": [call("b", 1)]}, switch)
        self.assertEqual(results, {"a": [1, 2], "b": [1]})
        self.assertTrue(all(key == current for key, _, current in order), order)


_COUNTER = """
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
OUTPUT_SCHEMA = "key string, count long, batch long"

class Counter(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        n = 0
        for row in rows:
            if getattr(row, "boom", None):
                raise ValueError("boom in " + key[0])
            n += 1
        previous = self.count.get()
        total = n + (previous[0] if previous else 0)
        self.count.update((total,))
        yield Row(key=key[0], count=total, batch=self.handle.getQueryInfo().getBatchId())

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        yield Row(key=key[0], count=expiredTimerInfo.getExpiryTimeInMs(), batch=-1)
"""

_ASYNC_COUNTER = """
from pyspark.sql import Row
from statebox import aio
from statebox.aio import AsyncStatefulProcessor
OUTPUT_SCHEMA = "key string, count long, step long"
STEP = [0]

def step():
    STEP[0] += 1
    return STEP[0]

class Counter(AsyncStatefulProcessor):
    async def init(self, handle):
        self.handle = handle
        self.count = await handle.getValueState("count", "count long")

    async def handleInputRows(self, key, rows, timerValues):
        n = 0
        async for row in rows:
            n += 1
        previous = await self.count.get()
        yield Row(key=key[0], count=-1, step=step())
        await aio.sleep(0)
        if key[0].startswith("fail"):
            raise ValueError("failing " + key[0])
        total = n + (previous[0] if previous else 0)
        await self.count.update((total,))
        parts = await aio.gather(self.part(key), self.part(key))
        info = await self.handle.getQueryInfo()
        yield Row(key=key[0], count=total + sum(parts) - sum(parts), step=step())
        yield Row(key=key[0], count=info.getBatchId(), step=step())

    async def part(self, key):
        await aio.sleep(0)
        value = await self.count.get()
        return value[0]

    async def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        await aio.sleep(0)
        yield Row(key=key[0], count=expiredTimerInfo.getExpiryTimeInMs(), step=step())
"""


class BatchExportTest(unittest.TestCase):
    """The ``processor`` and ``batch-processor`` exports against the fake host."""

    loaded = 0

    def setUp(self):
        fake_host.HOST.reset()
        self.host = fake_host.HOST

    def export(self, source, time_mode=fake_host.TimeMode.NONE):
        BatchExportTest.loaded += 1
        tmp = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
        self.addCleanup(Path(tmp.name).unlink)
        with tmp:
            tmp.write(source)
        processor, batch = _component.export(
            tmp.name, tmp.name, f"batch_test_{BatchExportTest.loaded}"
        )
        processor().init(time_mode)
        return tmp.name, processor, batch()

    def batch(self, batch, groups, batch_id=1):
        self.host.query.batch_id = batch_id
        self.host.begin_batch([key for key, _ in groups])
        entries = [
            fake_host.KeyRows(_codec.dumps([key]), [_codec.dumps(r) for r in rows])
            for key, rows in groups
        ]
        out = batch.handle_input_batch(entries, None, fake_host.TimerValues(-1, -1))
        return [[_codec.loads(text) for text in rows] for rows in out]

    def test_rows_by_position_read_as_named_rows(self):
        source = """
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
OUTPUT_SCHEMA = "key string, fields string, n long, tags string"
class Echo(StatefulProcessor):
    def init(self, handle):
        pass
    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            yield Row(key=key[0], fields=",".join(row.__fields__), n=row.n,
                      tags=repr(row["tags"]))
"""
        _, _, batch = self.export(source)
        self.assertTrue(batch.positional_rows())
        self.host.begin_batch(["a", "b"])
        entries = [
            fake_host.KeyRows('["a"]', ['[[1,["x",null]],[2,[]]]']),
            fake_host.KeyRows('["b"]', ["[[3,null]]"]),
        ]
        out = batch.handle_input_batch(entries, ["n", "tags"], fake_host.TimerValues(-1, -1))
        rows = [[_codec.loads(text) for text in group] for group in out]
        self.assertEqual(
            rows,
            [
                [
                    {"key": "a", "fields": "n,tags", "n": 1, "tags": "['x', None]"},
                    {"key": "a", "fields": "n,tags", "n": 2, "tags": "[]"},
                ],
                [{"key": "b", "fields": "n,tags", "n": 3, "tags": "None"}],
            ],
        )

    def test_sync_batches_select_each_key_and_keep_state_per_key(self):
        _, _, batch = self.export(_COUNTER)
        groups = [("a", [{"n": 1}] * 3), ("b", [{"n": 1}]), ("c", [{"n": 1}] * 2)]
        self.assertEqual(
            self.batch(batch, groups),
            [
                [{"key": "a", "count": 3, "batch": 1}],
                [{"key": "b", "count": 1, "batch": 1}],
                [{"key": "c", "count": 2, "batch": 1}],
            ],
        )
        self.assertEqual(self.host.switches, [0, 1, 2])
        out = self.batch(batch, [("c", [{"n": 1}]), ("a", [{"n": 1}])], batch_id=2)
        self.assertEqual(
            out,
            [[{"key": "c", "count": 3, "batch": 2}], [{"key": "a", "count": 4, "batch": 2}]],
        )
        self.host.begin_batch(["x", "y"])
        timers = [
            fake_host.KeyTimer('["x"]', fake_host.ExpiredTimerInfo(5)),
            fake_host.KeyTimer('["y"]', fake_host.ExpiredTimerInfo(7)),
        ]
        out = batch.handle_expired_timers(timers, fake_host.TimerValues(10, -1))
        self.assertEqual(
            [[_codec.loads(t) for t in rows] for rows in out],
            [[{"key": "x", "count": 5, "batch": -1}], [{"key": "y", "count": 7, "batch": -1}]],
        )
        self.assertEqual(self.host.switches, [0, 1])

    def test_keys_reach_the_handler_as_tuples_of_their_columns(self):
        source = """
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
OUTPUT_SCHEMA = "key string"
class Echo(StatefulProcessor):
    def init(self, handle):
        pass
    def handleInputRows(self, key, rows, timerValues):
        yield Row(key=repr(key))
"""
        _, _, batch = self.export(source)
        keys = ['["plain"]', '["q\\"uote"]', '["back\\\\slash"]', "[1]", '["x",2]', "[null]", '[""]']
        self.host.begin_batch(keys)
        entries = [fake_host.KeyRows(k, ["[[1]]"]) for k in keys]
        out = batch.handle_input_batch(entries, ["n"], fake_host.TimerValues(-1, -1))
        self.assertEqual(
            [_codec.loads(rows[0])["key"] for rows in out],
            [
                "('plain',)",
                "('q\"uote',)",
                "('back\\\\slash',)",
                "(1,)",
                "('x', 2)",
                "(None,)",
                "('',)",
            ],
        )

    _HELD = """
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
OUTPUT_SCHEMA = "key string, count long"

class Counter(StatefulProcessor):
    HOLD_WRITES = True

    def init(self, handle):
        self.count = handle.getValueState("count", "count long")

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            if row.op == "add":
                previous = self.count.get()
                self.count.update(((previous[0] if previous else 0) + row.n,))
            else:
                yield Row(key=key[0], count=self.count.get()[0])
"""

    def test_held_writes_go_together_and_a_read_sees_the_keys_own(self):
        _, _, batch = self.export(self._HELD)
        add = lambda n: {"op": "add", "n": n}  # noqa: E731
        read = {"op": "read"}
        out = self.batch(batch, [("a", [add(1), add(2), read]), ("b", [add(5)]), ("c", [add(7)])])
        self.assertEqual(out, [[{"key": "a", "count": 3}], [], []])
        # a's second add and its read each read a's variable after a held write to it, so
        # each sent that write first; b's and c's went together at the end, each to its key.
        self.assertEqual(self.host.applied, [1, 1, 2])
        self.assertEqual(self.host.values[("count", "b")], '{"count":5}')
        self.assertEqual(self.host.values[("count", "c")], '{"count":7}')
        self.host.applied = []
        out = self.batch(batch, [("c", [add(1), read]), ("b", [read])], batch_id=2)
        self.assertEqual(out, [[{"key": "c", "count": 8}], [{"key": "b", "count": 5}]])
        self.assertEqual(self.host.applied, [1])

    _HELD_TIMERS = """
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
OUTPUT_SCHEMA = "key string, timers string"

class Timers(StatefulProcessor):
    HOLD_WRITES = True

    def init(self, handle):
        self.handle = handle

    def handleInputRows(self, key, rows, timerValues):
        for row in rows:
            if row.op == "register":
                self.handle.registerTimer(row.at)
            elif row.op == "delete":
                self.handle.deleteTimer(row.at)
            else:
                yield Row(key=key[0], timers=str(list(self.handle.listTimers())))
"""

    def test_held_timers_go_with_the_writes_and_a_listing_sees_the_keys_own(self):
        _, _, batch = self.export(self._HELD_TIMERS, fake_host.TimeMode.PROCESSING_TIME)
        register = lambda at: {"op": "register", "at": at}  # noqa: E731
        delete = lambda at: {"op": "delete", "at": at}  # noqa: E731
        listing = {"op": "list"}
        out = self.batch(
            batch,
            [
                ("a", [register(30), register(10), delete(30), listing]),
                ("b", [register(20), register(5)]),
                ("c", [register(7), delete(7), register(8)]),
            ],
        )
        self.assertEqual(out, [[{"key": "a", "timers": "[10]"}], [], []])
        # a's listing sent a's three operations first; b's and c's went together at the
        # end, each to its own key. No timer call crossed on its own but a's listing.
        self.assertEqual(self.host.applied, [3, 5])
        self.assertEqual(self.host.timer_calls, ["list"])
        self.assertEqual(self.host.timers, {"a": {10}, "b": {5, 20}, "c": {8}})

        # Another key's held timers are not sent for a listing: c's deletion went at the
        # end, with b's registration after its listing.
        self.host.applied, self.host.timer_calls = [], []
        out = self.batch(
            batch, [("c", [delete(8)]), ("b", [listing, register(40)])], batch_id=2
        )
        self.assertEqual(out, [[], [{"key": "b", "timers": "[5, 20]"}]])
        self.assertEqual(self.host.applied, [2])
        self.assertEqual(self.host.timers, {"a": {10}, "b": {5, 20, 40}, "c": set()})

        # A time the host would not take (not an int, or past 64 bits) goes to the host
        # directly, after the key's held timers, so the host refuses it where it was made:
        # 3 was sent before the first direct call, 9 at the end.
        self.host.applied, self.host.timer_calls = [], []
        ops = [register(3), register(1 << 63), register(True), register(9)]
        self.batch(batch, [("d", ops)], batch_id=3)
        self.assertEqual(self.host.applied, [1, 1])
        self.assertEqual(self.host.timer_calls, ["register", "register"])

        # In time mode none timers are not held: the host's refusal (here: the fake's
        # acceptance) comes from the call.
        _, _, batch = self.export(self._HELD_TIMERS)
        self.host.applied, self.host.timer_calls = [], []
        self.batch(batch, [("e", [register(4), delete(4)])])
        self.assertEqual(self.host.applied, [])
        self.assertEqual(self.host.timer_calls, ["register", "delete"])

    def test_a_refused_held_write_fails_the_batch_naming_its_own_key(self):
        _, _, batch = self.export(self._HELD)
        add = lambda n: {"op": "add", "n": n}  # noqa: E731
        with self.assertRaises(fake_host.Err) as err:
            self.batch(batch, [("a", [add(1)]), ("b", [add(-5)]), ("c", [add(1)])])
        failure = err.exception.value
        # Refused when the call ended, after c ran: named by b, whose write it was.
        self.assertEqual(failure.index, 1)
        self.assertIn("refused", failure.error.value)
        self.assertEqual(self.host.values[("count", "a")], '{"count":1}')
        self.assertNotIn(("count", "c"), self.host.values)
        # Refused at a read of the key's own variable, which the handler let pass: still
        # the batch's failure, named by the key.
        source = self._HELD.replace(
            "yield Row(key=key[0], count=self.count.get()[0])",
            "try:\n                    self.count.get()\n                except Exception:\n"
            "                    pass\n                yield Row(key=key[0], count=0)",
        )
        _, _, batch = self.export(source)
        with self.assertRaises(fake_host.Err) as err:
            self.batch(batch, [("a", [add(-5), {"op": "read"}]), ("b", [add(1)])])
        self.assertEqual(err.exception.value.index, 0)
        self.assertIn("refused", err.exception.value.error.value)

    def test_a_sync_failure_names_its_entry(self):
        path, _, batch = self.export(_COUNTER)
        groups = [("a", [{"n": 1}]), ("b", [{"n": 1}, {"boom": True}]), ("c", [{"n": 1}])]
        with self.assertRaises(fake_host.Err) as err:
            self.batch(batch, groups)
        failure = err.exception.value
        self.assertEqual(failure.index, 1)
        self.assertIsInstance(failure.error, fake_host.ProcessorError_Failed)
        self.assertIn("handleInputRows raised ValueError: boom in b", failure.error.value)
        self.assertIn(f'File "{path}", line 15, in handleInputRows', failure.error.value)
        # A row that is not JSON: its index within the entry's rows.
        self.host.begin_batch(["a", "b"])
        entries = [
            fake_host.KeyRows('["a"]', ['{"n":1}']),
            fake_host.KeyRows('["b"]', ['{"n":1}', '{"n":2}', "{nope"]),
        ]
        with self.assertRaises(fake_host.Err) as err:
            batch.handle_input_batch(entries, None, fake_host.TimerValues(-1, -1))
        failure = err.exception.value
        self.assertEqual(failure.index, 1)
        self.assertIsInstance(failure.error, fake_host.ProcessorError_BadInputRow)
        self.assertEqual(failure.error.value.index, 2)

    def test_async_batches_interleave_keys_and_keep_state_per_key(self):
        _, _, batch = self.export(_ASYNC_COUNTER)
        groups = [("a", [{"n": 1}] * 3), ("b", [{"n": 1}]), ("c", [{"n": 1}] * 2)]
        for batch_id, expected in ((1, {"a": 3, "b": 1, "c": 2}), (2, {"a": 6, "b": 2, "c": 4})):
            out = self.batch(batch, groups, batch_id)
            steps = {}
            for (key, _), rows in zip(groups, out):
                self.assertEqual([r["key"] for r in rows], [key] * 3)
                self.assertEqual(rows[0]["count"], -1)
                self.assertEqual(rows[1]["count"], expected[key])
                self.assertEqual(rows[2]["count"], batch_id)
                steps[key] = [r["step"] for r in rows]
                self.assertEqual(steps[key], sorted(steps[key]))
            # Every key's first step came before any key's second: they interleaved.
            self.assertLess(max(s[0] for s in steps.values()), min(s[1] for s in steps.values()))
            for previous, following in zip(self.host.switches, self.host.switches[1:]):
                self.assertNotEqual(previous, following)
            self.assertGreater(len(self.host.switches), len(groups))

    def test_async_failures_report_the_first_entry(self):
        path, _, batch = self.export(_ASYNC_COUNTER)
        groups = [("a", [{}]), ("fail-b", [{}]), ("c", [{}]), ("fail-d", [{}])]
        with self.assertRaises(fake_host.Err) as err:
            self.batch(batch, groups)
        failure = err.exception.value
        self.assertEqual(failure.index, 1)
        self.assertIn("ValueError: failing fail-b", failure.error.value)
        # The traceback starts at the user's handler, not in the SDK's scheduler.
        self.assertIn(
            f'Traceback (most recent call last):\n  File "{path}", line 25, in handleInputRows',
            failure.error.value,
        )

    def test_async_expired_timers_run_per_key(self):
        _, _, batch = self.export(_ASYNC_COUNTER)
        self.host.begin_batch(["x", "y"])
        timers = [
            fake_host.KeyTimer('["x"]', fake_host.ExpiredTimerInfo(5)),
            fake_host.KeyTimer('["y"]', fake_host.ExpiredTimerInfo(7)),
        ]
        out = batch.handle_expired_timers(timers, fake_host.TimerValues(10, -1))
        rows = [[_codec.loads(t) for t in r] for r in out]
        self.assertEqual([r[0]["count"] for r in rows], [5, 7])

    def test_the_single_key_export_still_works(self):
        _, processor, _ = self.export(_COUNTER)
        self.host.current = "k"
        out = processor().handle_input_rows('["k"]', ['{"n":1}'], fake_host.TimerValues(-1, -1))
        self.assertEqual([_codec.loads(t) for t in out], [{"key": "k", "count": 1, "batch": 0}])
        _, processor, _ = self.export(_ASYNC_COUNTER)
        self.host.current = "k"
        out = processor().handle_input_rows('["k"]', ['{"n":1}'], fake_host.TimerValues(-1, -1))
        self.assertEqual([_codec.loads(t)["count"] for t in out], [-1, 2, 0])

    def test_query_info(self):
        from pyspark.sql.streaming.stateful_processor import QueryInfo

        info = QueryInfo("0f6a3c52-6a43-4a8e-9c4e-0d4b1b8e2f11", "not-a-uuid", 4)
        self.assertEqual(str(info.getQueryId()), "0f6a3c52-6a43-4a8e-9c4e-0d4b1b8e2f11")
        self.assertEqual(info.getRunId(), "not-a-uuid")
        self.assertEqual(info.getBatchId(), 4)
        self.assertIn("batchId=4", repr(info))


if __name__ == "__main__":
    unittest.main()
