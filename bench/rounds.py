#!/usr/bin/env python3
"""Compares `statebox bench` runs of several builds on a noisy machine.

Runs each build in turn, ROUNDS times, and prints per build the median and range of its
events/s and of the CPU seconds (user + sys) its process used, with the processes it ran
(e.g. cargo checking the benchmark's plugin), then every run's figures.

    bench/rounds.py ROUNDS BINARY... -- BENCH-ARGS...
    bench/rounds.py 6 /tmp/before /tmp/after -- count --events 4000000 --keys 100000 \\
        --batches 8 --engine wasm

Each run must print exactly one summary line (a JSON line without a "batch" field): `bench
count` with one `--engine`, `bench timers`, `bench ttl`.
"""

import json
import os
import resource
import statistics
import subprocess
import sys


def usage(message: str) -> None:
    sys.exit(f"rounds.py: {message}\n\n{__doc__}")


def run(binary: str, args: list[str]) -> tuple[float, float]:
    """One run: its events/s and the CPU seconds used by its process and those it ran."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [binary, "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        sys.exit(f"rounds.py: {binary} bench {' '.join(args)} exited with {done.returncode}")
    summaries = [
        json.loads(line)
        for line in done.stdout.splitlines()
        if line.startswith("{") and '"batch"' not in line
    ]
    if len(summaries) != 1:
        sys.exit(
            f"rounds.py: {binary} bench {' '.join(args)} printed {len(summaries)} summary "
            "lines, not one (with `bench count`, pick one --engine)"
        )
    return summaries[0]["events_per_s"], cpu


def thousands(v: float) -> str:
    return f"{v / 1000:.0f}k"


def main() -> None:
    argv = sys.argv[1:]
    if "--" not in argv:
        usage("missing -- before the bench arguments")
    split = argv.index("--")
    head, args = argv[:split], argv[split + 1 :]
    if len(head) < 2 or not args:
        usage("give ROUNDS, at least one BINARY, and the bench arguments")
    if not head[0].isdigit() or int(head[0]) < 1:
        usage(f"ROUNDS must be a positive number, not '{head[0]}'")
    rounds, binaries = int(head[0]), head[1:]
    for binary in binaries:
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            usage(f"'{binary}' is not an executable")
    runs: dict[str, list[tuple[float, float]]] = {b: [] for b in binaries}
    for _ in range(rounds):
        for binary in binaries:
            runs[binary].append(run(binary, args))
    for binary, figures in runs.items():
        events = [e for e, _ in figures]
        cpu = [c for _, c in figures]
        print(
            f"{binary}: events/s median {thousands(statistics.median(events))} "
            f"[{thousands(min(events))}-{thousands(max(events))}], CPU median "
            f"{statistics.median(cpu):.2f} s [{min(cpu):.2f}-{max(cpu):.2f}]"
        )
        print(
            "  events/s", " ".join(thousands(e) for e in events),
            "| CPU s", " ".join(f"{c:.2f}" for c in cpu),
        )


if __name__ == "__main__":
    main()
