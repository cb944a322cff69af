#!/usr/bin/env bash
# The suite's evtfuse cells on several Tritons, one after the other on one GPU, then one
# table (scripts/triton_table.py). On the GPU machine, from the repository root:
#   scripts/triton_bench.sh OUTDIR 3.6.0= 3.7.1=/opt/t371 3.9.0=/opt/t390
# NAME=DIR: DIR holds that release's unpacked `triton` package (empty: the installed one);
# the first is the baseline. Runs already in OUTDIR (an earlier call on the same machine)
# are not measured again, so one call per Triton fits the 10-minute device limit.
# BUDGET_S (default 420) bounds each run; SHAPES and WORKLOADS override the cells
# (default: ten workloads, fp8 included, at 8192x8192x1024 and 4096^3). On a host with
# several GPUs the runs go at once, one per GPU in turn (each run's ratios are to cuBLAS on
# its own GPU, so the table compares like with like; compiles share the CPUs, which moves
# first-call times only). CUDA_VISIBLE_DEVICES (a list: 1,2,3) names the GPUs to use;
# TUNE (default fast) is evtfuse.gemm's tune= for every run.
set -u
out=${1:?out dir}; shift
shapes=${SHAPES:-8192x8192x1024,4096}
workloads=${WORKLOADS:-identity,alpha_beta,bias_relu,bias_gelu_tanh,relu_aux,silu_mul,row_amax,bce_loss,row_logsumexp,fp8_scale_amax}
read -r -a ids <<< "$(scripts/gpu_list.sh)"
gpus=${#ids[@]}
runs=()
i=0
for spec in "$@"; do
  name=${spec%%=*}; dir=${spec#*=}
  runs+=("$name=$out/$name")
  [[ -f $out/$name/results.json ]] && { echo "$name: measured earlier"; continue; }
  mkdir -p "$out"
  gpu=${ids[i++ % gpus]}
  ( CUDA_VISIBLE_DEVICES=$gpu EVTFUSE_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d) \
      PYTHONPATH=${dir:+$dir:}src \
      python3 benchmarks/run.py --systems evtfuse,mm --no-compile --no-chart --shapes "$shapes" \
        --workloads "$workloads" --budget-s "${BUDGET_S:-420}" --tune "${TUNE:-fast}" --out "$out/$name" \
        > "$out/$name.log" 2>&1
    echo "$name: rc=$? (GPU $gpu)" ) &
  (( i % gpus == 0 )) && wait  # every GPU busy: the next run waits for this round
done
wait
(( ${#runs[@]} > 1 )) && python3 scripts/triton_table.py "${runs[@]}" | tee "$out/table.md"
