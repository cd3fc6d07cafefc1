#!/usr/bin/env bash
# Every GPU-marked test, in shards that each fit one device call (all of them together outran
# a 590 s call at b8e6fc3: 115 of 119 done). Shard S of N runs the tests whose index in
# collection order is S modulo N, with the 15 slowest durations; results under $OUT:
# device.txt, gpu_tests_S_of_N.log (the collection first, then the run).
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> SHARD=0 SHARDS=2 bash scripts/device_tests.sh
source "$(dirname "$0")/device_common.sh" "GPU tests, shard ${SHARD:-0} of ${SHARDS:-2}"
log="$OUT/gpu_tests_${SHARD:-0}_of_${SHARDS:-2}.log"
python3 -m pytest -q -m gpu --collect-only -p no:cacheprovider tests 2>/dev/null | grep "::" > "$OUT/ids.txt"
awk -v s="${SHARD:-0}" -v n="${SHARDS:-2}" '(NR - 1) % n == s' "$OUT/ids.txt" > "$OUT/shard.txt"
{ echo "# shard ${SHARD:-0} of ${SHARDS:-2}: $(wc -l < "$OUT/shard.txt") of $(wc -l < "$OUT/ids.txt") GPU tests"
  cat "$OUT/shard.txt"; } > "$log"
rm -f "$OUT/ids.txt"
timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -q -p no:cacheprovider -rs --durations=15 $(cat "$OUT/shard.txt") 2>&1 \
  | tee -a "$log" | tail -25
rm -f "$OUT/shard.txt"
