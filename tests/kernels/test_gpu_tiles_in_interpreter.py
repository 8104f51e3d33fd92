"""The kernels with the tile sizes, launch options and grids their launchers pick on a GPU (not
the interpreter's own few large tiles), run in the interpreter on awkward shapes against the
`_ref` twins and float64: a GPU tile table that is wrong for some shape (masks, partial tiles,
the dx GEMM's own tiles) fails here, without a GPU."""
import pytest
import torch

import flowcore.kernels.triton._utils as kernel_utils
from flowcore.backend import use_backend
from flowcore.kernels import (
    actnorm,
    actnorm_ref,
    affine_coupling,
    affine_coupling_inverse,
    affine_coupling_inverse_ref,
    affine_coupling_ref,
    folded_linear,
    folded_linear_ref,
)

from helpers.kernel_checks import check_op
from helpers.launches import triton_launches

DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def gpu_tiles(monkeypatch):
    """The tile tables as on a GPU; the kernels still run (in the interpreter) on CPU tensors."""
    monkeypatch.setattr(kernel_utils, "INTERPRETED", False)
    monkeypatch.setattr(kernel_utils, "require_launchable", lambda tensor, op: None)
    assert kernel_utils.gemm_tiles(torch.float32, 4096, 768)[:3] == (128, 128, 32)
    monkeypatch.setattr(kernel_utils, "_sm_count", lambda index: 132)  # an H200's grids


@pytest.fixture
def tf32():
    """float32 GEMMs under TF32, the precision whose GEMMs run as Triton kernels on a GPU (the
    interpreter computes them in float32 all the same)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["float32-tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows,d", [(130, 96), (7, 200)])
def test_folded_linear_forward_and_both_backward_gemms(rows, d, dtype, tf32):
    x = (torch.randn(rows, d) + 0.5).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d))[0] + 0.1 * torch.randn(d, d)).to(dtype)
    check_op(folded_linear, folded_linear_ref, (x, weight, torch.randn(d).to(dtype)), f"folded_linear {rows}x{d}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_gemms_without_tensor_cores_run_on_cublas(dtype):
    """float32 under "highest" precision and float64: the GPU path runs these GEMMs on cuBLAS
    (a Triton GEMM would be an FMA loop), and the result is the `_ref`'s."""
    assert torch.get_float32_matmul_precision() == "highest"
    x, weight, bias = torch.randn(9, 40, dtype=dtype), torch.randn(40, 40, dtype=dtype), torch.randn(40, dtype=dtype)
    with use_backend("triton"), triton_launches() as launched:
        z = folded_linear(x, weight, bias)
    assert not launched
    torch.testing.assert_close(z, folded_linear_ref(x, weight, bias), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_actnorm(dtype):
    x = (2.0 * torch.randn(37, 300) + 1.0).to(dtype)
    loc, logs = torch.randn(300, dtype=dtype), 0.3 * torch.randn(300, dtype=dtype)
    check_op(actnorm, actnorm_ref, (x, loc, logs), "actnorm 37x300")


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_affine_coupling(direction, dtype):
    op, ref = {"forward": (affine_coupling, affine_coupling_ref),
               "inverse": (affine_coupling_inverse, affine_coupling_inverse_ref)}[direction]
    x2, h = torch.randn(37, 150).to(dtype), (1.5 * torch.randn(37, 300)).to(dtype)
    check_op(op, ref, (x2, h), f"affine {direction} 37x150")
