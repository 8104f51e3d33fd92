"""The GPU benchmark workloads (bench/gpu_workloads.py) run on the CPU at a small size, the
Triton kernels in the interpreter: every implementation a GPU run times (torch.compile aside)
computes the same thing, so the GPU check measures equal work and cannot fail on a slip that
only a GPU run would show; and the byte counter counts."""
import pytest
import torch

from helpers.bench_modules import import_bench

gpu_workloads = import_bench("gpu_workloads")

BUILDERS = {"flow step forward+backward": gpu_workloads.flow_step_train,
            **gpu_workloads.ELEMENTWISE}


def _flat(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for item in result for t in _flat(item)]


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_implementation_computes_the_same(name):
    torch.manual_seed(0)
    workload = BUILDERS[name](64, 48, torch.float64, device="cpu")
    assert workload["bytes"] > 0 and set(workload["calls"]) >= {"triton", "eager"}
    results = {label: _flat(call()) for label, call in workload["calls"].items()
               if label not in ("compile", "cublas")}
    reference = results.pop("eager")
    for label, outputs in results.items():
        assert len(outputs) == len(reference), label
        for out, ref in zip(outputs, reference):
            torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name} {label}: {m}")
    if "cublas" in workload["calls"]:
        assert all(t.shape[0] > 0 for t in _flat(workload["calls"]["cublas"]()))


def test_the_fused_training_step_moves_fewer_bytes_than_eager():
    """Counted op by op (views and allocations free): the Triton step's forward and backward
    read and write less than the composed eager ops, and more than the step's GEMMs alone."""
    workload = gpu_workloads.flow_step_train(256, 96, torch.float32, device="cpu")
    moved = {label: gpu_workloads.bytes_moved(workload["calls"][label]) for label in ("triton", "eager", "cublas")}
    assert moved["cublas"] < moved["triton"] < moved["eager"], moved
