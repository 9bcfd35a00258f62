"""Reports `handle.getQueryInfo()` from `init` and from each handler call, for
`tests/all/python.rs` (the query id must survive a restart, the batch id match the batch)."""

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor

OUTPUT_SCHEMA = "key string, query_id string, run_id string, batch_id long, init_query_id string"


class Info(StatefulProcessor):
    def init(self, handle):
        self.handle = handle
        self.at_init = handle.getQueryInfo()

    def handleInputRows(self, key, rows, timerValues):
        info = self.handle.getQueryInfo()
        yield Row(
            key=key[0],
            query_id=str(info.getQueryId()),
            run_id=str(info.getRunId()),
            batch_id=info.getBatchId(),
            init_query_id=str(self.at_init.getQueryId()),
        )
