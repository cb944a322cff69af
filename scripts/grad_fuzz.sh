#!/usr/bin/env bash
# The GPU gradient fuzz at scale (tests/gpu/test_gpu_grad_fuzz.py): PROCS processes of
# EXAMPLES examples each, one seed a process (below), spread over the GPUs
# scripts/gpu_list.sh lists (one core each: compiles are CPU-bound). Usage, on the GPU
# machine from the repository root:  scripts/grad_fuzz.sh OUTDIR PROCS EXAMPLES [TIMEOUT_S] [FIRST_SEED]
# (process i draws from seed FIRST_SEED + i - 1; default 1: a new run past the last seed
# covers examples no earlier run drew).
# -> OUTDIR/<i>.json and <i>.log per process, OUTDIR/summary.json (scripts/grad_fuzz_summary.py).
# Another Triton: TRITON_DIR=/opt/tV goes ahead of src on PYTHONPATH.
set -u
out=${1:?outdir}; procs=${2:?procs}; examples=${3:?examples}; limit=${4:-480}; first=${5:-1}
mkdir -p "$out"
read -r -a gpus <<< "$(scripts/gpu_list.sh)"
for (( i = 1; i <= procs; i++ )); do
  CUDA_VISIBLE_DEVICES=${gpus[i % ${#gpus[@]}]} EVTFUSE_CACHE_DIR=$(mktemp -d) \
    EVTFUSE_FUZZ_SEED=$(( first + i - 1 )) EVTFUSE_FUZZ_EXAMPLES=$examples EVTFUSE_FUZZ_SHRINK=0 \
    EVTFUSE_GRAD_FUZZ_REPORT=$out/$i.json OMP_NUM_THREADS=1 EVTFUSE_COMPILE_WORKERS=1 \
    PYTHONPATH=${TRITON_DIR:+$TRITON_DIR:}src timeout "$limit" \
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_grad_fuzz.py \
    > "$out/$i.log" 2>&1 &
done
wait
python3 scripts/grad_fuzz_summary.py "$out"/*.json > "$out/summary.json"
cat "$out/summary.json"
