#!/usr/bin/env python3
"""Runs one Python processor file on PySpark (``transformWithState``, local mode) and on
Statebox over the same input, and compares the outputs batch by batch.

    python spark_compare.py PROCESSOR.py --input DIR --key COL[,COL] [--time-mode none]
        [--output-mode update] [--statebox PATH] [--bench]
    python spark_compare.py FIXTURE_DIR [--statebox PATH] [--write-expected]
    python spark_compare.py --job JOB_FIXTURE_DIR [--statebox PATH] [--write-expected]

A fixture folder (``tests/fixtures/pyspark/<name>``) holds ``processor.py``, ``input/`` and
``query.json`` (``key``, ``time_mode``, ``output_mode``; ``input`` and ``expected`` may point
to another fixture's). ``--write-expected`` stores PySpark's output as the fixture's
``expected.jsonl`` (one line per output row: ``{"batch": i, "row": {...}}``), which the test
suite compares Statebox's output with, so CI needs no PySpark. A fixture whose query names
another ``expected`` file (an async processor: PySpark 4.3 has no AsyncStatefulProcessor) is
compared with that file instead of run on PySpark.

Rows are compared field by field in Statebox's JSON conventions (the SDK's): timestamps as
epoch milliseconds, dates ISO, binary base64, ``float`` columns as single-precision values
written shortest, every column present (PySpark's null ones as ``null``).

``DIR`` holds JSON Lines files; both engines read them in name order, one file per
micro-batch. The processor file must run on both unchanged: it imports ``pyspark`` and sets
``OUTPUT_SCHEMA`` (and ``INPUT_SCHEMA`` if the input's types cannot be inferred). Run it with a
Python that has PySpark 4.3+ (``pip install pyspark protobuf grpcio pandas pyarrow``) and
Java 17. Independent of the test suite; exits non-zero when the outputs differ.

With ``--job`` the fixture is a whole job script (``job.py`` with the folders it reads,
e.g. ``input/`` and ``initial/``): it runs unchanged as ``python job.py`` on PySpark, in a
copy of the folder (input files' modification times in name order, time zone UTC), and
PySpark's JSON sink output is split into batches by its ``_spark_metadata`` log; then
``statebox run job.py`` runs in another copy and its output is split by its commit records.

With ``--bench`` it also reports each engine's events per second over the whole input
(Spark's time includes its per-batch scheduling, as a streaming query's would).
"""

import argparse
import base64
import datetime
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import struct
import time
from collections import Counter
from pathlib import Path

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


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


def spark_session(app_name, cores, partitions):
    """A local Spark session as Statebox is compared with: `local[cores]`, `partitions`
    shuffle (state) partitions, the RocksDB state store provider, UTC, no UI, errors only.
    Spark's Python workers run this interpreter (it has PySpark's dependencies: protobuf,
    grpcio, pandas, pyarrow) unless PYSPARK_PYTHON names another; by default Spark starts
    them with `python3` from PATH."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def output_schema_of(module, cls):
    for holder in (module, cls):
        for name in ("OUTPUT_SCHEMA", "outputSchema", "output_schema"):
            value = getattr(holder, name, None)
            if value is not None:
                return value
    sys.exit("the processor file sets no OUTPUT_SCHEMA / output_schema")


def _f32(v):
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


def f32_text(v):
    """As the SDK writes a float column: single precision, shortest decimal."""
    narrowed = _f32(v)
    for digits in range(1, 10):
        short = float("%.*g" % (digits, narrowed))
        if _f32(short) == narrowed:
            return short
    return narrowed


def normalize(value, data_type):
    """A PySpark output value in Statebox's JSON conventions, per the column's type."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        DateType,
        FloatType,
        MapType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    if value is None:
        return None
    if isinstance(data_type, FloatType):
        return f32_text(value)
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return (value - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(data_type, DateType):
        return value.isoformat()
    if isinstance(data_type, BinaryType):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(data_type, ArrayType):
        return [normalize(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        return {str(k): normalize(v, data_type.valueType) for k, v in value.items()}
    if isinstance(data_type, StructType):
        return normalize_row(value, data_type)
    return value


def normalize_row(row, schema):
    values = row.asDict() if hasattr(row, "asDict") else dict(row)
    return {f.name: normalize(values.get(f.name), f.dataType) for f in schema.fields}


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
    module, cls = load_processor(processor_file)
    output_schema = output_schema_of(module, cls)
    input_schema = getattr(module, "INPUT_SCHEMA", None) or infer_schema(files)
    if isinstance(input_schema, str) and any(k not in input_schema for k in keys):
        input_schema = infer_schema(files)

    spark = spark_session("statebox-spark-compare", cores=2, partitions=2)
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

    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = output_schema
    if isinstance(schema, str):
        schema = _parse_datatype_string(schema)
    assert isinstance(schema, StructType), schema

    def collect(batch_df, batch_id):
        batches[batch_id] = [normalize_row(r, schema) for r in batch_df.collect()]

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


def _copy_job(fixture, work):
    work.mkdir()
    for item in fixture.iterdir():
        if item.name in ("expected.jsonl", "expected-error.txt", "output", "checkpoint", "__pycache__"):
            continue
        if item.is_dir():
            shutil.copytree(item, work / item.name)
        else:
            shutil.copy(item, work / item.name)
    # Spark's file source takes files in modification-time order: make it the name order.
    inputs = sorted((work / "input").iterdir())
    base = time.time() - len(inputs) - 10
    for i, f in enumerate(inputs):
        os.utime(f, (base + i, base + i))
    return len(inputs)


def job_error(text):
    """A failed job's Python error as ``job.py:LINE: Type: message``: the job script's last
    frame in the traceback and the exception line after it (PySpark prints the worker's
    traceback inside the Java exception, Statebox in its error), or None."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "[^"]*job\.py", line (\d+)', lines[i])
        if not m:
            continue
        for after in lines[i + 1 :]:
            e = re.match(r"([A-Za-z_][\w.]*(?:Error|Exception)): (.*)", after)
            if e:
                return f"job.py:{m.group(1)}: {e.group(1)}: {e.group(2)}"
        return None
    return None


class JobFailed(Exception):
    """The job script failed, with ``job_error``'s summary of why."""


def run_spark_job(fixture, work):
    """Runs the job script on PySpark; returns its output rows per batch id."""
    count = _copy_job(fixture, work)
    env = dict(os.environ, TZ="UTC", PYSPARK_PYTHON=sys.executable)
    done = subprocess.run(
        [sys.executable, "job.py"], cwd=work, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        error = job_error(done.stdout + done.stderr)
        if error is None:
            sys.exit(f"PySpark failed to run the job:\n{done.stderr}")
        raise JobFailed(error)
    out = work / "output"
    batches = {}
    for log in sorted((out / "_spark_metadata").iterdir(), key=lambda p: p.name):
        if not log.name.isdigit():
            continue
        rows = []
        for line in log.read_text().splitlines()[1:]:
            path = Path(json.loads(line)["path"].removeprefix("file:"))
            rows += [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
        batches[int(log.name)] = rows
    return batches, count


def run_statebox_job(statebox, fixture, work):
    _copy_job(fixture, work)
    result = subprocess.run(
        [statebox, "run", "job.py", "--progress-json"],
        cwd=work, capture_output=True, text=True,
    )
    if result.returncode != 0:
        error = job_error(result.stderr)
        if error is None:
            sys.exit(f"Statebox failed to run the job:\n{result.stderr}")
        raise JobFailed(error)
    commits = [json.loads(l) for l in result.stdout.splitlines() if l.startswith("{")]
    files = sorted((work / "output").glob("*.json"))
    rows = [json.loads(l) for f in files for l in f.read_text().splitlines() if l.strip()]
    batches, at = {}, 0
    for commit in commits:
        n = commit.get("output_rows", 0)
        batches[commit["batch_id"]] = rows[at : at + n]
        at += n
    return batches


def job_main(args):
    fixture = args.job.resolve()
    with tempfile.TemporaryDirectory(prefix="spark-compare-job-") as tmp:
        try:
            spark, _ = run_spark_job(fixture, Path(tmp) / "spark")
        except JobFailed as e:
            # A published example that fails on PySpark: the comparison is that Statebox
            # fails at the same line with the same error (expected-error.txt).
            print(f"PySpark: {e}")
            if args.write_expected:
                (fixture / "expected-error.txt").write_text(f"{e}\n")
                print(f"wrote PySpark's error to {fixture / 'expected-error.txt'}")
            if args.spark_only:
                return
            try:
                run_statebox_job(args.statebox, fixture, Path(tmp) / "statebox")
            except JobFailed as f:
                print(f"Statebox: {f}")
                if str(f) != str(e):
                    sys.exit("the errors differ")
                print("both fail the same way")
                return
            sys.exit("Statebox ran the job PySpark failed")
        if args.write_expected:
            with open(fixture / "expected.jsonl", "w") as f:
                for i in sorted(spark):
                    for row in sorted(spark[i], key=lambda r: json.dumps(r, sort_keys=True)):
                        f.write(json.dumps({"batch": i, "row": row}, ensure_ascii=False) + "\n")
            print(f"wrote PySpark's output to {fixture / 'expected.jsonl'}")
        if args.spark_only:
            return
        box = run_statebox_job(args.statebox, fixture, Path(tmp) / "statebox")
    failures = 0
    for i in sorted(set(spark) | set(box)):
        # PySpark's JSON sink leaves null fields out; Statebox writes them as null.
        s = canonical([{k: v for k, v in r.items() if v is not None} for r in spark.get(i, [])])
        b = canonical([{k: v for k, v in r.items() if v is not None} for r in box.get(i, [])])
        if s == b:
            print(f"batch {i}: same {sum(s.values())} rows")
            continue
        failures += 1
        print(f"batch {i}: DIFFERENT")
        for row in sorted((s - b).elements()):
            print(f"  - spark only:    {row}")
        for row in sorted((b - s).elements()):
            print(f"  + statebox only: {row}")
    if failures:
        sys.exit(f"{failures} batches differ")
    print("all batches match")


def canonical(rows):
    return Counter(json.dumps(r, sort_keys=True) for r in rows)


def read_expected(path, batches):
    out = [[] for _ in range(batches)]
    for line in Path(path).read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            out[item["batch"]].append(item["row"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "processor", type=Path, nargs="?", help="a processor file or a fixture folder"
    )
    parser.add_argument("--job", type=Path, help="a job-script fixture folder")
    parser.add_argument("--input", type=Path)
    parser.add_argument("--key")
    parser.add_argument("--time-mode", default="none")
    parser.add_argument("--output-mode", default="update")
    parser.add_argument("--statebox", default=os.environ.get("STATEBOX", "statebox"))
    parser.add_argument("--bench", action="store_true")
    parser.add_argument(
        "--write-expected", action="store_true", help="store PySpark's output in the fixture"
    )
    parser.add_argument(
        "--spark-only", action="store_true", help="run PySpark only (with --write-expected)"
    )
    args = parser.parse_args()
    if args.job is not None:
        return job_main(args)
    if args.processor is None:
        parser.error("give a processor file, a fixture folder or --job FOLDER")

    expected_file = None
    reuse_expected = False
    if args.processor.is_dir():
        fixture = args.processor.resolve()
        query = json.loads((fixture / "query.json").read_text())
        args.processor = fixture / "processor.py"
        args.input = (fixture / query.get("input", "input")).resolve()
        args.key = ",".join(query["key"])
        args.time_mode = query.get("time_mode", "none")
        args.output_mode = query.get("output_mode", "update")
        expected_file = (fixture / query.get("expected", "expected.jsonl")).resolve()
        reuse_expected = "expected" in query
    if args.input is None or args.key is None:
        parser.error("--input and --key are required with a processor file")

    files = sorted(p for p in args.input.iterdir() if p.suffix in (".json", ".jsonl"))
    if not files:
        sys.exit(f"no .jsonl files in {args.input}")
    keys = args.key.split(",")
    processor = args.processor.resolve()
    with tempfile.TemporaryDirectory(prefix="spark-compare-") as tmp:
        work = Path(tmp)
        if reuse_expected:
            spark, spark_s = read_expected(expected_file, len(files)), 0.0
            print(f"PySpark cannot run this file; comparing with {expected_file}")
        else:
            spark, spark_s = run_spark(
                processor, files, keys, args.time_mode, args.output_mode, work
            )
            if args.write_expected and expected_file is not None:
                with open(expected_file, "w") as f:
                    for i, rows in enumerate(spark):
                        for row in sorted(rows, key=lambda r: json.dumps(r, sort_keys=True)):
                            f.write(json.dumps({"batch": i, "row": row}, ensure_ascii=False) + "\n")
                print(f"wrote PySpark's output to {expected_file}")
        if args.spark_only:
            return
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
