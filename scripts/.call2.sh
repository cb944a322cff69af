set -u
mkdir -p $OUT
export PYTHONPATH=src
( CUDA_VISIBLE_DEVICES=0 timeout 540 python3 benchmarks/mlp.py --out $OUT/mlp.json > $OUT/mlp.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 540 python3 benchmarks/linear_cross_entropy.py --chunk-mib 192 --peers cublas,eager,evtfuse,compile,evtfuse_compile --out $OUT/lce.json > $OUT/lce.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=2 EVTFUSE_CACHE_DIR=$(mktemp -d) timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_mlp.py > $OUT/mlp_tests.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=3 EVTFUSE_CACHE_DIR=$(mktemp -d) timeout 540 python3 -m pytest -q -m gpu -p no:cacheprovider "tests/gpu/test_gpu_round3.py::test_linear_cross_entropy_special_values_on_the_gpu[overflowing_logits]" > $OUT/r3_overflow.txt 2>&1 ) &
wait
tail -5 $OUT/mlp_tests.txt; grep -E "^E " $OUT/mlp_tests.txt | head -20
grep -E "^E " $OUT/r3_overflow.txt | head -30; tail -2 $OUT/r3_overflow.txt
tail -15 $OUT/mlp.txt; tail -15 $OUT/lce.txt
