#!/usr/bin/env bash
# One device call (<= 8 minutes) that measures backward launch candidates (profile_backward's
# CANDIDATES: HEAD's default is the pieces design, ops/backward_pieces.py) against FBGEMM on
# the production-shaped configs, then the whole backward suite under the best of them.
# Results under $OUT (8 files at most come back): device.txt, gpu_bwd_tests.log, host_profile.txt
# (where a small backward's host time goes, per candidate), profile_backward.json, run.log,
# backward.json, backward.md, suite_launch.json;
# the best candidate's name also in /tmp/tbe_best_candidate for scripts/device_e2e_best.sh.
#
# The machine needs the GPU stack first (../shared/device/README.md): a call with carry
# [".gpu-stack/part-a", ".gpu-stack/install.sh"] running `bash .gpu-stack/install.sh a`, then
# THE call, carry [".gpu-stack/part-b", ".gpu-stack/install.sh"], command (commit and dirty
# flag from this checkout, written in literally: the device's copy has no .git):
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_bwd_next.sh
#
# Steps and their limits (seconds), 530 in all: GPU tests of the backward 100 (TESTS=0 skips
# them); host_profile 60; profile_backward on seven configs, most telling first (the JSON is rewritten after
# each, so a cut run keeps what it measured; each candidate's kernels are profiled too) 230;
# the whole backward suite (5 timed rounds) under the profile's best candidate 140.
# CANDIDATES and CONFIGS (comma-separated) override the defaults below.
source "$(dirname "$0")/device_common.sh"

echo "=== gpu tests $(date +%T)"
[ "${TESTS:-1}" = 0 ] || timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_embedding_backward.py tests/ops/test_backward_pieces.py tests/ops/test_backward_graphs.py \
  tests/test_fbgemm_parity.py 2>&1 | tee "$OUT/gpu_bwd_tests.log" | tail -15

echo "=== host profile $(date +%T)"
timeout 60 python3 -m tbe_plugin.benchmarks.host_profile --out /tmp/host_profile --calls 20 2>&1 | grep "backward wall" \
  | tee -a "$OUT/run.log"
cp /tmp/host_profile/host_profile.txt "$OUT/" 2>/dev/null

echo "=== profile $(date +%T)"
CANDIDATES=${CANDIDATES:-default,records,ordered,graphs,auto}
CONFIGS=${CONFIGS:-ctr-mix,wide-d512-fp16,long-bags,zipf1.15,b8192,user-id,fbgemm-standard}
timeout 230 python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" --configs "$CONFIGS" \
  --candidates "$CANDIDATES" --iters 5 2>&1 | grep -v "no entry for\|compatibility" | tee -a "$OUT/run.log" | tail -40

echo "=== suite $(date +%T)"
BEST=$(python3 -m tbe_plugin.benchmarks.profile_backward --best-of "$OUT/profile_backward.json" 2>>"$OUT/run.log")
echo "best candidate: ${BEST:-none (see run.log)}" | tee -a "$OUT/run.log"
# For a next call on the same warm machine (scripts/device_e2e_best.sh): $OUT is emptied, /tmp stays.
echo "${BEST:-default}" > /tmp/tbe_best_candidate
if [ -n "$BEST" ]; then
  timeout 140 python3 -m tbe_plugin.benchmarks.profile_backward --suite-with "$BEST" -- --out "$OUT" --iters 5 \
    --warmup 2 --batches 2 2>&1 | grep -v "no entry for\|compatibility" | tee -a "$OUT/run.log" | tail -40
fi
echo "=== done $(date +%T)"
