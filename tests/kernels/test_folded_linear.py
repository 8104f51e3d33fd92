"""Triton folded GEMM z = x @ W.T + b (interpreter on CPU) against `_ref` and float64."""
import pytest
import torch

from flowcore.backend import use_backend
from flowcore.kernels import folded_linear, folded_linear_ref

from helpers.kernel_checks import check_op
from helpers.launches import triton_launches

# The interpreter's dot products are slow (no BLAS): the full row sweep runs at d=96, the
# feature sweep at 7 rows, plus one large awkward shape.
SHAPES = [(rows, 96) for rows in (1, 7, 300, 767, 1023)] + [(7, 383), (7, 768), (1023, 383)]


def _linear_inputs(rows, d, dtype):
    """Embedding-like rows with a common offset, an invertible mixing and a bias."""
    x = (torch.randn(rows, d) + 0.5 * torch.randn(d)).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d))[0] + 0.1 * torch.randn(d, d)).to(dtype)
    return x, weight, torch.randn(d).to(dtype)


@pytest.mark.parametrize("rows,d", SHAPES)
def test_folded_linear_matches_reference_float32(rows, d):
    check_op(folded_linear, folded_linear_ref, _linear_inputs(rows, d, torch.float32), f"folded_linear {rows}x{d}")


@pytest.mark.parametrize("rows,d", [(7, 383), (300, 96)])
def test_folded_linear_matches_reference_float64(rows, d):
    inputs = _linear_inputs(rows, d, torch.float64)
    check_op(folded_linear, folded_linear_ref, inputs, f"folded_linear float64 {rows}x{d}")


def test_folded_linear_strided_inputs():
    """Transposed x and weight, a column-sliced x and a strided bias give the same results."""
    x = torch.randn(96, 300).T
    weight = torch.randn(96, 96).T
    bias = torch.randn(3, 192)[2, ::2]
    check_op(folded_linear, folded_linear_ref, (x, weight, bias), "folded_linear transposed")
    wide = torch.randn(300, 213)
    check_op(folded_linear, folded_linear_ref, (wide[:, 117:], weight, bias), "folded_linear column slice")


def test_folded_linear_backward_is_deterministic_and_skips_unneeded_gradients():
    x, weight, bias = _linear_inputs(767, 96, torch.float32)
    weight.requires_grad_()
    bias.requires_grad_()
    upstream = torch.randn(767, 96)
    with use_backend("triton"):
        first = torch.autograd.grad(folded_linear(x, weight, bias), (weight, bias), upstream)
        second = torch.autograd.grad(folded_linear(x, weight, bias), (weight, bias), upstream)
        for a, b in zip(first, second):
            assert torch.equal(a, b)
        x.requires_grad_()
        with triton_launches() as launched:
            torch.autograd.grad(folded_linear(x, weight.detach(), bias.detach()), (x,), upstream)
        assert launched["_linear_bwd_dx_kernel"] == 1 and not launched["_linear_bwd_dw_kernel"]  # W, b frozen


def test_folded_linear_rejects_bad_shapes():
    with use_backend("triton"):
        with pytest.raises(ValueError, match=r"folded_linear weight must have 8 columns"):
            folded_linear(torch.randn(4, 8), torch.randn(8, 7), torch.zeros(8))
        with pytest.raises(ValueError, match=r"folded_linear bias must have shape \(8,\)"):
            folded_linear(torch.randn(4, 8), torch.randn(8, 8), torch.zeros(9))
