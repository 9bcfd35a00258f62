#!/usr/bin/env python3
"""The counter workload of `statebox bench count` on PySpark 4.3's `transformWithState`.

    python spark_count.py --input DIR --work DIR --cores N --partitions P --events N
        [--processor plugins/counter-py/processor.py]

The processor is `plugins/counter-py/processor.py` itself (loaded from its file, unchanged):
per key and micro-batch, the `count` value read and updated, one `batchCounts` element
appended, the `calls` entry of the `stats` map read and written, one row emitted, as Statebox
calls it. The input is the folder `generate_count_input` writes, one JSON Lines file per
batch; Spark reads it with `maxFilesPerTrigger=1` (one file per micro-batch, in name order:
the files' modification times are set in that order) and an `availableNow` trigger, in
`local[N]` with P shuffle (state) partitions and the RocksDB state store provider. The output
goes to a JSON file sink (exactly once through its `_spark_metadata` log).

Prints one JSON line. The events are checked: the sum of `numInputRows` over the query's
progress reports must equal --events, and so must the sum of the `count` column of the rows
the file sink committed (each row counts its key's events of one batch).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Loading the processor file and the Spark session are shared with the Python SDK's
# PySpark comparison (standard library only at import time).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "guest-sdk" / "python"))
from spark_compare import load_processor, spark_session  # noqa: E402


def main():
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--cores", required=True, type=int)
    parser.add_argument("--partitions", required=True, type=int)
    parser.add_argument("--events", required=True, type=int)
    parser.add_argument(
        "--processor", type=Path, default=here / "../../plugins/counter-py/processor.py"
    )
    args = parser.parse_args()

    files = sorted(args.input.glob("*.jsonl"))
    if not files:
        sys.exit(f"spark_count.py: no .jsonl files in {args.input}")
    # Spark's file source orders files by modification time: make it the name order (the
    # generator writes them in that order, but within one second they may tie).
    base = time.time() - len(files) - 10
    for i, f in enumerate(files):
        os.utime(f, (base + i, base + i))

    module, cls = load_processor(args.processor)
    spark = spark_session("statebox-bench-peers", args.cores, args.partitions)
    df = (
        spark.readStream.schema("key string, value long")
        .option("maxFilesPerTrigger", 1)
        .json(str(args.input))
    )
    out = df.groupBy("key").transformWithState(
        statefulProcessor=cls(),
        outputStructType=module.OUTPUT_SCHEMA,
        outputMode="Append",
        timeMode="None",
    )
    output = args.work / "output"
    started = time.perf_counter()
    query = (
        out.writeStream.format("json")
        .option("path", str(output))
        .option("checkpointLocation", str(args.work / "checkpoint"))
        .trigger(availableNow=True)
        .outputMode("append")
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    events = sum(p["numInputRows"] for p in progress)
    counted = spark.read.schema("key string, count long").json(str(output))
    counted = counted.agg({"count": "sum"}).collect()[0][0] or 0
    spark.stop()
    if events != args.events or counted != args.events:
        sys.exit(
            f"spark: read {events} input rows and committed counts summing to {counted}; "
            f"expected {args.events}"
        )
    line = {
        "workload": "count",
        "engine": "spark-python",
        "events": events,
        "batches": len(progress),
        "cores": args.cores,
        "partitions": args.partitions,
        "state_store": "rocksdb",
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "batch_ms": [p["durationMs"].get("triggerExecution") for p in progress],
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
