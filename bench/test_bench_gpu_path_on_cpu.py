"""What can be measured of the GPU path without a GPU, for `pytest bench/`:

- host time per Triton op call with the launch itself made a no-op (so only the Python and
  dispatcher layers are timed): the eager direct call against the registered custom op it
  bypasses (`_utils.registered_op`), on a batch-32 affine coupling (the paper's batch size,
  where host time dominates on a GPU);
- the bytes the training step moves forward and backward, op by op (`gpu_workloads.bytes_moved`),
  per row of a large batch, in bf16 at d = 768: the fused Triton step, flowcore's PyTorch-backend
  step, the composed eager ops and the step's GEMMs alone. Per-row figures come from two batch
  sizes (the weights' bytes cancel).
"""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import flowcore.kernels.triton.coupling as coupling


def _seconds_per_call(fn, calls: int = 2000, rounds: int = 7) -> list[float]:
    for _ in range(200):
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    return samples


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def test_host_overhead_per_op_call(record, monkeypatch):
    monkeypatch.setattr(coupling, "wrap_triton", lambda kernel: _NoLaunch())
    x2, h = torch.randn(32, 384), torch.randn(32, 768)
    direct = lambda: coupling._affine_fwd(x2, h, False)  # noqa: E731
    registered = lambda: coupling._affine_fwd.op(x2, h, False)  # noqa: E731
    samples = {"direct": [], "registered op": []}
    for _ in range(2):  # interleaved
        samples["direct"] += _seconds_per_call(direct)
        samples["registered op"] += _seconds_per_call(registered)
    group = "host time per Triton op call, launch excluded (affine coupling 32 x 384)"
    for label, values in samples.items():
        record(group, label, median=statistics.median(values), **{f"{label} min_us": min(values) * 1e6})


BYTES_SCRIPT = """
import json
import torch
from gpu_workloads import bytes_moved, flow_step_train
counts = {}
for batch in (256, 1024):
    workload = flow_step_train(batch, 768, torch.bfloat16, device="cpu")
    counts[batch] = {label: bytes_moved(call) for label, call in workload["calls"].items() if label != "compile"}
print(json.dumps({"counts": counts, "minimum": workload["bytes"] / 1024}))
"""


def test_training_step_bytes_moved_per_row(measure):
    """In a subprocess with TRITON_INTERPRET=1: the kernels must be imported under the
    interpreter to run on the CPU, which the rest of bench/ must not be."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run([sys.executable, "-c", BYTES_SCRIPT], capture_output=True, text=True, env=env,
                            timeout=900, check=True)
    figures = json.loads(result.stdout.splitlines()[-1])
    small, large = figures["counts"]["256"], figures["counts"]["1024"]
    group = "training step bytes moved per row, forward + backward, d=768 bfloat16"
    for label in large:
        measure(group, label, (large[label] - small[label]) / (1024 - 256) / 1e3, "KB")
    measure(group, "minimum", figures["minimum"] / 1e3, "KB")
