"""Sums up the per-process reports of the GPU gradient fuzz (tests/gpu/test_gpu_grad_fuzz.py,
``EVTFUSE_GRAD_FUZZ_REPORT``): examples (distinct ones by key), gradients, misses, the worst
errors and the first misses. Usage: python3 scripts/grad_fuzz_summary.py REPORT.json ..."""

import json
import sys

runs = [json.load(open(p)) for p in sys.argv[1:]]
keys = [k for r in runs for k in r["keys"]]
out = {"processes": len(runs), "examples": sum(r["examples"] for r in runs),
       "distinct_examples": len(set(keys)),
       "boundary_examples": sum(r["boundary"] for r in runs),
       "recompute_runs": sum(r["recompute"] for r in runs),
       "save_runs": sum(r["save"] for r in runs),
       "gradients": sum(r["gradients"] for r in runs), "misses": sum(r["misses"] for r in runs),
       "worst_evtfuse_error": max(r["worst_evtfuse_error"] for r in runs),
       "worst_torch_error": max(r["worst_torch_error"] for r in runs),
       "first_misses": [m for r in runs for m in r["first_misses"]][:30]}
print(json.dumps(out, indent=1))
