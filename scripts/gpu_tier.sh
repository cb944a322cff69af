#!/usr/bin/env bash
# The GPU test tier in parallel shards on one GPU (compiles are CPU-bound: one process
# takes ~20 min cold, more than a 10-minute device call). Usage, on the GPU machine from
# the repository root:  scripts/gpu_tier.sh LOGDIR [TIMEOUT_S] [SHARD ...]
# Each shard gets its own evtfuse cache; logs go to LOGDIR/<shard>.log; prints one summary
# line per shard and exits non-zero if any shard failed or timed out. Another Triton:
# TRITON_DIR=/opt/t371 (a folder holding that release's unpacked `triton` package) goes
# ahead of src on PYTHONPATH. On a host with several GPUs the shards take them in turn
# (compiles are CPU-bound: such hosts also have more cores); CUDA_VISIBLE_DEVICES, when
# set (one GPU or a list: 1,2,3), names the GPUs they take. The longest shards run split over several processes
# (pytest --shard I/N, tests/conftest.py; logs <shard>.<I>.log): `splits` below, or NAME/N
# on the command line (NAME/1: whole). Fuzz failures are reported unshrunk (EVTFUSE_FUZZ_SHRINK=0).
# A shard still running at TIMEOUT_S gets SIGINT: pytest stops there and prints the failures
# it has seen and its count line (rc=124 in its log; killed 20 s later if it hangs).
# EVTFUSE_TEST_FAST_AS=background: every tune="fast" call tunes in the background instead
# (tests/conftest.py: the tier as it would run with "background" as the default).
set -u
out=${1:?log folder}
limit=${2:-540}
shift $(( $# < 2 ? $# : 2 ))
declare -A splits=([kernels_b]=3 [cast_fp8]=3 [special_g2]=3 [special_g1]=2 [grouped]=2 [softmax]=2
                   [autograd_r]=2 [autograd_s]=2 [fuzz_inputs]=2 [fuzz_other]=2 [round3]=8)
only=" "  # shard names to run (none: every shard)
for arg in "$@"; do
  name=${arg%%/*}
  only+="$name "
  [[ $arg == */* ]] && splits[$name]=${arg#*/}
done
mkdir -p "$out"
G=tests/gpu/test_gpu_gluon.py
K=tests/gpu/test_gpu_kernels.py
first="identity or bias_gelu or silu_mul or aux_device or row_vec or all_ops or bf16_vectors or lse_target"
kfirst="alpha_beta or odd_sizes or all_ops or batched"
# shard name -> "files|-k expression" (empty expression: every GPU test of the files)
declare -A shards=(
  [gluon_a]="$G|not epilogues and not cooperative and not batched"
  [gluon_batched]="$G|batched"
  [gluon_co_a]="$G|cooperative and ($first)"
  [gluon_co_b]="$G|cooperative and not ($first)"
  [gluon_b]="$G|epilogues and ($first)"
  [gluon_c]="$G|epilogues and not ($first)"
  [kernels_a]="$K|$kfirst"
  [kernels_b]="$K|not ($kfirst)"
  [cast_fp8]="tests/gpu/test_gpu_cast.py tests/gpu/test_gpu_fp8.py|"
  [cli_examples]="tests/test_cli.py tests/test_examples.py|"
  [names]="tests/gpu/test_gpu_names.py|"
  [offsets_lm]="tests/gpu/test_gpu_offsets.py|lm_head and not gluon"
  [offsets_lm_gluon]="tests/gpu/test_gpu_offsets.py|lm_head and gluon"
  [offsets_int8]="tests/gpu/test_gpu_offsets.py|not lm_head"
  [fuzz_gluon]="tests/test_fuzz_kernels.py|gluon"
  [fuzz_other]="tests/test_fuzz_kernels.py tests/test_fuzz_calls.py|not gluon and not other_inputs"
  [fuzz_inputs]="tests/test_fuzz_kernels.py|other_inputs"
  [safety_cache]="tests/gpu/test_gpu_call_safety.py tests/gpu/test_gpu_cache.py tests/gpu/test_gpu_background.py|"
  [torch]="tests/gpu/test_gpu_torch.py tests/gpu/test_gpu_docs.py|"
  [special_g1]="tests/gpu/test_gpu_special_values.py|gluon-first"
  [special_g2]="tests/gpu/test_gpu_special_values.py|gluon-coop or gluon-wide"
  [special_o]="tests/gpu/test_gpu_special_values.py|hopper or portable"
  [autograd_r]="tests/gpu/test_gpu_autograd.py|not random and not save"
  [autograd_s]="tests/gpu/test_gpu_autograd.py|not random and save"
  [autograd_fuzz]="tests/gpu/test_gpu_autograd.py|random"
  [grad_fuzz]="tests/gpu/test_gpu_grad_fuzz.py tests/gpu/test_gpu_decisions.py|"
  [round3]="tests/gpu/test_gpu_round3.py|"
  [split_k]="tests/gpu/test_gpu_split_k.py|"
  [linear_ce]="tests/gpu/test_gpu_linear_cross_entropy.py|"
  [grouped]="tests/gpu/test_gpu_grouped.py|"
  [gated]="tests/gpu/test_gpu_gated.py|"
  [mlp]="tests/gpu/test_gpu_mlp.py|"
  [moe]="tests/gpu/test_gpu_moe.py|"
  [softmax]="tests/gpu/test_gpu_softmax.py|"
  [export]="tests/gpu/test_gpu_export_cutlass.py|"  # nvcc of CUTLASS 4.2 (.vendor/ wheel)
  [distributed]="tests/gpu/test_gpu_distributed.py|"  # two GPUs (skipped on one)
)
for f in tests/gpu/test_*.py; do  # a GPU test file in no shard would never run
  [[ " ${shards[*]} " == *"$f"* ]] || { echo "gpu_tier.sh: $f is in no shard" >&2; exit 2; }
done
for name in $only; do
  [[ -n ${shards[$name]:-} ]] || { echo "gpu_tier.sh: no shard $name" >&2; exit 2; }
done
read -r -a gpus <<< "$(scripts/gpu_list.sh)"
all=$(IFS=,; echo "${gpus[*]}")
i=0
# one process per shard part, each with its share of the cores (torch's CPU threads and
# evtfuse's compile threads would otherwise each take every core: 40 processes of 64
# threads ran the 3.6.0 tier at a third of its speed on a 64-core host)
selected=()
procs=0
for name in "${!shards[@]}"; do
  [[ $only == " " || $only == *" $name "* ]] || continue
  selected+=("$name")
  (( procs += ${splits[$name]:-1} ))
done
cores=$(nproc)
share=$(( cores / procs > 0 ? cores / procs : 1 ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$share} EVTFUSE_COMPILE_WORKERS=${EVTFUSE_COMPILE_WORKERS:-$share}
export EVTFUSE_FUZZ_SHRINK=${EVTFUSE_FUZZ_SHRINK:-0}  # a failing example as drawn
pids=()
logs=()
for name in "${selected[@]}"; do
  files=${shards[$name]%%|*}
  sel=${shards[$name]#*|}
  read -r -a args <<< "$files"
  [[ -n $sel ]] && args+=(-k "$sel")
  n=${splits[$name]:-1}
  for (( part = 1; part <= n; part++ )); do
    log=$out/$name.log
    extra=()
    (( n > 1 )) && { log=$out/$name.$part.log; extra=(--shard "$part/$n"); }
    gpu=${gpus[i++ % ${#gpus[@]}]}
    [[ $name == torch ]] && gpu=$all  # its tests of tensors on cuda:1
    ( CUDA_VISIBLE_DEVICES=$gpu EVTFUSE_CACHE_DIR=$(mktemp -d) PYTHONPATH=${TRITON_DIR:+$TRITON_DIR:}src timeout -s INT -k 20 "$limit" \
        python3 -m pytest -q -m gpu -p no:cacheprovider "${args[@]}" "${extra[@]}" > "$log" 2>&1
      echo "rc=$?" >> "$log" ) &
    pids+=($!)
    logs+=("$log")
  done
done
wait "${pids[@]}"
status=0
for log in "${logs[@]}"; do
  summary=$(grep -E " in [0-9.]+s" "$log" | tail -1)
  rc=$(tail -1 "$log")
  name=${log##*/}
  echo "${name%.log}: $summary $rc"
  [[ $rc == rc=0 ]] || status=1
done
exit $status
