#!/usr/bin/env bash
# The README's second example: scd1 from one Kafka topic to another, exactly once.
#
# Starts a throwaway Kafka-protocol broker (tansu, in memory, on 127.0.0.1:$PORT; installed
# by .ci/setup), creates the topics `locations` and `latest-locations`, produces the scd1
# sample into `locations`, runs `statebox run` Kafka to Kafka, prints the output topic as a
# read_committed consumer would see it, and stops the broker. Run it from the repository root.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The same build as .ci/run's, so a machine that ran the tests rebuilds nothing.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/statebox/target}"
port="${PORT:-19092}"
tansu="${STATEBOX_KAFKA_DIR:-$HOME/.cache/statebox/kafka}/bin/tansu"
work="$(mktemp -d)"
"$tansu" broker --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$work/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done
for topic in locations latest-locations; do
    "$tansu" topic create "$topic" --partitions 2 --broker "tcp://127.0.0.1:$port" >/dev/null
done
# One record per sample line, a user's records on one partition so they stay in order.
# One `tansu cat produce` per record: after a batch of several records, tansu 0.6 reports
# a short end offset (a broker bug, see tests/src/kafka.rs), and readers would stop early.
while IFS= read -r line; do
    case "$line" in *'"user":"u'[13579]*) p=1 ;; *) p=0 ;; esac
    printf '{"value":%s}\n' "$line" |
        "$tansu" cat produce locations --partition "$p" --broker "tcp://127.0.0.1:$port"
done < <(cat plugins/scd1/sample/*.jsonl)

# $STATEBOX_BIN (the tests set it) or a build of this checkout.
${STATEBOX_BIN:-cargo run --release -q -p statebox --} run --processor plugins/scd1 --key user \
    --input "kafka://127.0.0.1:$port/locations" \
    --output "kafka://127.0.0.1:$port/latest-locations" \
    --checkpoint "$work/checkpoint"

echo "latest-locations (each user's latest location):"
for p in 0 1; do
    "$tansu" cat consume latest-locations --partition "$p" --max-wait-time-ms 500 \
        --broker "tcp://127.0.0.1:$port" |
        python3 -c 'import json, sys
for doc in sys.stdin.read().split("\n"):
    for r in json.loads(doc) if doc.strip() else []:
        if r["value"]:
            print(json.dumps(r["value"]))'
done
