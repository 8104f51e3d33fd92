"""torch.compile traces the Triton backend without graph breaks, no GPU needed: with the real
(not interpreted) kernels, a stand-in sm_90 driver and launches made no-ops, Dynamo captures a
folded linear map, an affine coupling and an ActNorm (training: their differentiable ops) in one
graph (`fullgraph=True`), and AOTAutograd runs its forward and backward. The host-side checks
that choose between Triton and cuBLAS GEMMs must not break the graph. (The fused step itself
takes the reference path under torch.compile: `kernels.step.step_path`.) Runs in a subprocess: the
kernels must be imported with TRITON_INTERPRET=0."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["TRITON_INTERPRET"] = "0"
    from helpers.sm90_compile import _Sm90Driver
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
    driver.set_active(_Sm90Driver())
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: None  # launches are no-ops
    import torch
    import flowcore.backend
    import flowcore.kernels.dispatch
    import flowcore.kernels.triton._utils as kernel_utils
    flowcore.kernels.dispatch.interpreter_enabled = lambda: True
    kernel_utils._sm_count = lambda index: 132
    kernel_utils.require_launchable = lambda tensor, op: None
    from flowcore.kernels import actnorm, affine_coupling, folded_linear

    torch.set_float32_matmul_precision("high")  # float32 GEMMs on Triton (TF32)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))

    def step(x, weight, bias, loc, logs):
        y = folded_linear(x, weight, bias)
        z2, logdet = affine_coupling(y[:, 8:], net(y[:, :8]))
        return actnorm(torch.cat([y[:, :8], z2], dim=1), loc, logs).sum() + logdet.sum()

    args = [torch.randn(32, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True),
            torch.randn(16, requires_grad=True), torch.randn(16), torch.randn(16)]
    with flowcore.backend.use_backend("triton"):
        explained = torch._dynamo.explain(step)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        torch.compile(step, backend="aot_eager", fullgraph=True)(*args).backward()
    assert args[1].grad.shape == (16, 16)
    print("traced")
    """
)


def test_the_triton_backend_compiles_in_one_graph():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0 and "traced" in result.stdout, result.stderr[-4000:]
