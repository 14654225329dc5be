"""One framework workload as a script, for preflight --world-size (tests/fakegpu/test_frameworks.py).

    python tests/fakegpu/framework_job.py KIND OUT_DIR

Writes OUT_DIR/rank<RANK>.json: framework_workloads.measure(KIND, "cuda").
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.fakegpu.framework_workloads import measure  # noqa: E402

if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    result = measure(kind, "cuda")
    with open(os.path.join(out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump(result, f)
