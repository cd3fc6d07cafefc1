#!/usr/bin/env bash
# One device call (~3 minutes): the host-bound small configs (FBGEMM's standard B=512, user-id)
# under the default launch and without the short launch (`noshort`: one pieces launch and no
# short list, fewer graph nodes), each twice, alternating, 30 rounds. Results under $OUT:
# device.txt, {default,noshort}_{1,2}/backward.json, host/host_profile.{json,txt} (both launches).
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_small.sh
source "$(dirname "$0")/device_common.sh" "small configs: default against noshort"
args="--configs ${CONFIGS:-fbgemm-standard,user-id} --iters 30 --warmup 3 --batches 2"
for rep in 1 2; do
  echo "=== default $rep $(date +%T)"
  timeout 90 python3 -m tbe_plugin.benchmarks.backward --out "$OUT/default_$rep" $args 2>&1 | grep "| bwd |" | tail -4
  echo "=== noshort $rep $(date +%T)"
  timeout 90 python3 -m tbe_plugin.benchmarks.profile_backward --suite-with noshort -- --out "$OUT/noshort_$rep" $args \
    2>&1 | grep "| bwd |" | tail -4
done
echo "=== host profile $(date +%T)"
timeout 90 python3 -m tbe_plugin.benchmarks.host_profile --out "$OUT/host" --candidates default,noshort --calls 30 2>&1 \
  | grep "=====\|backward wall" | tail -8
rm -f "$OUT"/*_[12]/backward.md  # the device returns at most 8 files: the JSONs hold the tables
echo "=== done $(date +%T)"
