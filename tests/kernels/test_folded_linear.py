"""Triton ActNorm+1x1 GEMM and folded GEMM (interpreter on CPU) against `_ref` and float64."""
import pytest
import torch

from flowcore.backend import use_backend
from flowcore.kernels import (
    actnorm_linear,
    actnorm_linear_ref,
    folded_linear,
    folded_linear_ref,
    launch_counts,
)
from helpers.kernel_checks import check_op

# The interpreter's dot products are slow (no BLAS): the full row sweep runs at d=96, the
# feature sweep at 7 rows, plus one large awkward shape.
SHAPES = [(rows, 96) for rows in (1, 7, 300, 767, 1023)] + [(7, 383), (7, 768), (1023, 383)]


def _linear_inputs(rows, d, dtype):
    """Embedding-like rows: a common offset the ActNorm removes, then an invertible mixing."""
    x = (torch.randn(rows, d) + 0.5 * torch.randn(d)).to(dtype)
    loc = (-0.5 * torch.randn(d)).to(dtype)
    logs = (0.2 * torch.randn(d)).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d))[0] + 0.1 * torch.randn(d, d)).to(dtype)
    return x, loc, logs, weight


@pytest.mark.parametrize("rows,d", SHAPES)
def test_actnorm_linear_matches_reference_float32(rows, d):
    check_op(actnorm_linear, actnorm_linear_ref, _linear_inputs(rows, d, torch.float32), f"actnorm_linear {rows}x{d}")


@pytest.mark.parametrize("rows,d", [(1, 96), (300, 96), (7, 768)])
def test_folded_linear_matches_reference_float32(rows, d):
    x, _, _, weight = _linear_inputs(rows, d, torch.float32)
    check_op(folded_linear, folded_linear_ref, (x, weight, torch.randn(d)), f"folded_linear {rows}x{d}")


@pytest.mark.parametrize("rows,d", [(7, 383), (300, 96)])
def test_linear_ops_match_reference_float64(rows, d):
    x, loc, logs, weight = _linear_inputs(rows, d, torch.float64)
    check_op(actnorm_linear, actnorm_linear_ref, (x, loc, logs, weight), f"actnorm_linear float64 {rows}x{d}")
    bias = torch.randn(d, dtype=torch.float64)
    check_op(folded_linear, folded_linear_ref, (x, weight, bias), f"folded_linear float64 {rows}x{d}")


def test_linear_ops_strided_inputs():
    """Transposed x and weight, a column-sliced x and strided vectors give the same results."""
    x = torch.randn(96, 300).T
    weight = torch.randn(96, 96).T
    vectors = torch.randn(3, 192)
    loc, logs, bias = vectors[0, ::2], 0.2 * vectors[1, 1::2], vectors[2, ::2]
    check_op(actnorm_linear, actnorm_linear_ref, (x, loc, logs, weight), "actnorm_linear transposed")
    wide = torch.randn(300, 213)
    check_op(folded_linear, folded_linear_ref, (wide[:, 117:], weight, bias), "folded_linear column slice")


def test_actnorm_linear_backward_is_deterministic_and_skips_unneeded_gradients():
    x, loc, logs, weight = _linear_inputs(767, 96, torch.float32)
    loc.requires_grad_()
    logs.requires_grad_()
    weight.requires_grad_()
    upstream = torch.randn(767, 96)
    with use_backend("triton"):
        first = torch.autograd.grad(actnorm_linear(x, loc, logs, weight), (loc, logs, weight), upstream)
        second = torch.autograd.grad(actnorm_linear(x, loc, logs, weight), (loc, logs, weight), upstream)
        for a, b in zip(first, second):
            assert torch.equal(a, b)
        before = launch_counts.get("actnorm_linear_backward_dw", 0)
        frozen = weight.detach()
        torch.autograd.grad(actnorm_linear(x, loc, logs, frozen), (loc,), upstream)
        assert launch_counts.get("actnorm_linear_backward_dw", 0) == before  # no dW GEMM when W is frozen


def test_linear_ops_reject_bad_shapes():
    with use_backend("triton"):
        with pytest.raises(ValueError, match=r"actnorm_linear weight must have 8 columns"):
            actnorm_linear(torch.randn(4, 8), torch.zeros(8), torch.zeros(8), torch.randn(8, 7))
        with pytest.raises(ValueError, match=r"folded_linear bias must have shape \(8,\)"):
            folded_linear(torch.randn(4, 8), torch.randn(8, 8), torch.zeros(9))
