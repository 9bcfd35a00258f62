#!/usr/bin/env python3
"""Runs one Python processor file on PySpark (``transformWithState``, local mode) and on
Statebox over the same input, and compares the outputs batch by batch.

    python spark_compare.py PROCESSOR.py --input DIR --key COL[,COL] [--time-mode none]
        [--output-mode update] [--statebox PATH] [--bench]

``DIR`` holds JSON Lines files; both engines read them in name order, one file per
micro-batch. The processor file must run on both unchanged: it imports ``pyspark`` and sets
``OUTPUT_SCHEMA`` (and ``INPUT_SCHEMA`` if the input's types cannot be inferred). Run it with a
Python that has PySpark 4.3+ (``pip install pyspark protobuf grpcio pandas pyarrow``) and
Java 17. Independent of the test suite; exits non-zero when the outputs differ.

With ``--bench`` it also reports each engine's events per second over the whole input
(Spark's time includes its per-batch scheduling, as a streaming query's would).
"""

import argparse
import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def load_processor(path):
    spec = importlib.util.spec_from_file_location("compared_processor", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from pyspark.sql.streaming import StatefulProcessor

    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, StatefulProcessor)
        and obj is not StatefulProcessor
        and obj.__module__ == module.__name__
    ]
    if len(classes) != 1:
        sys.exit(f"{path}: expected one StatefulProcessor subclass, found {len(classes)}")
    return module, classes[0]


def infer_schema(files):
    """A DDL schema covering every column of the input, from the JSON values' types."""
    types = {}
    order = []
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            for col, value in json.loads(line).items():
                if col not in types:
                    order.append(col)
                    types[col] = None
                if value is None:
                    continue
                t = (
                    "boolean"
                    if isinstance(value, bool)
                    else "long"
                    if isinstance(value, int)
                    else "double"
                    if isinstance(value, float)
                    else "string"
                )
                if types[col] in (None, t):
                    types[col] = t
                elif {types[col], t} == {"long", "double"}:
                    types[col] = "double"
                else:
                    types[col] = "string"
    return ", ".join(f"`{c}` {types[c] or 'string'}" for c in order)


def run_spark(processor_file, files, keys, time_mode, output_mode, work):
    from pyspark.sql import SparkSession

    module, cls = load_processor(processor_file)
    output_schema = getattr(module, "OUTPUT_SCHEMA")
    input_schema = getattr(module, "INPUT_SCHEMA", None) or infer_schema(files)
    if isinstance(input_schema, str) and any(k not in input_schema for k in keys):
        input_schema = infer_schema(files)

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("statebox-spark-compare")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    input_dir = work / "spark-input"
    input_dir.mkdir()
    # Spark's file source takes files in modification-time order: make it the name order.
    base = time.time() - len(files) - 10
    for i, f in enumerate(files):
        shutil.copy(f, input_dir / f.name)
        os.utime(input_dir / f.name, (base + i, base + i))
    df = (
        spark.readStream.schema(input_schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(input_dir))
    )
    batches = {}

    def collect(batch_df, batch_id):
        batches[batch_id] = [json.loads(r) for r in batch_df.toJSON().collect()]

    out = df.groupBy(*keys).transformWithState(
        statefulProcessor=cls(),
        outputStructType=output_schema,
        outputMode=output_mode.capitalize(),
        timeMode={"none": "None", "processing-time": "ProcessingTime", "event-time": "EventTime"}[
            time_mode
        ],
    )
    started = time.perf_counter()
    query = (
        out.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(work / "spark-checkpoint"))
        .trigger(availableNow=True)
        .outputMode(output_mode)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    spark.stop()
    return [batches.get(i, []) for i in range(len(files))], seconds


def run_statebox(statebox, processor_file, files, keys, time_mode, output_mode, work):
    input_dir = work / "statebox-input"
    input_dir.mkdir()
    for f in files:
        shutil.copy(f, input_dir / f.name)
    out = work / "statebox-out.jsonl"
    cmd = [
        statebox,
        "run",
        "--processor",
        str(processor_file),
        "--input",
        str(input_dir),
        "--output",
        str(out),
        "--checkpoint",
        str(work / "statebox-checkpoint"),
        "--key",
        ",".join(keys),
        "--time-mode",
        time_mode,
        "--output-mode",
        output_mode,
        "--progress-json",
    ]
    # Build (or find in the cache) and compile before timing, as Spark's start-up is not
    # timed either: a run over the first row alone, on a checkpoint of its own.
    warm = work / "statebox-warm-up"
    warm.mkdir()
    with open(files[0]) as f:
        (warm / "row.jsonl").write_text(f.readline())
    warm_cmd = list(cmd)
    for flag, value in (("--input", warm), ("--output", work / "warm.jsonl"),
                        ("--checkpoint", work / "warm-checkpoint")):
        warm_cmd[warm_cmd.index(flag) + 1] = str(value)
    subprocess.run(warm_cmd, check=True, capture_output=True)
    started = time.perf_counter()
    result = subprocess.run(cmd, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    commits = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]
    rows = [json.loads(l) for l in out.read_text().splitlines() if l.strip()]
    batches, at = [], 0
    for commit in commits:
        n = commit.get("output_rows", 0)
        batches.append(rows[at : at + n])
        at += n
    return batches, seconds


def canonical(rows):
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("processor", type=Path)
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--time-mode", default="none")
    parser.add_argument("--output-mode", default="update")
    parser.add_argument("--statebox", default=os.environ.get("STATEBOX", "statebox"))
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args()

    files = sorted(p for p in args.input.iterdir() if p.suffix in (".json", ".jsonl"))
    if not files:
        sys.exit(f"no .jsonl files in {args.input}")
    keys = args.key.split(",")
    processor = args.processor.resolve()
    with tempfile.TemporaryDirectory(prefix="spark-compare-") as tmp:
        work = Path(tmp)
        spark, spark_s = run_spark(
            processor, files, keys, args.time_mode, args.output_mode, work
        )
        box, box_s = run_statebox(
            args.statebox, processor, files, keys, args.time_mode, args.output_mode, work
        )
    failures = 0
    for i, f in enumerate(files):
        s, b = canonical(spark[i]), canonical(box[i] if i < len(box) else [])
        if s == b:
            print(f"batch {i} ({f.name}): same {sum(s.values())} rows")
            continue
        failures += 1
        print(f"batch {i} ({f.name}): DIFFERENT")
        for row in sorted((s - b).elements()):
            print(f"  - spark only:    {row}")
        for row in sorted((b - s).elements()):
            print(f"  + statebox only: {row}")
    if args.bench:
        events = sum(1 for f in files for l in f.read_text().splitlines() if l.strip())
        print(
            json.dumps(
                {
                    "events": events,
                    "spark_seconds": round(spark_s, 3),
                    "spark_events_per_s": round(events / spark_s),
                    "statebox_seconds": round(box_s, 3),
                    "statebox_events_per_s": round(events / box_s),
                }
            )
        )
    if failures:
        print(f"{failures} of {len(files)} batches differ")
        sys.exit(1)
    print(f"all {len(files)} batches match")


if __name__ == "__main__":
    main()
