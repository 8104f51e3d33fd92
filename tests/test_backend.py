"""Backend choice: auto/triton/torch, use_backend nesting, FLOWCORE_BACKEND read when an op runs,
and a clear error where Triton cannot run."""
import os
import subprocess
import sys

import pytest
import torch

import flowcore
from flowcore import backend
from flowcore.backend import BackendUnavailableError, resolve, use_backend
from flowcore.kernels import actnorm, launch_counts


@pytest.fixture(autouse=True)
def _no_pinned_backend(monkeypatch):
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    backend.set_backend(None)
    yield
    backend.set_backend(None)


def _launches(op="actnorm"):
    return launch_counts.get(op, 0)


def _run_actnorm():
    return actnorm(torch.randn(5, 12), torch.zeros(12), torch.zeros(12))


def test_auto_runs_pytorch_on_cpu_tensors():
    assert flowcore.get_backend() == "auto" and resolve(torch.zeros(1)) == "torch"
    before = _launches()
    _run_actnorm()
    assert _launches() == before


def test_explicit_triton_launches_kernels_under_the_interpreter():
    before = _launches()
    with use_backend("triton"):
        assert resolve(torch.zeros(1)) == "triton"
        _run_actnorm()
    assert _launches() == before + 1


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


def test_environment_variable_is_read_when_the_op_runs(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "triton")
    before = _launches()
    _run_actnorm()
    assert _launches() == before + 1
    monkeypatch.setenv(backend.ENV_VAR, "torch")
    _run_actnorm()
    assert _launches() == before + 1
    with use_backend("triton"):  # the context manager wins over the environment
        _run_actnorm()
    assert _launches() == before + 2


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
        _run_actnorm()


def _run_in_subprocess(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_explicit_triton_without_gpu_or_interpreter_raises_a_clear_error():
    code = (
        "import torch\n"
        "from flowcore.backend import BackendUnavailableError\n"
        "from flowcore.kernels import affine_coupling\n"
        "try:\n"
        "    affine_coupling(torch.randn(3, 4), torch.randn(3, 8))\n"
        "except BackendUnavailableError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = _run_in_subprocess(code, TRITON_INTERPRET="0", FLOWCORE_BACKEND="triton")
    assert result.returncode == 0, result.stderr
    assert "ERROR: FLOWCORE_BACKEND=triton on a cpu tensor needs a CUDA GPU" in result.stdout
    assert "TRITON_INTERPRET=1" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_interpreter_switched_on_after_import_is_reported():
    """The kernels were built for the GPU at import; enabling the interpreter later cannot help."""
    code = (
        "import os, torch\n"
        "from flowcore.backend import BackendUnavailableError, use_backend\n"
        "from flowcore.kernels import actnorm\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "try:\n"
        "    with use_backend('triton'):\n"
        "        actnorm(torch.randn(3, 4), torch.zeros(4), torch.zeros(4))\n"
        "except BackendUnavailableError as error:\n"
        "    print('ERROR:', error)\n"
    )
    result = _run_in_subprocess(code, TRITON_INTERPRET="0")
    assert result.returncode == 0, result.stderr
    assert "ERROR: actnorm: the Triton kernels were built for the GPU" in result.stdout


def test_backend_unavailable_is_a_runtime_error():
    assert issubclass(BackendUnavailableError, RuntimeError)
    assert flowcore.BackendUnavailableError is BackendUnavailableError


def test_every_triton_op_accepts_an_empty_batch():
    from flowcore.kernels import additive_coupling, affine_coupling, folded_linear

    x = torch.randn(0, 8, requires_grad=True)
    loc, weight = torch.zeros(8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    calls = [(actnorm, (x, loc, loc)), (folded_linear, (x, weight, loc)),
             (affine_coupling, (x, torch.randn(0, 16))), (additive_coupling, (x, torch.randn(0, 8)))]
    with use_backend("triton"):
        for op, args in calls:
            out = op(*args)
            out = out[0] if isinstance(out, tuple) else out
            assert out.shape == (0, 8), op.__name__
            grads = torch.autograd.grad(out.sum(), [a for a in args if a.requires_grad])
            assert all(g.abs().sum().item() == 0 for g in grads), op.__name__
