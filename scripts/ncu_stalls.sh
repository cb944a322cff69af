#!/usr/bin/env bash
# Warp stall reasons (ncu, per issued instruction) of the first gluon kernel of one
# scripts/variant_probe.py variant; a development probe.
# usage: scripts/ncu_stalls.sh SHAPE VARIANT OUTFILE   e.g. scripts/ncu_stalls.sh 2048x2048x2048 bce $OUT/st.txt
m=""
for r in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait no_instruction membar branch_resolving dispatch_stall lg_throttle sleeping selected not_selected tex_throttle drain imc_miss misc; do
  m="$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
m="gpu__time_duration.sum,smsp__inst_executed.sum${m}"
PYTHONPATH=src ncu --clock-control none --kernel-name regex:evtfuse --launch-skip 1 --launch-count 1 --metrics "$m" \
  python3 scripts/variant_probe.py --shape "$1" --once "$2" > "$3" 2>&1
