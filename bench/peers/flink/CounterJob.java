// The counter workload of `statebox bench count` on Flink 2.3: a DataStream job in a local
// MiniCluster, RocksDB state, exactly-once checkpoints and an exactly-once file sink.
//
//   java -cp classes:flink-lib/* CounterJob --input DIR --output DIR --work DIR
//        --parallelism N --checkpoint-interval-ms MS --events N
//
// The input is the folder `generate_count_input` writes: JSON lines {"key":"k<n>","value":<i>},
// one file per Statebox batch. A bounded FileSource reads every file of the folder; its
// splits (one per file) are handed to the source's parallel readers as they ask, so files
// are read concurrently and not strictly in name order (the counter's totals do not depend
// on the order). Per event, the KeyedProcessFunction does what `plugins/counter` does per
// key and batch: the `count` value read and updated, one element appended to the
// `batchCounts` list, the `calls` entry of the `stats` map read and written, and one row
// emitted. Flink calls the function once per event, Statebox once per key and batch.
//
// Prints one JSON line. The job's events are counted twice: by an accumulator in the
// function and by reading back the rows the file sink committed; both must equal --events.
import java.io.BufferedReader;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.HashMap;
import java.util.Map;
import java.util.stream.Stream;

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.accumulators.LongCounter;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.serialization.SimpleStringEncoder;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.connector.file.sink.FileSink;
import org.apache.flink.connector.file.src.FileSource;
import org.apache.flink.connector.file.src.reader.TextLineInputFormat;
import org.apache.flink.core.fs.Path;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

public class CounterJob {
    static final String EVENTS = "events";

    /** The key of a generated line `{"key":"k<n>",...}`; anything else is refused by name. */
    static String keyOf(String line) {
        String prefix = "{\"key\":\"";
        int end = line.indexOf('"', prefix.length());
        if (!line.startsWith(prefix) || end < 0) {
            throw new IllegalArgumentException(
                    "input line is not {\"key\":\"...\",...}: " + line);
        }
        return line.substring(prefix.length(), end);
    }

    /** The counter, per event: see the file's comment. */
    public static class Counter extends KeyedProcessFunction<String, String, String> {
        private transient ValueState<Long> count;
        private transient ListState<Long> batchCounts;
        private transient MapState<String, Long> stats;
        private final LongCounter events = new LongCounter();

        @Override
        public void open(OpenContext context) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
            batchCounts =
                    getRuntimeContext()
                            .getListState(new ListStateDescriptor<>("batchCounts", Types.LONG));
            stats =
                    getRuntimeContext()
                            .getMapState(
                                    new MapStateDescriptor<>("stats", Types.STRING, Types.LONG));
            getRuntimeContext().addAccumulator(EVENTS, events);
        }

        @Override
        public void processElement(String line, Context ctx, Collector<String> out)
                throws Exception {
            Long previous = count.value();
            count.update((previous == null ? 0 : previous) + 1);
            batchCounts.add(1L);
            Long calls = stats.get("calls");
            stats.put("calls", (calls == null ? 0 : calls) + 1);
            events.add(1);
            out.collect("{\"key\":\"" + ctx.getCurrentKey() + "\",\"count\":1}");
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
        String output = required(args, "output");
        java.nio.file.Path work = java.nio.file.Path.of(required(args, "work"));
        int parallelism = Integer.parseInt(required(args, "parallelism"));
        long intervalMs = Long.parseLong(required(args, "checkpoint-interval-ms"));
        long expected = Long.parseLong(required(args, "events"));

        Configuration conf = new Configuration();
        // Embedded RocksDB on local disk, as a user with state larger than memory runs it;
        // incremental checkpoints, so a checkpoint uploads only new SST files (Statebox's
        // commit writes only the batch's changes too).
        conf.setString("state.backend.type", "rocksdb");
        conf.setString("state.backend.rocksdb.localdir", work.resolve("rocksdb").toString());
        conf.setString("execution.checkpointing.incremental", "true");
        conf.setString("execution.checkpointing.interval", intervalMs + " ms");
        conf.setString("execution.checkpointing.mode", "EXACTLY_ONCE");
        conf.setString(
                "execution.checkpointing.dir", work.resolve("checkpoints").toUri().toString());
        StreamExecutionEnvironment env =
                StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);

        FileSource<String> source =
                FileSource.forRecordStreamFormat(new TextLineInputFormat(), new Path(input))
                        .build();
        // Row files are committed (made visible) at checkpoints: exactly once.
        FileSink<String> sink =
                FileSink.forRowFormat(new Path(output), new SimpleStringEncoder<String>("UTF-8"))
                        .build();
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "count-input")
                .keyBy(CounterJob::keyOf, Types.STRING)
                .process(new Counter(), Types.STRING)
                .sinkTo(sink);

        long started = System.nanoTime();
        JobExecutionResult result = env.execute("statebox-bench-count");
        double wallSeconds = (System.nanoTime() - started) / 1e9;
        double seconds = result.getNetRuntime() / 1000.0;
        long events = result.<Long>getAccumulatorResult(EVENTS);
        long committedRows = committedRows(java.nio.file.Path.of(output));
        if (events != expected || committedRows != expected) {
            System.err.printf(
                    "flink: processed %d events and committed %d rows; expected %d%n",
                    events, committedRows, expected);
            System.exit(1);
        }
        System.out.printf(
                "{\"workload\":\"count\",\"engine\":\"flink\",\"events\":%d,"
                        + "\"output_rows\":%d,\"parallelism\":%d,\"checkpoint_interval_ms\":%d,"
                        + "\"state_backend\":\"rocksdb\",\"seconds\":%.3f,\"wall_seconds\":%.3f,"
                        + "\"events_per_s\":%d}%n",
                events,
                committedRows,
                parallelism,
                intervalMs,
                seconds,
                wallSeconds,
                Math.round(events / seconds));
    }

    static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    /** Lines of the sink's committed files; in-progress and pending files start with a dot. */
    static long committedRows(java.nio.file.Path dir) throws IOException {
        long rows = 0;
        try (Stream<java.nio.file.Path> files = Files.walk(dir)) {
            for (java.nio.file.Path f : (Iterable<java.nio.file.Path>) files::iterator) {
                if (!Files.isRegularFile(f) || f.getFileName().toString().startsWith(".")) {
                    continue;
                }
                try (BufferedReader r = Files.newBufferedReader(f, StandardCharsets.UTF_8)) {
                    while (r.readLine() != null) {
                        rows++;
                    }
                }
            }
        }
        return rows;
    }
}
