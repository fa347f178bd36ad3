#!/usr/bin/env bash
# Regenerate sample_traces/: the worked example (eight requests at once, seven stop at 32 tokens) on the torch runner (CPU), captured with
# `itertrace profile` in static and in continuous mode. Needs Nsight Systems (scripts/setup.sh installs it).
# Keeps per capture the report and the run directory; the database (15-25 MB) is made again with
#   .venv/bin/itertrace ingest sample_traces/NAME/run sample_traces/NAME/report.nsys-rep --db NAME.duckdb
set -euo pipefail
cd "$(dirname "$0")/.."
# One torch thread: on a small shared machine two OpenMP threads stall each other whenever another
# process takes a core (decode forwards jump from ~10 ms to ~550 ms), which is not what the samples show.
export OMP_NUM_THREADS=1
itertrace=.venv/bin/itertrace
for mode in static continuous; do
  out=sample_traces/worked-example-$mode
  rm -rf "$out"
  "$itertrace" profile --out "$out" --trace nvtx,osrt -- \
    "$itertrace" run --runner torch --device cpu --workload worked-example --capacity 8 --mode "$mode" --seed 0
  rm -f "$out/trace.duckdb" "$out/profile.log"
done
du -sh sample_traces
