"""One call of the fused TriMul kernel on one benchmark workload (for ncu): python experiments/trimul_call_once.py NAME."""
import sys

import torch

from ksearch_ray.taskspec.task import find_task, load_module_file

task = find_task("trimul")
ref = load_module_file(task.root / "reference.py", "r")
w = next(w for w in task.workloads("benchmarks", "cuda") if w.name == sys.argv[1])
data = ref.pack_data(ref.generate_inputs(w, 7, "cuda"))
mod = load_module_file(task.root / "solutions" / "triton_fused" / "submission.py", "s")
for _ in range(2):
    mod.custom_kernel(data)
torch.cuda.synchronize()
