"""Triton affine coupling (interpreter on CPU) against `_ref` and float64; the additive coupling's
zero log-det and argument checks on the Triton plan."""
import pytest
import torch

from flowcore.kernels import Plan, couple_ref, uncouple_ref

from helpers.kernel_checks import check_op

TRITON = Plan("triton")
# d2 is the width of the coupled half: x2 (rows, d2), h (rows, 2 * d2).
SHAPES = [(rows, 383) for rows in (1, 7, 300, 767, 1023)] + [(rows, d2) for rows in (7, 1023) for d2 in (96, 768)]
AFFINE = {"forward": (TRITON.couple, couple_ref), "inverse": (TRITON.uncouple, uncouple_ref)}


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


def test_additive_coupling_has_a_zero_log_det_in_the_accumulation_dtype():
    x2, h = torch.randn(5, 6, dtype=torch.float16), torch.randn(5, 6, dtype=torch.float16)
    for op in (TRITON.couple, TRITON.uncouple):
        _, logdet = op(x2, h, "additive")
        assert logdet.dtype == torch.float32 and not logdet.any()


def test_coupling_strided_inputs():
    """The column-sliced halves a flow step passes in, transposed views and a strided h."""
    y = torch.randn(300, 767)
    h_wide = _conditioner_output(300, 2 * 384 + 5, torch.float32)
    check_op(*AFFINE["forward"], (y[:, 383:], h_wide[:, 5:]), "affine column slices")
    check_op(*AFFINE["inverse"], (torch.randn(384, 300).T, torch.randn(768, 300).T), "affine inverse transposed")


def test_affine_coupling_round_trip_and_extreme_scales():
    """Inverse undoes forward; log-dets stay finite and exact for saturated sigmoids."""
    x2 = torch.randn(7, 96)
    h = torch.randn(7, 192)
    h[:, 1::2] = torch.linspace(-30.0, 30.0, 96)
    z2, logdet = TRITON.couple(x2, h)
    back, inverse_logdet = TRITON.uncouple(z2, h)
    torch.testing.assert_close(logdet, couple_ref(x2, h)[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(inverse_logdet, logdet)
    assert torch.isfinite(logdet).all()
    keep = h[:, 1::2] > -14  # where sigmoid still has float32 precision left
    torch.testing.assert_close(back[:, keep[0]], x2[:, keep[0]], rtol=1e-4, atol=1e-4)


def test_coupling_rejects_mismatched_conditioner():
    with pytest.raises(ValueError, match=r"conditioner output h must have 16 columns"):
        TRITON.couple(torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"input has 4 rows but h has 5"):
        TRITON.couple(torch.randn(4, 8), torch.randn(5, 8), "additive")
