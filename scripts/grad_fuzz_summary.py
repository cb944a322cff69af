"""Sums up the per-process reports of the GPU gradient fuzz (tests/gpu/test_gpu_grad_fuzz.py,
``EVTFUSE_GRAD_FUZZ_REPORT``): examples (distinct ones by key), gradients, misses, evtfuse's
and torch's relative errors against float64 (median, 99th percentile, worst), the largest
ratios of evtfuse's error to the bound it must stay within, and the first misses.
Usage: python3 scripts/grad_fuzz_summary.py REPORT.json ..."""

import json
import sys


def quantiles(xs):
    xs = sorted(xs)
    if not xs:
        return {}
    return {"median": xs[len(xs) // 2], "p99": xs[int(len(xs) * 0.99)], "worst": xs[-1]}


runs = [json.load(open(p)) for p in sys.argv[1:]]
keys = [k for r in runs for k in r["keys"]]
out = {"processes": len(runs), "examples": sum(r["examples"] for r in runs),
       "distinct_examples": len(set(keys)),
       "boundary_examples": sum(r["boundary"] for r in runs),
       "recompute_runs": sum(r["recompute"] for r in runs),
       "save_runs": sum(r["save"] for r in runs),
       "gradients": sum(r["gradients"] for r in runs), "misses": sum(r["misses"] for r in runs),
       "evtfuse_error": quantiles([e for r in runs for e in r["evtfuse_errors"]]),
       "torch_bf16_error": quantiles([e for r in runs for e in r["torch_errors"]]),
       "largest_ratios_to_bound": sorted(x for r in runs for x in r["bound_ratios"])[-10:],
       "first_misses": [m for r in runs for m in r["first_misses"]][:30]}
print(json.dumps(out, indent=1))
