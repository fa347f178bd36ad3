#!/usr/bin/env bash
# GPU checks, for a session that has a CUDA machine (CI has none, and nothing else depends on this).
#
# Run from the repository root on the GPU machine, with logs written under $OUT (default /tmp/gpu-check):
#   - the torch tests, which run on CUDA when it is present, and tests/profiler/test_cuda.py (CPU and CUDA
#     runners batch for batch);
#   - `itertrace run --runner torch --device cuda`, the same with and without --overlap side by side, and
#     the slot-time experiment on CUDA;
#   - the same run under `--torch-profile` (torch.profiler with CUDA activity: CUPTI), its trace ingested
#     with its run log, then the iterations' device intervals, the host gaps by phase and the GPU work per
#     stream on the engine's own kernels; the trace and the database are left in $OUT/torch-profile/;
#   - benchmarks/bench_queries.py, bench_scheduler.py and bench_simulated.py on that machine's cores.
# The machine has no network and no nsys: it needs the duckdb and nvtx wheels for its Python in .whl/
# (pip download --only-binary=:all: --python-version 3.12 ... duckdb==2.0.1 nvtx==0.2.11) and the
# sample capture exported here in .gpu/ (nsys export --type arrow -o .gpu/worked-example-continuous.arrow
# sample_traces/worked-example-continuous/report.nsys-rep). Stages run in order of importance, each
# under its own limit and all under DEADLINE seconds, so that a slow stage leaves the rest their turn;
# STAGES="tests bench_queries" runs only the stages named.
set -u
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1  # imports come from the installed package, not the checkout
LOGS=${OUT:-/tmp/gpu-check}
DEADLINE=$((SECONDS + ${DEADLINE:-540}))
mkdir -p "$LOGS"

stage() {  # stage NAME LIMIT COMMAND...: run COMMAND under min(LIMIT, time left), its output in NAME.log
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS - 5))
  shift 2
  if [[ -n ${STAGES:-} && " $STAGES " != *" $name "* ]]; then return; fi
  ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "=== $name: skipped, out of time"; return; fi
  echo "=== $name (limit ${limit}s, $(date +%T))"
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - start))s"
}

start=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/pkg . || exit 1
export PYTHONPATH=/tmp/pkg:/tmp/site PATH=/tmp/pkg/bin:$PATH
nvidia-smi -L
python3 -c "import torch, duckdb; print('torch', torch.__version__, torch.cuda.get_device_name(), 'duckdb', duckdb.__version__)"
echo "cores: $(nproc); setup took $((SECONDS - start))s"

TAIL=40 stage tests 200 python3 -m pytest -q -p no:cacheprovider -rs \
  tests/profiler/test_cuda.py tests/profiler/test_torch_runner.py tests/profiler/test_torch_engine.py tests/profiler/test_model.py tests/profiler/test_overlap_torch.py
stage run 60 itertrace run --runner torch --device cuda --workload synthetic --num-requests 64 \
  --output-len uniform:16:128 --capacity 16 --out /tmp/gpu-run
[[ -f /tmp/gpu-run/run.json ]] && python3 -c "import json; m = json.load(open('/tmp/gpu-run/run.json')); print({k: m[k] for k in ('runner', 'device', 'device_name', 'clock_source')})"
PROF=$LOGS/torch-profile
rm -rf "$PROF" /tmp/gpu-prof-run && mkdir -p "$PROF"
stage torch_profile 90 itertrace run --runner torch --device cuda --workload synthetic --num-requests 32 \
  --output-len uniform:16:64 --capacity 16 --out /tmp/gpu-prof-run --torch-profile "$PROF/torch"
if [[ -f $PROF/torch/trace.json.gz ]]; then
  stage torch_profile_ingest 60 itertrace ingest /tmp/gpu-prof-run "$PROF/torch/trace.json.gz" --db "$PROF/trace.duckdb"
  stage torch_profile_queries 60 bash -c "
    itertrace sql --db '$PROF/trace.duckdb' \"SELECT device_source, count(*) AS iterations, median(device_dur_ns) AS device_ns,
      median(launch_latency_ns) AS launch_ns, sum(gpu_op_count) AS gpu_ops FROM iterations GROUP BY ALL\" &&
    itertrace query host_gaps_by_phase --db '$PROF/trace.duckdb' &&
    itertrace sql --db '$PROF/trace.duckdb' \"SELECT device_id, stream_id, kind, count(*) AS ops, sum(dur_ns) AS busy_ns,
      count(correlation_id) AS correlated FROM gpu_ops GROUP BY ALL ORDER BY ALL\" &&
    { itertrace query gpu_time --db '$PROF/trace.duckdb' 2>/dev/null || echo '(no gpu_time query in this build)'; }"
fi
# overlap mode on CUDA beside the same run without it: throughput, TPOT, and the host-gap share from each run log
for mode in plain overlap; do
  stage "run_$mode" 60 itertrace run --runner torch --device cuda --workload synthetic --num-requests 64 \
    --output-len uniform:16:128 --capacity 16 --format json --out /tmp/gpu-run-$mode $([[ $mode == overlap ]] && echo --overlap)
done
python3 - <<'PY'
import json, numpy as np, pyarrow.parquet as pq
for mode in ("plain", "overlap"):
    try:
        s = json.load(open(f"/tmp/gpu-run-{mode}/run.json"))["summary"]
        t = pq.read_table(f"/tmp/gpu-run-{mode}/iterations.parquet", columns=["device_start_ns", "device_end_ns"])
    except OSError as exc:
        print(mode, "no run:", exc); continue
    start, end = (np.array(t.column(c).drop_null(), dtype=np.int64) for c in ("device_start_ns", "device_end_ns"))
    gaps = np.maximum(start[1:] - np.maximum.accumulate(end)[:-1], 0).sum()  # as host_gaps counts them
    print(f"{mode}: {s['throughput_tok_s']:.0f} tok/s, TPOT p50 {s['tpot_ms_p50']:.3f} ms, "
          f"gap share {gaps / (end.max() - start.min()):.3f}, tokens dropped {s['tokens_dropped']}")
PY
stage bench_queries 200 python3 benchmarks/bench_queries.py --repeat 2 --capture .gpu/worked-example-continuous.arrow
stage slot_time 150 itertrace experiment slot-time --runner torch --device cuda
stage bench_scheduler 45 python3 benchmarks/bench_scheduler.py
stage bench_simulated 180 python3 benchmarks/bench_simulated.py
echo "all stages done after $((SECONDS - start))s"
