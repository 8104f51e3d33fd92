"""torch.compile traces the Triton plan's elementwise ops without graph breaks, no GPU needed: with
the real (not interpreted) kernels, a stand-in sm_90 driver and launches made no-ops, Dynamo
captures a step with the reversal (ActNorm, the reversal, an affine coupling) and an inverse
coupling (training: their differentiable ops) in one graph (`fullgraph=True`), and AOTAutograd runs
its forward and backward. (A flow under torch.compile takes the reference path: `kernels.plan`.)
Runs in a subprocess: the kernels must be imported with TRITON_INTERPRET=0."""
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
    import flowcore.kernels.triton._utils as kernel_utils
    kernel_utils._sm_count = lambda index: 132
    kernel_utils.require_launchable = lambda tensor, op: None
    from flowcore.kernels import Plan, StepParameters

    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    triton = Plan("triton")

    def step(x, loc, logs, h):
        z, logdet = triton.step(x, StepParameters(loc, logs, None, None, None, None, 8, net))
        x2, inverse_logdet = triton.uncouple(z[:, 8:], h)
        return z.sum() + x2.sum() + logdet.sum() + inverse_logdet.sum()

    args = [torch.randn(32, 16, requires_grad=True), torch.randn(16, requires_grad=True),
            torch.randn(16, requires_grad=True), torch.randn(32, 16)]
    explained = torch._dynamo.explain(step)(*args)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    torch.compile(step, backend="aot_eager", fullgraph=True)(*args).backward()
    assert args[1].grad.shape == (16,)
    print("traced")
    """
)


def test_the_triton_backend_compiles_in_one_graph():
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0 and "traced" in result.stdout, result.stderr[-4000:]
