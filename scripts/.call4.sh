set -u
mkdir -p $OUT/r3
export PYTHONPATH=src
R=tests/gpu/test_gpu_round3.py
run() { # name gpu timeout args...
  local n=$1 g=$2 t=$3; shift 3
  ( CUDA_VISIBLE_DEVICES=$g EVTFUSE_CACHE_DIR=$(mktemp -d) timeout $t python3 -m pytest -q -m gpu -p no:cacheprovider --durations=5 "$@" > $OUT/r3/$n.log 2>&1; echo "rc=$?" >> $OUT/r3/$n.log ) &
}
run lce 0 540 $R -k "cross_entropy or nn_linear or forms"
run f64ops 1 540 "$R::test_float64_ops_and_reductions_match_torch_on_the_gpu"
for i in 0 1 2 3 4 5 6 7; do run g$i $(( i % 4 )) 540 "$R::test_gradcheck_every_op_in_float64_on_the_gpu[$i]"; done
( CUDA_VISIBLE_DEVICES=2 timeout 300 python3 scripts/.host_lce.py > $OUT/host_lce.txt 2>&1 ) &
( CUDA_VISIBLE_DEVICES=3 EVTFUSE_CACHE_DIR=$(mktemp -d) timeout 400 python3 benchmarks/mlp.py --variants cublas6,evtfuse --tune exhaustive --rounds 3 --profile evtfuse --out $OUT/mlp_exhaustive.json > $OUT/mlp_exhaustive.txt 2>&1 ) &
wait
for f in $OUT/r3/*.log; do echo "$(basename $f): $(grep -E ' in [0-9.]+s' $f | tail -1) $(tail -1 $f)"; grep -E "^E " $f | head -5; done > $OUT/r3_summary.txt
cat $OUT/r3_summary.txt; head -12 $OUT/host_lce.txt; tail -12 $OUT/mlp_exhaustive.txt
