#!/usr/bin/env bash
# Every GPU-marked test. With pytest-xdist on the device (carry ".gpu-stack/extra", made here
# by scripts/gpu_extra.sh: the device has no xdist) they run in $WORKERS processes (6 by
# default; a test file a worker at a time, module fixtures shared) in one call: the Triton
# compiles, most of their time, spread over the device's 16 cores. Without xdist, in shards
# that each fit one device call (all of them serially outran a 590 s call at b8e6fc3: 115 of
# 119 done; 556 s of tests in two shards at 692138f). Shard S of N runs the tests whose index
# in collection order is S modulo N; the 15 slowest durations; results under $OUT:
# device.txt, gpu_tests_S_of_N.log (the collection first, then the run).
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_tests.sh   (xdist: one call)
#   ... SHARD=0 SHARDS=2 bash scripts/device_tests.sh, then SHARD=1                (serial)
source "$(dirname "$0")/device_common.sh" "GPU tests"
extra=$PWD/.gpu-stack/extra
[ -d "$extra" ] && export PYTHONPATH="$extra:$PYTHONPATH"
parallel=()
if [ "${WORKERS:-6}" -gt 1 ] && python3 -c "import xdist, pytest; assert int(pytest.__version__.split('.')[0]) >= 7" 2>/dev/null; then
  parallel=(-n "${WORKERS:-6}" --dist loadfile)
  SHARDS=${SHARDS:-1}
fi
SHARD=${SHARD:-0} SHARDS=${SHARDS:-2}
log="$OUT/gpu_tests_${SHARD}_of_${SHARDS}.log"
python3 -m pytest -q -m gpu --collect-only -p no:cacheprovider tests 2>/dev/null | grep "::" > "$OUT/ids.txt"
awk -v s="$SHARD" -v n="$SHARDS" '(NR - 1) % n == s' "$OUT/ids.txt" > "$OUT/shard.txt"
{ echo "# shard $SHARD of $SHARDS: $(wc -l < "$OUT/shard.txt") of $(wc -l < "$OUT/ids.txt") GPU tests;" \
    "workers: ${parallel[1]:-1}"
  cat "$OUT/shard.txt"; } > "$log"
rm -f "$OUT/ids.txt"
if [ ! -s "$OUT/shard.txt" ]; then  # pytest without test ids would run the whole tests/ directory
  echo "device_tests.sh: no GPU test in shard $SHARD of $SHARDS (did the collection fail?)" | tee -a "$log" >&2
  rm -f "$OUT/shard.txt"
  exit 1
fi
timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -rs --durations=15 ${parallel[@]+"${parallel[@]}"} \
  $(cat "$OUT/shard.txt") 2>&1 | tee -a "$log" | tail -25
status=${PIPESTATUS[0]}
rm -f "$OUT/shard.txt"
exit "$status"
