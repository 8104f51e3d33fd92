"""GPU benchmarks of the Triton kernels for `pytest bench/` on a CUDA machine (skipped without
one): the workloads of `bench/gpu_workloads.py` (the training step and the four elementwise
groups, each against flowcore's PyTorch backend, eager PyTorch and torch.compile) at d = 768 and
1024, batch 65 536 and 262 144, timed interleaved (min and median), with the ceilings measured in
the same run. `python3 bench/gpu_check.py --out DIR` runs the goal subset of these in one short
run with the CUDA tests."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU benchmarks need CUDA")]

if torch.cuda.is_available():
    from gpu_workloads import ELEMENTWISE, copy_bandwidth_gbps, flow_step_train, time_interleaved

DIMS = (768, 1024)
BATCHES = (65536, 262144)


@pytest.fixture(scope="module")
def copy_gbps():
    return copy_bandwidth_gbps()


@pytest.fixture(autouse=True)
def _tf32_for_everyone():
    """float32 GEMMs use TF32 in cuBLAS, in torch.compile and in the Triton kernels alike."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(previous)


def _record(record, group: str, workload: dict, times: dict, copy_gbps: float | None = None) -> None:
    for label, t in times.items():
        extra = {f"{label}_min_ms": t["min_s"] * 1e3, f"{label}_gbps": workload["bytes"] / t["median_s"] / 1e9}
        if copy_gbps:
            extra[f"{label}_copy_fraction"] = extra[f"{label}_gbps"] / copy_gbps
        record(group, label, median=t["median_s"], **extra)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32-tf32"])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("d", DIMS)
def test_flow_step_forward_backward(record, goal, d, batch, dtype):
    workload = flow_step_train(batch, d, dtype)
    times = time_interleaved(workload["calls"])
    group = f"flow step forward+backward d={d} batch={batch} {dtype}"
    _record(record, group, workload, times)
    for other, target in (("eager", 2.0), ("compile", 1.2)):
        goal(f"{group}: {other} / triton", times[other]["median_s"] / times["triton"]["median_s"], target,
             how=f"median {other} time / median triton time")


@pytest.mark.parametrize("name", list(ELEMENTWISE) if torch.cuda.is_available() else [])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("d", DIMS)
def test_elementwise(record, goal, copy_gbps, name, d, batch):
    workload = ELEMENTWISE[name](batch, d, torch.bfloat16)
    times = time_interleaved(workload["calls"])
    group = f"{name} d={d} batch={batch} bfloat16"
    _record(record, group, workload, times, copy_gbps)
    goal(f"{group}: triton GB/s / copy GB/s", workload["bytes"] / times["triton"]["median_s"] / 1e9 / copy_gbps, 0.8,
         how="the op's minimum bytes over its median time, against a device copy measured in the same run")
