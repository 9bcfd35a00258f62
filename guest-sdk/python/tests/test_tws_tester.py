"""PySpark's ``TwsTester`` on Statebox: the shapes of Spark's own TwsTester tests (running
count, top-k in list state, word frequencies in map state, every state method, direct state
access, step functions, row-by-row runs, initial state, processing- and event-time timers),
written against ``pyspark.sql.streaming.tws_tester.TwsTester`` as a PySpark user would.

Run natively (in memory, like Spark's tester) by ``python3 -m unittest`` from this folder;
with ``STATEBOX_TWS_HOST=1`` (and ``STATEBOX`` naming the binary) every tester runs the
processor built into a component in the real host instead (``tests/all/pyspark_tws.rs``
runs both): there direct state writes go through the host's state imports (real schema
checks) and ``setWatermark`` moves the query's watermark (the engine fires the timers).
"""

import os
import sys
import unittest
from pathlib import Path

# With STATEBOX_TWS_PYSPARK=1 the suite runs on the real PySpark (its own TwsTester), to
# show the suite itself is faithful to Spark's behaviour.
if os.environ.get("STATEBOX_TWS_PYSPARK", "") in ("", "0"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pyspark.sql import Row  # noqa: E402
from pyspark.sql.streaming.tws_tester import TwsTester  # noqa: E402

from tws_processors import (  # noqa: E402
    AllMethods,
    EventTimeCount,
    RunningCount,
    SessionTimeout,
    TopK,
    WordFrequency,
)

HOST = os.environ.get("STATEBOX_TWS_HOST", "") not in ("", "0")


class TwsTesterTests(unittest.TestCase):
    def make(self, processor, **kwargs):
        tester = TwsTester(processor, **kwargs)
        if hasattr(tester, "close"):  # Statebox's host-mode tester holds a process
            self.addCleanup(tester.close)
        return tester

    def test_running_count_processor(self):
        tester = self.make(RunningCount())
        self.assertEqual(
            tester.test("key1", [Row(value="a"), Row(value="c"), Row(value="c")]),
            [Row(key="key1", count=3)],
        )
        self.assertEqual(tester.test("key2", [Row(value="b")]), [Row(key="key2", count=1)])
        self.assertEqual(tester.test("key1", [Row(value="q")]), [Row(key="key1", count=4)])
        self.assertEqual(tester.peekValueState("count", "key1"), (4,))
        self.assertIsNone(tester.peekValueState("count", "key3"))

    def test_direct_access_to_value_state(self):
        tester = self.make(RunningCount())
        tester.updateValueState("count", "foo", (5,))
        tester.test("foo", [Row(value="q")])
        self.assertEqual(tester.peekValueState("count", "foo"), (6,))

    def test_topk_processor(self):
        tester = self.make(TopK())
        self.assertEqual(
            tester.test("key1", [Row(score=2.0), Row(score=3.0), Row(score=1.0)]),
            [Row(key="key1", score=3.0), Row(key="key1", score=2.0)],
        )
        self.assertEqual(
            tester.test("key2", [Row(score=30.0), Row(score=40.0), Row(score=10.0)]),
            [Row(key="key2", score=40.0), Row(key="key2", score=30.0)],
        )
        self.assertEqual(
            tester.test("key1", [Row(score=10.0)]),
            [Row(key="key1", score=10.0), Row(key="key1", score=3.0)],
        )
        self.assertEqual(tester.peekListState("topK", "key1"), [(10.0,), (3.0,)])
        self.assertEqual(tester.peekListState("topK", "nobody"), [])

    def test_direct_access_to_list_state(self):
        tester = self.make(TopK())
        tester.updateListState("topK", "a", [(6.0,), (5.0,)])
        tester.updateListState("topK", "b", [(8.0,), (7.0,)])
        tester.test("a", [Row(score=10.0)])
        tester.test("b", [Row(score=7.5)])
        tester.test("c", [Row(score=1.0)])
        self.assertEqual(tester.peekListState("topK", "a"), [(10.0,), (6.0,)])
        self.assertEqual(tester.peekListState("topK", "b"), [(8.0,), (7.5,)])
        self.assertEqual(tester.peekListState("topK", "c"), [(1.0,)])
        self.assertEqual(tester.peekListState("topK", "d"), [])

    def test_word_frequency_processor(self):
        tester = self.make(WordFrequency())
        self.assertEqual(
            tester.test(
                "user1", [Row(word="hello"), Row(word="world"), Row(word="hello")]
            ),
            [
                Row(key="user1", word="hello", count=1),
                Row(key="user1", word="world", count=1),
                Row(key="user1", word="hello", count=2),
            ],
        )
        self.assertEqual(
            tester.test("user1", [Row(word="hello"), Row(word="test")]),
            [Row(key="user1", word="hello", count=3), Row(key="user1", word="test", count=1)],
        )
        self.assertEqual(
            tester.peekMapState("frequencies", "user1"),
            {("hello",): (3,), ("test",): (1,), ("world",): (1,)},
        )
        self.assertEqual(tester.peekMapState("frequencies", "user4"), {})

    def test_direct_access_to_map_state(self):
        tester = self.make(WordFrequency())
        tester.updateMapState("frequencies", "user1", {("hello",): (5,), ("world",): (3,)})
        tester.test("user1", [Row(word="hello"), Row(word="goodbye")])
        self.assertEqual(
            tester.peekMapState("frequencies", "user1"),
            {("hello",): (6,), ("world",): (3,), ("goodbye",): (1,)},
        )

    def test_step_function(self):
        tester = self.make(RunningCount())

        def step(key, value, state_in):
            tester.updateValueState("count", key, (state_in,))
            tester.test(key, [Row(value=value)])
            return tester.peekValueState("count", key)[0]

        self.assertEqual(step("key1", "a", 10), 11)

    def test_row_by_row(self):
        tester = self.make(RunningCount())
        result = []
        for key, value in [("key1", "a"), ("key2", "b"), ("key1", "c"), ("key1", "c")]:
            result += tester.test(key, [Row(value=value)])
        self.assertEqual(
            result,
            [
                Row(key="key1", count=1),
                Row(key="key2", count=1),
                Row(key="key1", count=2),
                Row(key="key1", count=3),
            ],
        )

    def test_initial_state_row(self):
        tester = self.make(
            RunningCount(),
            initialStateRow=[("a", Row(initial_count=10)), ("b", Row(initial_count=20))],
        )
        self.assertEqual(tester.test("a", [Row(value="a")]), [Row(key="a", count=11)])
        self.assertEqual(tester.test("c", [Row(value="c")]), [Row(key="c", count=1)])
        self.assertEqual(tester.peekValueState("count", "b"), (20,))

    def test_all_methods_processor(self):
        tester = self.make(AllMethods())
        cmds = [
            "value-exists", "value-set", "value-exists", "value-clear", "value-exists",
            "list-exists", "list-append", "list-exists", "list-append-array", "list-get",
            "map-exists", "map-add", "map-exists", "map-keys", "map-values", "map-iterator",
            "map-remove", "map-keys", "map-clear", "map-exists",
        ]
        results = [r.result for r in tester.test("k", [Row(cmd=c) for c in cmds])]
        self.assertEqual(
            results,
            [
                "value-exists:False", "value-set:done", "value-exists:True",
                "value-clear:done", "value-exists:False", "list-exists:False",
                "list-append:done", "list-exists:True", "list-append-array:done",
                "list-get:a,b,c,d", "map-exists:False", "map-add:done", "map-exists:True",
                "map-keys:x,y,z", "map-values:1,2,3", "map-iterator:x=1,y=2,z=3",
                "map-remove:done", "map-keys:x,z", "map-clear:done", "map-exists:False",
            ],
        )

    def test_delete_state(self):
        tester = self.make(RunningCount())
        tester.test("k", [Row(value="a")])
        tester.deleteState("count", "k")
        self.assertIsNone(tester.peekValueState("count", "k"))
        self.assertEqual(tester.test("k", [Row(value="a")]), [Row(key="k", count=1)])

    def test_processing_time_timers(self):
        tester = self.make(SessionTimeout(), timeMode="ProcessingTime")
        tester.setProcessingTime(1000)
        self.assertEqual(
            tester.test("a", [Row(v=1), Row(v=2)]),
            [Row(key="a", event="input", n=2, at=1000)],
        )
        # The timer is at 2000: not due at 1500.
        self.assertEqual(tester.setProcessingTime(1500), [])
        self.assertEqual(
            tester.test("a", [Row(v=3)]), [Row(key="a", event="input", n=3, at=1500)]
        )
        # The input moved the timeout to 2500: nothing at 2000, the timeout at 2600.
        self.assertEqual(tester.setProcessingTime(2000), [])
        self.assertEqual(
            tester.setProcessingTime(2600), [Row(key="a", event="timeout", n=3, at=2500)]
        )
        self.assertIsNone(tester.peekValueState("seen", "a"))
        with self.assertRaisesRegex(Exception, "must move forward"):
            tester.setProcessingTime(2600)

    def test_event_time_drops_late_rows_and_fires_timers(self):
        tester = self.make(
            EventTimeCount(), timeMode="EventTime", eventTimeExtractor=lambda row: row.time
        )
        self.assertEqual(tester.test("a", [Row(time=10), Row(time=20)]), [])
        self.assertEqual(tester.setWatermark(25), [])
        # 20 is at or before the watermark: dropped, as Spark drops late rows.
        self.assertEqual(tester.test("a", [Row(time=20), Row(time=40)]), [])
        self.assertEqual(tester.peekValueState("count", "a"), (3,))
        self.assertEqual(
            tester.setWatermark(60),
            [Row(key="a", count=3, fired=30), Row(key="a", count=3, fired=50)],
        )

    def test_delete_value_list_and_map_state_of_one_key(self):
        count = self.make(RunningCount())
        count.updateValueState("count", "key1", (10,))
        count.updateValueState("count", "key2", (20,))
        self.assertEqual(count.peekValueState("count", "key1"), (10,))
        count.deleteState("count", "key1")
        self.assertIsNone(count.peekValueState("count", "key1"))
        self.assertEqual(count.peekValueState("count", "key2"), (20,))

        top = self.make(TopK())
        top.updateListState("topK", "key1", [(1.0,), (2.0,), (3.0,)])
        top.updateListState("topK", "key2", [(4.0,), (5.0,)])
        self.assertEqual(top.peekListState("topK", "key1"), [(1.0,), (2.0,), (3.0,)])
        top.deleteState("topK", "key1")
        self.assertEqual(top.peekListState("topK", "key1"), [])
        self.assertEqual(top.peekListState("topK", "key2"), [(4.0,), (5.0,)])

        words = self.make(WordFrequency())
        words.updateMapState("frequencies", "user1", {("hello",): (5,), ("world",): (3,)})
        words.updateMapState("frequencies", "user2", {("spark",): (10,)})
        words.deleteState("frequencies", "user1")
        self.assertEqual(words.peekMapState("frequencies", "user1"), {})
        self.assertEqual(words.peekMapState("frequencies", "user2"), {("spark",): (10,)})
        # An update replaces the whole map, as Spark's tester does.
        words.updateMapState("frequencies", "user2", {("new",): (1,)})
        self.assertEqual(words.peekMapState("frequencies", "user2"), {("new",): (1,)})

    def test_a_direct_write_is_checked_against_the_schema_in_the_host(self):
        tester = self.make(RunningCount())
        if HOST:
            # The host checks the stored value against `count int`, as it checks the
            # processor's own writes; the failed batch writes nothing.
            with self.assertRaisesRegex(Exception, "count"):
                tester.updateValueState("count", "k", ("not a number",))
            self.assertIsNone(tester.peekValueState("count", "k"))
        else:
            # In memory, as in Spark's own tester, the value is kept as given.
            tester.updateValueState("count", "k", ("not a number",))
            self.assertEqual(tester.peekValueState("count", "k"), ("not a number",))
        with self.assertRaises(AssertionError):
            tester.updateValueState("nonexistent_state", "k", (5,))

    def test_event_time_timers_fire_as_the_watermark_moves(self):
        tester = self.make(
            EventTimeCount(), timeMode="EventTime", eventTimeExtractor=lambda row: row.time
        )
        # Before any input: nothing to fire.
        self.assertEqual(tester.setWatermark(5), [])
        # 5 is late; 10000 and 11000 register a timer at 11010.
        self.assertEqual(tester.test("key1", [Row(time=5), Row(time=10000)]), [])
        self.assertEqual(tester.test("key2", [Row(time=11000)]), [])
        self.assertEqual(tester.setWatermark(10009), [])
        self.assertEqual(tester.setWatermark(10010), [Row(key="key1", count=1, fired=10010)])
        self.assertEqual(tester.setWatermark(20000), [Row(key="key2", count=1, fired=11010)])
        with self.assertRaisesRegex(Exception, "must move forward"):
            tester.setWatermark(20000)

    def test_empty_input(self):
        tester = self.make(RunningCount())
        if HOST:
            # The engine never calls handleInputRows without rows: an empty call is a batch
            # without data, as in production.
            self.assertEqual(tester.test("key1", []), [])
            self.assertIsNone(tester.peekValueState("count", "key1"))
        else:
            # Spark's tester calls the handler with no rows.
            self.assertEqual(tester.test("key1", []), [Row(key="key1", count=0)])

    def test_none_values_and_unusual_keys(self):
        tester = self.make(RunningCount())
        self.assertEqual(
            tester.test("key1", [Row(value=None), Row(value="a")]), [Row(key="key1", count=2)]
        )
        self.assertEqual(
            tester.test("key@#$%é", [Row(value="a"), Row(value="b")]),
            [Row(key="key@#$%é", count=2)],
        )
        self.assertEqual(tester.test(None, [Row(value="a")]), [Row(key=None, count=1)])
        self.assertEqual(tester.peekValueState("count", "key@#$%é"), (2,))

    def test_timers_are_refused_in_time_mode_none(self):
        tester = self.make(SessionTimeout())
        with self.assertRaises(Exception) as err:
            tester.test("a", [Row(v=1)])
        self.assertIn("timemode", str(err.exception).lower().replace(" ", ""))


if __name__ == "__main__":
    unittest.main()
