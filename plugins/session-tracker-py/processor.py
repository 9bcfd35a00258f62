"""Tracks each user's sessions: how many distinct sessions and how many events a user has
had over all batches so far. The PySpark version of `plugins/session-tracker` (same output).

State per user: `sessions`, a map from session id to the events of that session, and
`totals`, the map's size and the sum of its values (kept so a call costs one map read and
write per distinct session in the batch, not a walk over every session the user ever had).
"""

from collections import Counter
from typing import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StringType, StructField, StructType

OUTPUT_SCHEMA = "user_id string, distinct_sessions long, total_events long"
INPUT_SCHEMA = "user_id string, session_id string"


class SessionTracker(StatefulProcessor):
    def init(self, handle: StatefulProcessorHandle) -> None:
        self.sessions = handle.getMapState(
            "sessions",
            StructType([StructField("session_id", StringType())]),
            StructType([StructField("events", LongType())]),
        )
        self.totals = handle.getValueState(
            "totals", "distinct_sessions long, total_events long"
        )

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        batch = Counter(row.session_id for row in rows)
        distinct, total = self.totals.get() or (0, 0)
        for session_id, events in sorted(batch.items()):
            before = self.sessions.getValue((session_id,))
            if before is None:
                distinct += 1
            self.sessions.updateValue((session_id,), ((before[0] if before else 0) + events,))
            total += events
        self.totals.update((distinct, total))
        yield Row(user_id=key[0], distinct_sessions=distinct, total_events=total)

    def close(self) -> None:
        pass
