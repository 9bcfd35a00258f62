"""PySpark's ``TwsTester`` on Statebox: the shapes of Spark's own TwsTester tests (running
count, top-k in list state, word frequencies in map state, every state method, direct state
access, step functions, row-by-row runs, initial state, processing- and event-time timers),
written against ``pyspark.sql.streaming.tws_tester.TwsTester`` as a PySpark user would.

Run natively (in memory, like Spark's tester) by ``python3 -m unittest`` from this folder;
with ``STATEBOX_TWS_HOST=1`` (and ``STATEBOX`` naming the binary) every tester runs the
processor built into a component in the real host instead (``tests/all/pyspark_tws.rs``
runs both). Direct state writes and ``setWatermark`` do not exist against the host: there
those tests check that the tester says so.
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

    def direct_access_refused(self, call):
        with self.assertRaisesRegex(NotImplementedError, "not available against the real host"):
            call()

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
        if HOST:
            self.direct_access_refused(lambda: tester.updateValueState("count", "foo", (5,)))
            return
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
        if HOST:
            self.direct_access_refused(lambda: tester.updateListState("topK", "a", [(6.0,)]))
            return
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
        if HOST:
            self.direct_access_refused(
                lambda: tester.updateMapState("frequencies", "user1", {("a",): (1,)})
            )
            return
        tester.updateMapState("frequencies", "user1", {("hello",): (5,), ("world",): (3,)})
        tester.test("user1", [Row(word="hello"), Row(word="goodbye")])
        self.assertEqual(
            tester.peekMapState("frequencies", "user1"),
            {("hello",): (6,), ("world",): (3,), ("goodbye",): (1,)},
        )

    def test_step_function(self):
        tester = self.make(RunningCount())
        if HOST:
            self.direct_access_refused(lambda: tester.updateValueState("count", "k", (10,)))
            return

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
        if HOST:
            self.direct_access_refused(lambda: tester.deleteState("count", "k"))
            return
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
        if HOST:
            with self.assertRaisesRegex(NotImplementedError, "derives the watermark"):
                tester.setWatermark(5)
            return
        self.assertEqual(tester.test("a", [Row(time=10), Row(time=20)]), [])
        self.assertEqual(tester.setWatermark(25), [])
        # 20 is at or before the watermark: dropped, as Spark drops late rows.
        self.assertEqual(tester.test("a", [Row(time=20), Row(time=40)]), [])
        self.assertEqual(tester.peekValueState("count", "a"), (3,))
        self.assertEqual(
            tester.setWatermark(60),
            [Row(key="a", count=3, fired=30), Row(key="a", count=3, fired=50)],
        )

    def test_timers_are_refused_in_time_mode_none(self):
        tester = self.make(SessionTimeout())
        with self.assertRaises(Exception) as err:
            tester.test("a", [Row(v=1)])
        self.assertIn("timemode", str(err.exception).lower().replace(" ", ""))


if __name__ == "__main__":
    unittest.main()
