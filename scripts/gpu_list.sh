#!/usr/bin/env bash
# The GPUs the device scripts spread their work over, space-separated: those
# CUDA_VISIBLE_DEVICES lists (one or several: 1,2,3), else every GPU of the host (none: 0).
# Used by gpu_tier.sh and triton_bench.sh:  read -r -a gpus <<< "$(scripts/gpu_list.sh)"
if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
  echo "${CUDA_VISIBLE_DEVICES//,/ }"
else
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  seq -s ' ' 0 $(( (n > 0 ? n : 1) - 1 ))
fi
