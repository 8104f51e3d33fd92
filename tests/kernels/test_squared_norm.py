"""Row sums of squares (`flowcore.kernels.squared_norm`) against `squared_norm_ref` and float64,
with first- and second-order gradients."""
import pytest
import torch

from flowcore.kernels import plan, squared_norm_ref
from flowcore.kernels.squared_norm import _SquaredNorm, squared_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_squared_norm_matches_reference(dtype):
    z = (2.0 * torch.randn(37, 19, dtype=torch.float64)).to(dtype).requires_grad_()
    z64 = z.detach().double().requires_grad_()
    upstream = torch.randn(37, dtype=torch.float64)
    value = squared_norm(z)
    assert type(value.grad_fn).__name__ == "_SquaredNormBackward"
    (grad,) = torch.autograd.grad(value, z, upstream.to(dtype))
    expected = squared_norm_ref(z64)
    (expected_grad,) = torch.autograd.grad(expected, z64, upstream)
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert value.dtype == dtype and grad.dtype == dtype
    torch.testing.assert_close(value.double(), expected, **tolerance)
    torch.testing.assert_close(grad.double(), expected_grad, **tolerance)
    torch.testing.assert_close(value, squared_norm_ref(z))


def test_squared_norm_passes_gradcheck_and_gradgradcheck():
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(4, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_SquaredNorm.apply, (z,))
    assert torch.autograd.gradgradcheck(_SquaredNorm.apply, (z,))


def test_torch_func_transforms_run_the_reference():
    z = torch.randn(3, 5, dtype=torch.float64)
    grad = torch.func.grad(lambda v: plan(v, 5, [], training=True).squared_norm(v).sum())(z)
    torch.testing.assert_close(grad, 2.0 * z)
