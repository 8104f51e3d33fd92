"""The fused inference step (folded GEMM with the affine coupling in its epilogue), interpreter
on CPU, against its `_ref` twin, a float64 reference and flowcore's own FlowStep."""
import pytest
import torch

from flowcore.backend import use_backend
from flowcore.flows.step import FlowStep
from flowcore.kernels import folded_affine_step, folded_affine_step_ref, launch_counts

from helpers.kernel_checks import assert_close_scaled


def _conditioner(split, out, dtype, width=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    layers = [(torch.randn(width, split, generator=generator) / split**0.5, torch.randn(width, generator=generator)),
              (torch.randn(out, width, generator=generator) / width**0.5, torch.randn(out, generator=generator))]
    layers = [(w.to(dtype), b.to(dtype)) for w, b in layers]

    def net(y1):
        hidden = torch.relu(torch.nn.functional.linear(y1, *layers[0]))
        return torch.nn.functional.linear(hidden, *layers[1])
    return net


def _inputs(rows, d, dtype):
    x = (torch.randn(rows, d) + 0.3).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d))[0] * 1.2).to(dtype)
    return x, weight, (0.2 * torch.randn(d)).to(dtype)


@pytest.mark.parametrize("rows,d", [(1, 96), (1023, 96), (300, 383), (7, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fused_step_matches_reference(rows, d, dtype):
    split = d // 2
    x, weight, bias = _inputs(rows, d, dtype)
    before = (launch_counts.get("folded_step_first_half", 0), launch_counts.get("folded_step_coupling", 0))
    with torch.no_grad():
        with use_backend("triton"):
            z, logdet = folded_affine_step(x, weight, bias, split, _conditioner(split, 2 * (d - split), dtype))
        z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, split, _conditioner(split, 2 * (d - split), dtype))
        z64, logdet64 = folded_affine_step_ref(x.double(), weight.double(), bias.double(), split,
                                               _conditioner(split, 2 * (d - split), torch.float64))
    assert launch_counts["folded_step_first_half"] == before[0] + 1
    assert launch_counts["folded_step_coupling"] == before[1] + 1
    assert z.shape == (rows, d) and z.dtype == dtype and logdet.shape == (rows,)
    assert_close_scaled(z, z_ref, z64, f"fused step z {rows}x{d}")
    assert_close_scaled(logdet, logdet_ref, logdet64, f"fused step logdet {rows}x{d}")


def test_fused_step_equals_flowcore_eval_step():
    """Drop-in for FlowStep's eval fast path: same z and log-det from the folded weight."""
    torch.manual_seed(0)
    step = FlowStep(95, width=16)
    x = torch.randn(300, 95) * 2 + 1
    with torch.no_grad():
        step(x)  # data-dependent ActNorm initialisation
        for parameter in step.coupling.net.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
        step.eval()
        z_ref, logdet_ref = step(x)
        weight = step.mixing.weight() * torch.exp(step.actnorm.logs)
        bias = weight @ step.actnorm.loc
        constant = step.actnorm.logdet() + step.mixing.logdet()
        with use_backend("triton"):
            z, logdet = folded_affine_step(x, weight, bias, step.coupling.split, step.coupling.net)
    torch.testing.assert_close(z, z_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logdet + constant, logdet_ref, rtol=1e-4, atol=1e-4)


def test_fused_step_with_gradients_uses_the_differentiable_ops():
    split, d = 48, 96
    x, weight, bias = _inputs(67, d, torch.float32)
    weight.requires_grad_()
    net = _conditioner(split, 2 * split, torch.float32)
    before = launch_counts.get("folded_step_coupling", 0)
    with use_backend("triton"):
        z, logdet = folded_affine_step(x, weight, bias, split, net)
        (grad,) = torch.autograd.grad(z.square().sum() + logdet.sum(), weight)
    assert launch_counts.get("folded_step_coupling", 0) == before
    z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, split, net)
    (grad_ref,) = torch.autograd.grad(z_ref.square().sum() + logdet_ref.sum(), weight)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-4 * grad_ref.abs().max().item())


def test_fused_step_rejects_bad_arguments():
    x, weight, bias = _inputs(4, 8, torch.float32)
    with use_backend("triton"), torch.no_grad():
        with pytest.raises(ValueError, match=r"split must be in 1\.\.7, got 8"):
            folded_affine_step(x, weight, bias, 8, lambda y1: y1)
        with pytest.raises(ValueError, match=r"conditioner output must have 8 columns"):
            folded_affine_step(x, weight, bias, 4, lambda y1: y1)


def test_fused_step_keeps_a_trainable_conditioners_gradient():
    split, d = 48, 96
    x, weight, bias = _inputs(67, d, torch.float32)
    net = torch.nn.Linear(split, 2 * split)
    with use_backend("triton"):
        z, logdet = folded_affine_step(x, weight, bias, split, net)
        grads = torch.autograd.grad(z.square().sum() + logdet.sum(), list(net.parameters()))
    z_ref, logdet_ref = folded_affine_step_ref(x, weight, bias, split, net)
    grads_ref = torch.autograd.grad(z_ref.square().sum() + logdet_ref.sum(), list(net.parameters()))
    torch.testing.assert_close(z, z_ref, rtol=1e-5, atol=1e-5)
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-4 * g_ref.abs().max().item())
