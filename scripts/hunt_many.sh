#!/usr/bin/env bash
# Several scripts/fuzz_hunt.py processes at once on one GPU (compiles are CPU-bound), one
# per "KINDS|INPUTS|DTYPES" argument, each with its own evtfuse cache and seed. Usage, on the
# GPU machine from the repository root:
#   scripts/hunt_many.sh LOGDIR COUNT TIMEOUT_S SHAPES "gluon:first|same|bf16" "hopper:first|int8,e4m3|fp16" ...
# Logs go to LOGDIR/<n>.log; prints each process's last line (its summary).
set -u
out=${1:?log folder}; count=${2:?count}; limit=${3:?timeout}; shapes=${4:-}
shift 4
mkdir -p "$out"
n=0
for spec in "$@"; do
  IFS='|' read -r kinds inputs dtypes <<< "$spec"
  n=$((n + 1))
  ( EVTFUSE_CACHE_DIR=$(mktemp -d) PYTHONPATH=src timeout "$limit" python3 scripts/fuzz_hunt.py \
      --count "$count" --seed "$n" --kinds "$kinds" --inputs "${inputs:-same}" \
      --dtypes "${dtypes:-bf16,fp16}" ${shapes:+--shapes "$shapes"} > "$out/$n.log" 2>&1
    echo "rc=$? ($spec)" >> "$out/$n.log" ) &
done
wait
for f in "$out"/*.log; do echo "$(basename "$f"): $(tail -2 "$f" | tr '\n' ' ')"; done
