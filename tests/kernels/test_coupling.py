"""Triton affine and additive coupling (interpreter on CPU) against `_ref` and float64."""
import pytest
import torch

from flowcore.backend import use_backend
from flowcore.kernels import (
    additive_coupling,
    additive_coupling_inverse,
    additive_coupling_inverse_ref,
    additive_coupling_ref,
    affine_coupling,
    affine_coupling_inverse,
    affine_coupling_inverse_ref,
    affine_coupling_ref,
)

from helpers.kernel_checks import check_op

# d2 is the width of the coupled half: x2 (rows, d2), h (rows, 2 * d2).
SHAPES = [(rows, 383) for rows in (1, 7, 300, 767, 1023)] + [(rows, d2) for rows in (7, 1023) for d2 in (96, 768)]
AFFINE = {"forward": (affine_coupling, affine_coupling_ref),
          "inverse": (affine_coupling_inverse, affine_coupling_inverse_ref)}
ADDITIVE = {"forward": (additive_coupling, additive_coupling_ref),
            "inverse": (additive_coupling_inverse, additive_coupling_inverse_ref)}


def _conditioner_output(rows, width, dtype):
    """Raw scales around the sigmoid's useful range, so log-dets and the 1 - s factors matter."""
    return (1.5 * torch.randn(rows, width)).to(dtype)


@pytest.mark.parametrize("rows,d2", SHAPES)
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_affine_coupling_matches_reference_float32(rows, d2, direction):
    x2 = torch.randn(rows, d2)
    h = _conditioner_output(rows, 2 * d2, torch.float32)
    check_op(*AFFINE[direction], (x2, h), f"affine {direction} {rows}x{d2}")


@pytest.mark.parametrize("rows,d2", [(7, 383), (1023, 96)])
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_affine_coupling_matches_reference_float64(rows, d2, direction):
    x2 = torch.randn(rows, d2, dtype=torch.float64)
    h = _conditioner_output(rows, 2 * d2, torch.float64)
    check_op(*AFFINE[direction], (x2, h), f"affine float64 {direction} {rows}x{d2}")


@pytest.mark.parametrize("rows,d2", [(1, 383), (300, 768), (1023, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_additive_coupling_matches_reference(rows, d2, dtype, direction):
    x2, h = torch.randn(rows, d2, dtype=dtype), torch.randn(rows, d2, dtype=dtype)
    check_op(*ADDITIVE[direction], (x2, h), f"additive {direction} {rows}x{d2}", backward_kernels=False)


def test_coupling_strided_inputs():
    """The column-sliced halves a flow step passes in, transposed views and a strided h."""
    y = torch.randn(300, 767)
    h_wide = _conditioner_output(300, 2 * 384 + 5, torch.float32)
    check_op(*AFFINE["forward"], (y[:, 383:], h_wide[:, 5:]), "affine column slices")
    check_op(*AFFINE["inverse"], (torch.randn(384, 300).T, torch.randn(768, 300).T), "affine inverse transposed")
    check_op(*ADDITIVE["forward"], (y[:, 383:], y[:, :384]), "additive column slices", backward_kernels=False)


def test_affine_coupling_round_trip_and_extreme_scales():
    """Inverse undoes forward; log-dets stay finite and exact for saturated sigmoids."""
    x2 = torch.randn(7, 96)
    h = torch.randn(7, 192)
    h[:, 1::2] = torch.linspace(-30.0, 30.0, 96)
    with use_backend("triton"):
        z2, logdet = affine_coupling(x2, h)
        back, inverse_logdet = affine_coupling_inverse(z2, h)
    torch.testing.assert_close(logdet, affine_coupling_ref(x2, h)[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(inverse_logdet, logdet)
    assert torch.isfinite(logdet).all()
    keep = h[:, 1::2] > -14  # where sigmoid still has float32 precision left
    torch.testing.assert_close(back[:, keep[0]], x2[:, keep[0]], rtol=1e-4, atol=1e-4)


def test_coupling_rejects_mismatched_conditioner():
    with use_backend("triton"):
        with pytest.raises(ValueError, match=r"conditioner output h must have 16 columns"):
            affine_coupling(torch.randn(4, 8), torch.randn(4, 8))
        with pytest.raises(ValueError, match=r"input has 4 rows but h has 5"):
            additive_coupling(torch.randn(4, 8), torch.randn(5, 8))
