set -u
mkdir -p $OUT
export PYTHONPATH=src
( CUDA_VISIBLE_DEVICES=0 EVTFUSE_CACHE_DIR=$(mktemp -d) timeout 560 python3 benchmarks/models.py --models llama --variants original,patched,original_compile,patched_compile,patched_mlp,patched_loss --rounds 5 --out $OUT/models_llama.json > $OUT/models_llama.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 EVTFUSE_CACHE_DIR=$(mktemp -d) timeout 560 python3 benchmarks/models.py --models qwen3 --variants original,patched,original_compile,patched_compile --rounds 5 --out $OUT/models_qwen3.json > $OUT/models_qwen3.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=2 EVTFUSE_CACHE_DIR=$(mktemp -d)
  timeout 200 python3 benchmarks/mlp.py --out $OUT/mlp.json > $OUT/mlp.txt 2>&1
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_mlp.py > $OUT/mlp_tests.txt 2>&1
  timeout 120 python3 scripts/.diag_mlp.py > $OUT/diag_mlp.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=3 EVTFUSE_CACHE_DIR=$(mktemp -d)
  timeout 60 python3 scripts/.diag_overflow.py > $OUT/diag_overflow.txt 2>&1
  timeout 480 python3 benchmarks/linear_cross_entropy.py --chunk-mib 192,224 --peers cublas,eager,evtfuse,compile,evtfuse_compile --out $OUT/lce.json > $OUT/lce.txt 2>&1 ) &
wait
tail -25 $OUT/models_llama.txt; tail -15 $OUT/models_qwen3.txt
tail -12 $OUT/mlp.txt; tail -3 $OUT/mlp_tests.txt; grep -E "^E " $OUT/mlp_tests.txt | head; cat $OUT/diag_mlp.txt | tail -5
tail -12 $OUT/lce.txt
