set -u
mkdir -p /opt/t390 && cat .gpu-triton/3.9.0/part_* | xz -dc | tar -x -C /opt/t390
mkdir -p $OUT/r3 $OUT/t390
ids=$(PYTHONPATH=src python3 -m pytest --collect-only -q -m gpu tests/gpu/test_gpu_round3.py 2>/dev/null | grep "::")
n=0
for id in $ids; do
  n=$((n+1))
  ( CUDA_VISIBLE_DEVICES=$((n % 4)) OMP_NUM_THREADS=2 EVTFUSE_COMPILE_WORKERS=2 EVTFUSE_CACHE_DIR=$(mktemp -d) PYTHONPATH=src timeout 480 python3 -m pytest -q -s -m gpu -p no:cacheprovider --durations=0 "$id" > $OUT/r3/$n.log 2>&1; echo "rc=$? $id" >> $OUT/r3/$n.log ) &
done
shards=$(grep -oE '^\s+\[[a-z0-9_]+\]=' scripts/gpu_tier.sh | tr -d ' []=' | grep -v -x round3 | sort -u | tr '\n' ' ')
TRITON_DIR=/opt/t390 scripts/gpu_tier.sh $OUT/t390 480 $shards > $OUT/t390_summary.txt 2>&1
wait
for f in $OUT/r3/*.log; do tail -1 $f; grep -E "passed|failed|Error" $f | tail -2; done > $OUT/r3_summary.txt
cat $OUT/t390_summary.txt $OUT/r3_summary.txt
