"""The kernels with the tile sizes, launch options and grids their launchers pick on a GPU (not
the interpreter's own few large tiles), run in the interpreter on awkward shapes against the
`_ref` twins and float64: a GPU tile table that is wrong for some shape (masks, partial tiles,
the epilogues' column blocks) fails here, without a GPU."""
import pytest
import torch

import flowcore.kernels.triton._utils as kernel_utils
from flowcore.kernels import Plan, actnorm_ref, couple_ref, folded_step_ref, uncouple_ref

from helpers.kernel_checks import TOLERANCE, check_op, coupling_mlp
from helpers.launches import triton_launches

DTYPES = [torch.float32, torch.float64]
TRITON = Plan("triton")


@pytest.fixture(autouse=True)
def gpu_tiles(monkeypatch):
    """The tile tables as on a GPU; the kernels still run (in the interpreter) on CPU tensors."""
    monkeypatch.setattr(kernel_utils, "INTERPRETED", False)
    monkeypatch.setattr(kernel_utils, "require_launchable", lambda tensor, op: None)
    assert kernel_utils.fused_step_tiles(torch.float32, 4096, 768)[:3] == (128, 64, 32)
    monkeypatch.setattr(kernel_utils, "_sm_count", lambda index: 132)  # an H200's grids


@pytest.fixture
def tf32():
    """float32 GEMMs under TF32, the precision whose GEMMs run as Triton kernels on a GPU (the
    interpreter computes them in float32 all the same)."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(previous)


def _conditioner(split, out, dtype, d):
    """A small conditioner (weights N(0, 0.4^2) scaled by 0.2), so that in 16-bit its own rounding stays
    below the GEMMs' and the comparison sees the tiles."""
    net = coupling_mlp(split, out, torch.float64, 2, 16, torch.Generator().manual_seed(d))
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.mul_(0.2)
    return net.to(dtype)


def _step_inputs(rows, d, dtype, coupling):
    generator = torch.Generator().manual_seed(-d)
    split = d // 2
    net = _conditioner(split, (2 if coupling == "affine" else 1) * (d - split), dtype, d)
    x = (torch.randn(rows, d, generator=generator) + 0.5).to(dtype)
    weight = (torch.linalg.qr(torch.randn(d, d, generator=generator))[0]
              + 0.1 * torch.randn(d, d, generator=generator)).to(dtype)
    return (x, weight, torch.randn(d, generator=generator).to(dtype)), split, net


@pytest.mark.parametrize("coupling", ["affine", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["float32-tf32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows,d", [(130, 96), (7, 200)])
def test_the_step_gemms_with_their_epilogues(rows, d, dtype, coupling, tf32):
    inputs, split, net = _step_inputs(rows, d, dtype, coupling)
    net64 = _conditioner(split, net[-1].out_features, torch.float64, d)
    outputs = slice(None) if coupling == "affine" else slice(1)  # an additive step's log-det is a constant 0

    def ref(x, weight, bias):  # the same conditioner, in the dtype of its input
        return folded_step_ref(x, weight, bias, split, net if x.dtype == dtype else net64, coupling)[outputs]

    def step(x, weight, bias):
        return TRITON.folded_step(x, weight, bias, split, net, coupling)[outputs]

    relative = TOLERANCE[dtype] if dtype != torch.float32 else None  # the float32 log-det of 16-bit activations
    with triton_launches() as launched:
        check_op(step, ref, inputs, f"{coupling} step {rows}x{d} {dtype}", backward_kernels=coupling == "affine",
                 relative=relative)
    assert launched["_folded_gemm_kernel"] == 2


@pytest.mark.parametrize("coupling", ["affine", "additive"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_step_gemms_without_tensor_cores_run_on_cublas(dtype, coupling):
    """float32 under "highest" precision and float64: the GPU path runs the step's GEMMs on cuBLAS
    (a Triton GEMM would be an FMA loop) and couples in place after them; y1 is the `_ref`'s."""
    assert torch.get_float32_matmul_precision() == "highest"
    (x, weight, bias), split, net = _step_inputs(9, 40, dtype, coupling)
    with torch.no_grad(), triton_launches() as launched:
        z, logdet = TRITON.folded_step(x, weight, bias, split, net, coupling)
        z_ref, logdet_ref = folded_step_ref(x, weight, bias, split, net, coupling)
    assert "_folded_gemm_kernel" not in launched
    assert launched["_affine_fwd_kernel"] == (coupling == "affine")
    torch.testing.assert_close(z[:, :split], z_ref[:, :split], rtol=0, atol=0)
    torch.testing.assert_close(z, z_ref)
    torch.testing.assert_close(logdet, logdet_ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_actnorm(dtype):
    x = (2.0 * torch.randn(37, 300) + 1.0).to(dtype)
    loc, logs = torch.randn(300, dtype=dtype), 0.3 * torch.randn(300, dtype=dtype)
    check_op(TRITON.actnorm, actnorm_ref, (x, loc, logs), "actnorm 37x300")


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("direction", ["forward", "inverse"])
def test_affine_coupling(direction, dtype):
    op, ref = {"forward": (TRITON.couple, couple_ref), "inverse": (TRITON.uncouple, uncouple_ref)}[direction]
    x2, h = torch.randn(37, 150).to(dtype), (1.5 * torch.randn(37, 300)).to(dtype)
    check_op(op, ref, (x2, h), f"affine {direction} 37x150")
