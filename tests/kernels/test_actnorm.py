"""Triton ActNorm (interpreter on CPU) against its `_ref` twin and a float64 reference."""
import pytest
import torch

from flowcore.kernels import Plan, actnorm_inverse_ref, actnorm_ref

from helpers.kernel_checks import check_op

TRITON = Plan("triton")
SHAPES = [(rows, 383) for rows in (1, 7, 300, 767, 1023)] + [(rows, d) for rows in (7, 1023) for d in (96, 768)]


def _params(d, dtype):
    return torch.randn(d, dtype=dtype), 0.3 * torch.randn(d, dtype=dtype)


def _ops(inverse):
    return (TRITON.actnorm_inverse, actnorm_inverse_ref) if inverse else (TRITON.actnorm, actnorm_ref)


@pytest.mark.parametrize("rows,d", SHAPES)
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_actnorm_matches_reference_float32(rows, d, inverse):
    x = 2.0 * torch.randn(rows, d) + 1.0
    check_op(*_ops(inverse), (x, *_params(d, torch.float32)), f"actnorm inverse={inverse} {rows}x{d}")


@pytest.mark.parametrize("rows,d", [(7, 383), (1023, 96)])
@pytest.mark.parametrize("inverse", [False, True], ids=["forward", "inverse"])
def test_actnorm_matches_reference_float64(rows, d, inverse):
    x = torch.randn(rows, d, dtype=torch.float64)
    check_op(*_ops(inverse), (x, *_params(d, torch.float64)), f"actnorm float64 inverse={inverse} {rows}x{d}")


def test_actnorm_strided_inputs():
    """Transposed views, column slices and strided parameter vectors give the same results."""
    base = torch.randn(383, 300).T  # (300, 383), column-major
    params = torch.randn(2, 2 * 383)
    loc, logs = params[0, ::2], 0.3 * params[1, 1::2]
    check_op(TRITON.actnorm, actnorm_ref, (base, loc, logs), "actnorm transposed input")
    wide = torch.randn(300, 500)
    check_op(TRITON.actnorm_inverse, actnorm_inverse_ref, (wide[:, 117:], loc, logs), "actnorm_inverse column slice")


def test_actnorm_backward_is_deterministic():
    x = torch.randn(1023, 383, requires_grad=True)
    loc, logs = (p.requires_grad_() for p in _params(383, torch.float32))
    upstream = torch.randn(1023, 383)
    first = torch.autograd.grad(TRITON.actnorm(x, loc, logs), (x, loc, logs), upstream)
    second = torch.autograd.grad(TRITON.actnorm(x, loc, logs), (x, loc, logs), upstream)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_actnorm_rejects_mismatched_parameters():
    with pytest.raises(ValueError, match=r"actnorm loc must have shape \(8,\)"):
        TRITON.actnorm(torch.randn(4, 8), torch.zeros(7), torch.zeros(8))
