#!/usr/bin/env bash
# On the device (after .gpu-stack/install.sh b): GPU tests, A/B benchmarks and the launch
# sweep, each step under its own time limit, logs and reports into $OUT.
# Usage: bash scripts/device_run.sh STEP...   steps: fwdtests bwdtests bench bwdbench selfcheck tune profile
#        adaptertests shardedbench gputests pipebench pipebench_ws ab e2e
#   ab: scripts/ab.py at staleness 0 then 1 (AB_STALENESS=1 for k=1 alone), each under AB_TIMEOUT (290 s); ab.py
#   rewrites report.md and summary.json after every finished run, so a cut one still brings back what it finished
#   (rebuilt with `python3 scripts/ab.py --report-only --out /tmp/ab_stale$k`: the run it cut, at which step).
set -uo pipefail
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
for step in "$@"; do
  echo "=== $step $(date +%T)"
  case $step in
    fwdtests) timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests -k "not training and not weight_decay" 2>&1 | tee "$OUT/gpu_fwd_tests.log" | tail -30 ;;
    bwdtests) timeout ${BWD_TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests -k "training or weight_decay" 2>&1 | tee "$OUT/gpu_bwd_tests.log" | tail -30 ;;
    bench) timeout ${BENCH_TIMEOUT:-150} python3 -m tbe_plugin.benchmarks.forward --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tail -40 | tee "$OUT/bench.log" ;;
    bwdbench) timeout ${BWD_BENCH_TIMEOUT:-200} python3 -m tbe_plugin.benchmarks.backward --out "$OUT" ${BWD_BENCH_ARGS:-} 2>&1 | tail -60 | tee "$OUT/bwdbench.log" ;;
    selfcheck) timeout 120 python3 -m tbe_plugin.benchmarks.forward --self-check --configs b8192,zipf1.15 --out "$OUT/selfcheck" 2>&1 | tail -20 | tee "$OUT/selfcheck.log" ;;
    profile) timeout ${PROFILE_TIMEOUT:-240} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" ${PROFILE_ARGS:-} 2>&1 | tail -30 | tee "$OUT/profile.log" ;;
    adaptertests) timeout ${ADAPTER_TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/torchrec 2>&1 | tee "$OUT/gpu_adapter_tests.log" | tail -30 ;;
    shardedbench) timeout ${SHARDED_BENCH_TIMEOUT:-200} python3 -m tbe_plugin.benchmarks.sharded --out "$OUT" ${SHARDED_BENCH_ARGS:-} 2>&1 | tail -30 | tee "$OUT/shardedbench.log" ;;
    gputests) timeout ${GPU_TESTS_TIMEOUT:-480} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests ${GPU_TESTS_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    pipebench) timeout ${PIPE_BENCH_TIMEOUT:-400} python3 -m pipelines.bench.pipeline --out "$OUT" ${PIPE_BENCH_ARGS:-} 2>&1 | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage" | tee "$OUT/pipebench.log" | tail -40 ;;
    pipebench_ws) timeout ${PIPE_BENCH_TIMEOUT:-300} torchrun --standalone --nproc_per_node ${NPROC:-2} -m pipelines.bench.pipeline --out "$OUT" ${PIPE_BENCH_ARGS:-} 2>&1 | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage" | tee "$OUT/pipebench_ws.log" | tail -40 ;;
    # The reports and summaries come back, also of an A/B cut by its timeout: then rebuilt from the run folders,
    # naming the run it cut and its last step (8 files at most: the runs' own folders stay in /tmp).
    ab) for k in ${AB_STALENESS:-0 1}; do timeout ${AB_TIMEOUT:-290} python3 scripts/ab.py --out "/tmp/ab_stale$k" --skip 20 -- experiment=ab_dlrm pipeline.staleness=$k ${AB_ARGS:-} 2>&1 | tail -30 | tee "$OUT/ab_stale$k.log"
          if [ "${PIPESTATUS[0]}" = 124 ]; then timeout 60 python3 scripts/ab.py --report-only --out "/tmp/ab_stale$k" >/dev/null 2>&1; fi
          for f in report.md summary.json; do cp "/tmp/ab_stale$k/$f" "$OUT/ab_stale${k}_$f" 2>/dev/null; done; done ;;
    e2e) timeout ${E2E_TIMEOUT:-480} python3 -m pipelines.bench.e2e --out "$OUT" ${E2E_ARGS:-} 2>&1 | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT" | tee "$OUT/e2e.log" | tail -60 ;;
    tune) timeout ${TUNE_TIMEOUT:-240} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" ${TUNE_ARGS:-} 2>&1 | tail -30 | tee "$OUT/tune.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
