// The counter workload of `statebox bench count` on Spark 4.3's `transformWithState`, Java
// API: a class extending org.apache.spark.sql.streaming.StatefulProcessor, in local[N].
//
//   java <Spark's --add-opens> -cp classes:pyspark/jars/* CounterTws --input DIR --work DIR
//        --cores N --partitions P --events N
//
// What spark_count.py does with the Python row API, here on the JVM: the input folder read
// with maxFilesPerTrigger=1 (one file per micro-batch; the caller sets the files'
// modification times in name order), an availableNow trigger, P shuffle (state) partitions,
// the RocksDB state store provider and a JSON file sink (exactly once). Per key and
// micro-batch the processor reads and updates the `count` value, appends to the
// `batchCounts` list, reads and writes the `calls` entry of the `stats` map and emits one
// row, as plugins/counter does per key and batch.
//
// Prints one JSON line. The events are checked: the sum of numInputRows over the query's
// progress reports and the sum of the committed rows' `count` column must equal --events.
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.Trigger;
import org.apache.spark.sql.streaming.ValueState;
import scala.Tuple2;

public class CounterTws {
    /** The counter, per key and micro-batch: see the file's comment. */
    public static class Counter extends StatefulProcessor<String, Row, Tuple2<String, Long>> {
        private transient ValueState<Long> count;
        private transient ListState<Long> batchCounts;
        private transient MapState<String, Long> stats;

        @Override
        public void init(OutputMode outputMode, TimeMode timeMode) {
            count = getHandle().getValueState("count", Encoders.LONG(), TTLConfig.NONE());
            batchCounts =
                    getHandle().getListState("batchCounts", Encoders.LONG(), TTLConfig.NONE());
            stats =
                    getHandle()
                            .getMapState(
                                    "stats", Encoders.STRING(), Encoders.LONG(), TTLConfig.NONE());
        }

        @Override
        public scala.collection.Iterator<Tuple2<String, Long>> handleInputRows(
                String key, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
            long batch = 0;
            while (rows.hasNext()) {
                rows.next();
                batch++;
            }
            count.update((count.exists() ? count.get() : 0L) + batch);
            batchCounts.appendValue(batch);
            stats.updateValue("calls", (stats.containsKey("calls") ? stats.getValue("calls") : 0L) + 1);
            return scala.jdk.javaapi.CollectionConverters.asScala(
                    List.of(new Tuple2<>(key, batch)).iterator());
        }
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i + 1 < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --name value, got " + argv[i]);
            }
            args.put(argv[i].substring(2), argv[i + 1]);
        }
        String input = required(args, "input");
        String work = required(args, "work");
        int cores = Integer.parseInt(required(args, "cores"));
        int partitions = Integer.parseInt(required(args, "partitions"));
        long expected = Long.parseLong(required(args, "events"));

        SparkSession spark =
                SparkSession.builder()
                        .master("local[" + cores + "]")
                        .appName("statebox-bench-peers")
                        .config("spark.sql.shuffle.partitions", String.valueOf(partitions))
                        .config(
                                "spark.sql.streaming.stateStore.providerClass",
                                "org.apache.spark.sql.execution.streaming.state."
                                        + "RocksDBStateStoreProvider")
                        .config("spark.ui.enabled", "false")
                        .config("spark.ui.showConsoleProgress", "false")
                        .config("spark.sql.session.timeZone", "UTC")
                        .getOrCreate();
        spark.sparkContext().setLogLevel("ERROR");
        Dataset<Row> events =
                spark.readStream()
                        .schema("key string, value long")
                        .option("maxFilesPerTrigger", 1)
                        .json(input);
        Dataset<Row> out =
                events.groupByKey((MapFunction<Row, String>) r -> r.getString(0), Encoders.STRING())
                        .transformWithState(
                                new Counter(),
                                TimeMode.None(),
                                OutputMode.Append(),
                                Encoders.tuple(Encoders.STRING(), Encoders.LONG()))
                        .toDF("key", "count");
        String output = work + "/output";
        long started = System.nanoTime();
        StreamingQuery query =
                out.writeStream()
                        .format("json")
                        .option("path", output)
                        .option("checkpointLocation", work + "/checkpoint")
                        .trigger(Trigger.AvailableNow())
                        .outputMode("append")
                        .start();
        query.awaitTermination();
        double seconds = (System.nanoTime() - started) / 1e9;
        long read = 0;
        List<String> batchMs = new ArrayList<>();
        for (StreamingQueryProgress p : query.recentProgress()) {
            if (p.numInputRows() > 0) {
                read += p.numInputRows();
                batchMs.add(String.valueOf(p.durationMs().get("triggerExecution")));
            }
        }
        Row sum =
                spark.read().schema("key string, count long").json(output).agg(
                        org.apache.spark.sql.functions.sum("count")).first();
        long counted = sum.isNullAt(0) ? 0 : sum.getLong(0);
        spark.stop();
        if (read != expected || counted != expected) {
            System.err.printf(
                    "spark: read %d input rows and committed counts summing to %d; expected %d%n",
                    read, counted, expected);
            System.exit(1);
        }
        System.out.printf(
                "{\"workload\":\"count\",\"engine\":\"spark-java\",\"events\":%d,\"batches\":%d,"
                        + "\"cores\":%d,\"partitions\":%d,\"state_store\":\"rocksdb\","
                        + "\"seconds\":%.3f,\"events_per_s\":%d,\"batch_ms\":[%s]}%n",
                read,
                batchMs.size(),
                cores,
                partitions,
                seconds,
                Math.round(read / seconds),
                String.join(",", batchMs));
    }

    static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }
}
