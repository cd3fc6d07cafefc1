#!/usr/bin/env bash
# One device call: Nsight Compute on the TBE kernels of suite configs, ours and FBGEMM's, in
# the kernel suite's own process (same modules, same inputs): where a kernel's time goes
# (speed of light, memory hierarchy hit rates, occupancy, warp stalls, registers). Before
# it, the configs timed plainly (5 rounds). Results under $OUT: device.txt, timed.{json,md}
# (the suite's report for CONFIGS), ncu_<config>_<pass>.txt (ncu's details page).
#   CONFIGS (default ctr-dlrm,long-bags): suite configs;
#   KERNELS (default forward): forward (ours _pooled_forward_kernel and _warp_pooled_forward_kernel, FBGEMM's
#     *codegen_forward*) and/or backward (ours _pieces_kernel, FBGEMM's *backward_codegen*) and/or plan
#     (ours: the marks, positions and sorted-operands kernels, 0.20 + 0.15 + 0.21 ms on ctr-dlrm at 25326c6,
#     the first two at a third of copy bandwidth) and/or hot (ours: the hot rows' choice, the positions
#     kernel's counting, the split's compaction and the product; with a CANDIDATE that has hot_rows);
#   CANDIDATE (default: none): a profile_backward candidate our modules take (the suite then runs
#     through ``profile_backward --suite-with``), e.g. stack16.
# After the GPU stack's second call (../shared/device/README.md):
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_ncu.sh
source "$(dirname "$0")/device_common.sh" "Nsight Compute: ${CONFIGS:-ctr-dlrm,long-bags} ${KERNELS:-forward}"
CONFIGS=${CONFIGS:-ctr-dlrm,long-bags}
# The suite's command: the backward benchmark itself, or under a candidate launch.
suite=(python3 -m tbe_plugin.benchmarks.backward)
[ -n "${CANDIDATE:-}" ] && suite=(python3 -m tbe_plugin.benchmarks.profile_backward --suite-with "$CANDIDATE" --)
echo "=== timed ${CANDIDATE:-default} $(date +%T)"
timeout ${TIMED_TIMEOUT:-150} "${suite[@]}" --out "$OUT/timed" --configs "$CONFIGS" \
  --iters 5 --warmup 2 --batches 2 2>&1 | grep "| fwd |\|| bwd |" | tail -8
for name in $(echo "$CONFIGS" | tr , ' '); do
  for pass in $(echo "${KERNELS:-forward}" | tr , ' '); do
    case $pass in
      forward) regex='_pooled_forward_kernel|codegen_forward' ;;
      backward) regex='_pieces_kernel|backward_codegen' ;;
      plan) regex='_piece_marks_kernel|_positions_kernel|_sorted_operands_kernel' ;;  # ours only
      hot) regex='_choose_hot_kernel|_positions_kernel|_hot_split_kernel|_compact_kept_kernel|_hot_partials_kernel' ;;
      *) echo "KERNELS: forward, backward, plan or hot, got $pass"; exit 2 ;;
    esac
    echo "=== ncu $name $pass $(date +%T)"
    # The suite's check step runs each provider's forward (and backward) once, then the
    # timed calls: 6 launches profiled cover both providers. Clocks as the suite ran them
    # (--clock-control none); caches flushed before each replay (ncu's default).
    timeout ${NCU_TIMEOUT:-200} ncu --clock-control none -k "regex:$regex" --launch-count ${LAUNCHES:-6} \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --log-file "$OUT/ncu_${name}_${pass}.txt" \
      "${suite[@]}" --out /tmp/ncu-bench --configs "$name" --iters 1 --warmup 0 --batches 1 > /dev/null 2>&1
    echo "rc $? $(grep -c 'Section: GPU Speed Of Light' "$OUT/ncu_${name}_${pass}.txt" 2>/dev/null) kernels profiled"
    keys="^  [_a-z].*\(|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit Rate|L2 Hit Rate"
    grep -E "$keys|Registers Per|Achieved Occupancy" "$OUT/ncu_${name}_${pass}.txt" | cut -c1-160 | head -60
  done
done
echo "=== done $(date +%T)"
