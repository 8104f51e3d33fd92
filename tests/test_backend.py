"""Backend choice: auto/triton/torch, use_backend nesting, FLOWCORE_BACKEND read when a flow runs
(once per plan), and a clear error where Triton cannot run."""
import os
import subprocess
import sys

import pytest
import torch

import flowcore
from flowcore import backend
from flowcore.backend import BackendUnavailableError, use_backend
from flowcore.kernels import Plan
from flowcore.kernels.dispatch import resolve

from helpers.launches import triton_launches


@pytest.fixture(autouse=True)
def _no_pinned_backend(monkeypatch):
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    backend.set_backend(None)
    yield
    backend.set_backend(None)


GLOW = flowcore.Glow(12, levels=1, depth=1, width=4).eval()


def _launches() -> int:
    """Triton launches made by one forward of a one-step Glow (its two GEMMs on Triton)."""
    with torch.no_grad(), triton_launches() as launched:
        GLOW(torch.randn(5, 12))
    return launched["_folded_gemm_kernel"]


def test_auto_runs_pytorch_on_cpu_tensors():
    assert flowcore.get_backend() == "auto" and resolve(torch.zeros(1)) == "torch"
    assert _launches() == 0


def test_explicit_triton_launches_kernels_under_the_interpreter():
    with use_backend("triton"):
        assert resolve(torch.zeros(1)) == "triton"
        assert _launches() == 2


def test_use_backend_nests_and_restores():
    with use_backend("triton"):
        with use_backend("torch"):
            assert flowcore.get_backend() == "torch"
            with use_backend("auto"):
                assert flowcore.get_backend() == "auto"
            assert flowcore.get_backend() == "torch"
        assert flowcore.get_backend() == "triton"
        with pytest.raises(RuntimeError), use_backend("torch"):
            raise RuntimeError("leaves the block early")
        assert flowcore.get_backend() == "triton"
    assert flowcore.get_backend() == "auto"


def test_environment_variable_is_read_when_a_flow_runs(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "triton")
    assert _launches() == 2
    monkeypatch.setenv(backend.ENV_VAR, "torch")
    assert _launches() == 0
    with use_backend("triton"):  # the context manager wins over the environment
        assert _launches() == 2


def test_set_backend_pins_until_cleared(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "torch")
    flowcore.set_backend("triton")
    assert flowcore.get_backend() == "triton"
    flowcore.set_backend(None)
    assert flowcore.get_backend() == "torch"


def test_unknown_backend_names_are_rejected(monkeypatch):
    with pytest.raises(ValueError, match="unknown flowcore backend 'cuda'"):
        flowcore.set_backend("cuda")
    monkeypatch.setenv(backend.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="unknown flowcore backend 'fast'"):
        _launches()


def _run_in_subprocess(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_explicit_triton_without_gpu_or_interpreter_raises_a_clear_error():
    code = (
        "import torch\n"
        "import flowcore\n"
        "from flowcore.backend import BackendUnavailableError\n"
        "try:\n"
        "    flowcore.Glow(4, levels=1, depth=1, width=4)(torch.randn(3, 4))\n"
        "except BackendUnavailableError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = _run_in_subprocess(code, TRITON_INTERPRET="0", FLOWCORE_BACKEND="triton")
    assert result.returncode == 0, result.stderr
    assert "ERROR: FLOWCORE_BACKEND=triton on a cpu tensor needs a CUDA GPU" in result.stdout
    assert "TRITON_INTERPRET=1" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("built_first", [True, False], ids=["kernels-built", "kernels-not-built-yet"])
def test_interpreter_switched_on_late(built_first):
    """The Triton kernels are built when the first Triton op runs: enabling the interpreter before
    that works; once they were built for the GPU, enabling it cannot help and is reported."""
    code = (
        "import os, torch, flowcore\n"
        "from flowcore.backend import BackendUnavailableError, use_backend\n"
        + ("import flowcore.kernels.triton\n" if built_first else "")
        + "os.environ['TRITON_INTERPRET'] = '1'\n"
        "try:\n"
        "    with use_backend('triton'):\n"
        "        flowcore.Glow(4, levels=1, depth=1, width=4)(torch.randn(3, 4))\n"
        "    print('RAN')\n"
        "except BackendUnavailableError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = _run_in_subprocess(code, TRITON_INTERPRET="0")
    assert result.returncode == 0, result.stderr
    if built_first:
        assert "ERROR: step: the Triton kernels were built for the GPU" in result.stdout
    else:
        assert "RAN" in result.stdout


def test_backend_unavailable_is_a_runtime_error():
    assert issubclass(BackendUnavailableError, RuntimeError)
    assert flowcore.BackendUnavailableError is BackendUnavailableError


def test_every_triton_op_accepts_an_empty_batch():
    triton = Plan("triton")
    x = torch.randn(0, 8, requires_grad=True)
    loc, weight = torch.zeros(8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    nets = {width: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, width))
            for width in (4, 8)}
    calls = [(triton.actnorm, (x, loc, loc)), (triton.actnorm_inverse, (x, loc, loc)),
             (lambda *args: triton.folded_step(*args, 4, nets[8]), (x, weight, loc)),
             (lambda *args: triton.folded_step(*args, 4, nets[4], "additive"), (x, weight, loc)),
             (triton.couple, (x, torch.randn(0, 16))), (triton.uncouple, (x, torch.randn(0, 16))),
             (lambda *args: triton.couple(*args, "additive"), (x, torch.randn(0, 8)))]
    for index, (op, args) in enumerate(calls):
        out = op(*args)
        out = out[0] if isinstance(out, tuple) else out
        assert out.shape == (0, 8), index
        grads = torch.autograd.grad(out.sum(), [a for a in args if a.requires_grad], allow_unused=True)
        assert all(g is None or g.abs().sum().item() == 0 for g in grads), index
