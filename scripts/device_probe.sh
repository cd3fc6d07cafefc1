#!/usr/bin/env bash
# One device call (~6 minutes): the two-state optimizers' short launch timed in the suite
# (profile_backward cannot hold ADAM's b8192 twice over: 45 GB a module), then Nsight Compute
# on the backward's pieces kernel and FBGEMM's on ctr-dlrm. Results under $OUT: device.txt,
# default/, short_two/, short_two_w2/ (backward.{json,md}), ncu_ctr-dlrm_backward.txt.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_probe.sh
source "$(dirname "$0")/device_common.sh" "two-state short launch; ncu backward"
opts=ADAM,PARTIAL_ROWWISE_ADAM,LAMB
echo "=== default $(date +%T)"
timeout 120 python3 -m tbe_plugin.benchmarks.backward --out "$OUT/default" --configs b8192 --optimizers $opts \
  --min-timed-ms 30 2>&1 | grep "| bwd |" | tail -8
for cand in short_two short_two_w2; do
  echo "=== $cand $(date +%T)"
  timeout 120 python3 -m tbe_plugin.benchmarks.profile_backward --suite-with $cand -- --out "$OUT/$cand" \
    --configs b8192 --optimizers $opts --min-timed-ms 30 2>&1 | grep "| bwd |" | tail -8
done
OUT=$OUT CONFIGS=ctr-dlrm KERNELS=backward TIMED_TIMEOUT=100 bash "$(dirname "$0")/device_ncu.sh"
