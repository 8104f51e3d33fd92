"""The GPU benchmark workloads, in one place for `bench/gpu_check.py` and
`bench/test_bench_kernels_gpu.py`: each builds, for one (batch, d, dtype), a callable per
implementation and the bytes and flops one call needs at minimum.

Implementations: `triton` (flowcore's Triton plan: for the step, the fused training step
`_TritonStep`), `torch` (flowcore's PyTorch plan: for the step, the CPU Function `_AffineStep`
with its hand-written backward, path "folded"), `eager` (the composed PyTorch ops under autograd:
the `*_ref` twins), `compile` (torch.compile of `eager`, static shapes). `cublas` (step
only) runs just the step's GEMMs, a floor for any implementation that keeps them on cuBLAS.
Bytes count each input read once and each output written once, for the op itself: gradients of
the outputs are given (`autograd.grad` with preallocated cotangents), so no loss or cast is
charged to the kernels.

`bytes_moved(call)` counts what an implementation really moves: the bytes every op it
dispatches reads and writes (views free), flowcore's registered Triton ops included.

Also the ceilings measured in the same run: device copy bandwidth, pinned host-to-device
bandwidth, cuBLAS GEMM throughput.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from flowcore.kernels import Plan, actnorm_ref, couple_ref

WIDTH = 32  # the conditioner's hidden width in the paper's l2_d3_w32 Glow


def time_interleaved(calls: dict[str, Callable], rounds: int = 7, inner: int = 5) -> dict[str, dict]:
    """Seconds per call of each implementation, `rounds` interleaved rounds of `inner` calls
    timed with CUDA events after one warm-up round: {label: {"min_s", "median_s"}}."""
    samples = {label: [] for label in calls}
    for label, call in calls.items():
        call()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for label, call in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                call()
            end.record()
            end.synchronize()
            samples[label].append(start.elapsed_time(end) / 1e3 / inner)
    return {label: {"min_s": min(s), "median_s": statistics.median(s)} for label, s in samples.items()}


class _ByteCounter(TorchDispatchMode):
    """Sums, over the ops dispatched, the bytes of their tensor inputs and of their outputs that
    are new memory (not views of, or written into, an input). Views and uninitialised
    allocations are free."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        free = ("detach", "alias", "_unsafe_view", "empty", "new_empty")  # views; allocations write nothing
        if getattr(func, "is_view", False) or func.__name__.startswith(free):
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        pointers = {t.data_ptr() for t in inputs}
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.data_ptr() not in pointers]
        self.bytes += sum(t.numel() * t.element_size() for t in inputs + outputs)
        return out


def bytes_moved(call: Callable) -> int:
    """The bytes one call of `call` reads and writes, op by op (`_ByteCounter`)."""
    with _ByteCounter() as counter:
        call()
    return counter.bytes


def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=False)


def _conditioner(split: int, d2: int, dtype, device) -> nn.Module:
    net = nn.Sequential(nn.Linear(split, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                        nn.Linear(WIDTH, 2 * d2))
    with torch.no_grad():
        net[-1].weight.mul_(0.01)
    return net.to(device=device, dtype=dtype)


def flow_step_train(batch: int, d: int, dtype, device: str = "cuda") -> dict:
    """One affine Glow step (ActNorm + 1x1 folded in W, b) forward and backward, as a Glow in
    training runs it: x needs its gradient (a step after the first), the loss's gradient reaches
    z as 2 z (the prior's squared norm) and the log-det as -1."""
    split = d // 2
    x = torch.randn(batch, d, device=device, dtype=dtype, requires_grad=True)
    weight = (torch.linalg.qr(torch.randn(d, d, device=device))[0] * 1.1).to(dtype).requires_grad_()
    bias = (0.1 * torch.randn(d, device=device)).to(dtype).requires_grad_()
    net = _conditioner(split, d - split, dtype, device)
    dz = torch.randn(batch, d, device=device, dtype=dtype)
    dlogdet = torch.full((batch,), -1.0, device=device)
    inputs = [x, weight, bias, *net.parameters()]

    def step(path):
        plan = Plan(path)

        def run():
            z, logdet = plan.folded_step(x, weight, bias, split, net)
            return torch.autograd.grad((z, logdet), inputs, (dz, dlogdet.to(logdet.dtype)))
        return run

    def gemms():
        y = x.detach() @ weight.detach().T
        hidden = y[:, :split] @ net[0].weight.detach().T
        return y @ weight.detach(), y.T @ x.detach(), hidden.T @ y[:, :split]

    s = torch.finfo(dtype).bits // 8
    flops = 3 * 2 * batch * d * d + 3 * 2 * batch * (split * WIDTH + WIDTH * WIDTH + WIDTH * 2 * (d - split))
    return {
        "calls": {"triton": step("triton"),
                  "torch": step("folded"),
                  "eager": step("reference"),
                  "compile": _compiled(step("reference")),
                  "cublas": gemms},
        # x and dz read, z and dx written once; h and dh (2 d2 wide) written and read once each
        "bytes": batch * s * (4 * d + 4 * 2 * (d - split)),
        "flops": flops,
    }


def actnorm_forward(batch: int, d: int, dtype, device: str = "cuda") -> dict:
    x = torch.randn(batch, d, device=device, dtype=dtype)
    loc, logs = torch.randn(d, device=device, dtype=dtype), 0.1 * torch.randn(d, device=device, dtype=dtype)
    s = x.element_size()
    triton = Plan("triton")
    return {"calls": {"triton": lambda: triton.actnorm(x, loc, logs),
                      "eager": lambda: actnorm_ref(x, loc, logs),
                      "compile": _compiled(lambda: actnorm_ref(x, loc, logs))},
            "bytes": 2 * batch * d * s}


def actnorm_forward_backward(batch: int, d: int, dtype, device: str = "cuda") -> dict:
    x = torch.randn(batch, d, device=device, dtype=dtype, requires_grad=True)
    loc = torch.randn(d, device=device, dtype=dtype, requires_grad=True)
    logs = (0.1 * torch.randn(d, device=device, dtype=dtype)).requires_grad_()
    upstream = torch.randn_like(x)

    def run(op):
        return lambda: torch.autograd.grad(op(x, loc, logs), (x, loc, logs), upstream)

    return {"calls": {"triton": run(Plan("triton").actnorm), "eager": run(actnorm_ref),
                      "compile": _compiled(run(actnorm_ref))},
            "bytes": 5 * batch * d * x.element_size()}  # x in, y out; g and x in, dx out


def affine_coupling_forward(batch: int, d: int, dtype, device: str = "cuda") -> dict:
    x2 = torch.randn(batch, d // 2, device=device, dtype=dtype)
    h = torch.randn(batch, d, device=device, dtype=dtype)
    s = x2.element_size()
    triton = Plan("triton")
    return {"calls": {"triton": lambda: triton.couple(x2, h),
                      "eager": lambda: couple_ref(x2, h),
                      "compile": _compiled(lambda: couple_ref(x2, h))},
            "bytes": 4 * x2.numel() * s + 4 * batch}  # x2, h (2x) in, z2 out; float32 log-dets


def affine_coupling_forward_backward(batch: int, d: int, dtype, device: str = "cuda") -> dict:
    x2 = torch.randn(batch, d // 2, device=device, dtype=dtype, requires_grad=True)
    h = torch.randn(batch, d, device=device, dtype=dtype, requires_grad=True)
    upstream, upstream_logdet = torch.randn_like(x2), torch.randn(batch, device=device)

    def run(op):
        return lambda: torch.autograd.grad(op(x2, h), (x2, h), (upstream, upstream_logdet))

    s = x2.element_size()
    # forward: x2, h (2x) in, z2 out; backward: g, x2, h (2x) in, dx2, dh (2x) out
    return {"calls": {"triton": run(Plan("triton").couple), "eager": run(couple_ref),
                      "compile": _compiled(run(couple_ref))},
            "bytes": 11 * x2.numel() * s + 8 * batch}


# name -> workload builder(batch, d, dtype, device="cuda")
ELEMENTWISE = {"actnorm forward": actnorm_forward, "actnorm forward+backward": actnorm_forward_backward,
               "affine coupling forward": affine_coupling_forward,
               "affine coupling forward+backward": affine_coupling_forward_backward}


def copy_bandwidth_gbps(gigabytes: float = 4.0) -> float:
    """Device-to-device copy: bytes read + written per second (the elementwise kernels' ceiling)."""
    src = torch.empty(int(gigabytes * 1e9 / 2) // 4, device="cuda", dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = time_interleaved({"copy": lambda: dst.copy_(src)}, rounds=5, inner=3)["copy"]["min_s"]
    return 2 * src.numel() * 4 / seconds / 1e9


def host_to_device_gbps(gigabytes: float = 2.0) -> float:
    """Pinned host memory to the device, bytes per second (the streaming calibration's ceiling)."""
    host = torch.empty(int(gigabytes * 1e9) // 4, dtype=torch.float32, pin_memory=True)
    target = torch.empty(host.shape, device="cuda")
    seconds = time_interleaved({"h2d": lambda: target.copy_(host, non_blocking=True)}, rounds=5, inner=2)["h2d"]
    return host.numel() * 4 / seconds["min_s"] / 1e9


def gemm_tflops(dtype, rows: int = 262144, d: int = 768) -> float:
    """cuBLAS (rows x d) @ (d x d) under the current float32 matmul precision."""
    a, b = torch.randn(rows, d, device="cuda", dtype=dtype), torch.randn(d, d, device="cuda", dtype=dtype)
    seconds = time_interleaved({"mm": lambda: a @ b}, rounds=5, inner=5)["mm"]["min_s"]
    return 2 * rows * d * d / seconds / 1e12
