"""The Triton kernels compiled for a CUDA GPU: fp32 (exact and TF32) / bf16 / fp16 against
`_ref` and float64, the step with either coupling, a float32 Glow trained under TF32, offsets past
2**31 elements, deterministic reductions, a Glow on both backends, and torch.compile of the
registered ops.

Marked `gpu`; skipped without CUDA, and when the kernels were imported under the interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 by default): run them with
`python3 bench/gpu_check.py --out DIR`, or `TRITON_INTERPRET=0 pytest tests -m gpu`.
"""
import copy

import pytest
import torch

import flowcore
from flowcore.backend import use_backend
from flowcore.kernels import Plan, actnorm_inverse_ref, actnorm_ref, couple_ref, folded_step_ref, uncouple_ref
from flowcore.kernels.triton._utils import INTERPRETED

from helpers.kernel_checks import TF32_TOLERANCE, TOLERANCE, assert_close_scaled, check_op
from helpers.launches import triton_launches

TRITON = Plan("triton")


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(INTERPRETED, reason="kernels imported under TRITON_INTERPRET=1; "
                       "run with TRITON_INTERPRET=0 (bench/gpu_check.py does)"),
]

# One shape per specialisation class (a single row: a constexpr; odd sizes: unaligned; sizes
# divisible by 16), float32 and bfloat16 on each, float16 on one: every (dtype, class) is a
# Triton compile, and the whole GPU check must finish in five minutes.
CASES = [(rows, d, dtype) for dtype in (torch.float32, torch.bfloat16)
         for rows, d in ((1, 96), (1003, 383), (4096, 768))] + [(300, 383, torch.float16)]
CASE_IDS = [f"{rows}x{d}-{str(dtype)[6:]}" for rows, d, dtype in CASES]


def _set_precision(value: str):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    return previous


@pytest.fixture(autouse=True)
def _exact_float32_matmuls():
    """Compare float32 GEMMs without TF32 on either side (tests that want TF32 use `tf32`)."""
    previous = _set_precision("highest")
    yield
    torch.set_float32_matmul_precision(previous)


@pytest.fixture
def tf32():
    """float32 GEMMs under TF32 on both sides: the precision whose float32 GEMMs run as Triton
    kernels (under "highest" they run on cuBLAS); returns the tolerance for float32."""
    previous = _set_precision("high")
    yield TF32_TOLERANCE
    torch.set_float32_matmul_precision(previous)


def _cuda(*shape, dtype, scale=1.0, shift=0.0):
    return (scale * torch.randn(*shape, device="cuda") + shift).to(dtype)


@pytest.mark.parametrize("rows,d,dtype", CASES, ids=CASE_IDS)
def test_actnorm_on_gpu(rows, d, dtype):
    inputs = (_cuda(rows, d, dtype=dtype, scale=2.0, shift=1.0), _cuda(d, dtype=dtype),
              _cuda(d, dtype=dtype, scale=0.3))
    check_op(TRITON.actnorm, actnorm_ref, inputs, f"actnorm {dtype} {rows}x{d}")
    check_op(TRITON.actnorm_inverse, actnorm_inverse_ref, inputs, f"actnorm_inverse {dtype} {rows}x{d}")


def test_float32_step_gemms_without_tf32_run_on_cublas():
    x, weight, bias = (_cuda(*shape, dtype=torch.float32) for shape in ((64, 96), (96, 96), (96,)))
    net = _step_conditioner(48, 96, torch.float32)
    with torch.no_grad(), triton_launches() as launched:
        z, _ = TRITON.folded_step(x, weight, bias, 48, net)
    assert "_folded_gemm_kernel" not in launched
    torch.testing.assert_close(z[:, :48], torch.addmm(bias, x, weight.T)[:, :48], rtol=0, atol=0)


def _step_conditioner(split, out, dtype):
    net = torch.nn.Sequential(torch.nn.Linear(split, 32), torch.nn.ReLU(), torch.nn.Linear(32, out))
    return net.to(device="cuda", dtype=dtype)


@pytest.mark.parametrize("coupling", ["affine", "additive"])
@pytest.mark.parametrize("rows,d,dtype", CASES, ids=CASE_IDS)
def test_fused_training_step_on_gpu(rows, d, dtype, coupling, tf32):
    """`_TritonStep` (fused GEMMs, the coupling's elementwise backward, cuBLAS weight GEMMs): z, the
    log-det and every input's gradient against the composed twin and float64."""
    split = d // 2
    torch.manual_seed(0)
    net = _step_conditioner(split, (2 if coupling == "affine" else 1) * (d - split), torch.float64)
    x = _cuda(rows, d, dtype=torch.float64, shift=0.3)
    weight = torch.linalg.qr(torch.randn(d, d, device="cuda", dtype=torch.float64))[0] * 1.1
    bias = 0.1 * torch.randn(d, device="cuda", dtype=torch.float64)
    cotangents = (torch.randn(rows, d, device="cuda", dtype=torch.float64), torch.randn(rows, device="cuda",
                                                                                        dtype=torch.float64))

    def run(op, precision):
        module = copy.deepcopy(net).to(precision)
        leaves = [t.to(precision).requires_grad_() for t in (x, weight, bias)]
        z, logdet = op(*leaves, split, module, coupling)
        outs, grads_out = [z], [cotangents[0].to(z.dtype)]
        if logdet.requires_grad:  # an additive step's log-det is a constant 0
            outs.append(logdet)
            grads_out.append(cotangents[1].to(logdet.dtype))
        grads = torch.autograd.grad(outs, [*leaves, *module.parameters()], grads_out)
        return (z, logdet, *grads)

    with triton_launches() as launched:
        fused = run(TRITON.folded_step, dtype)
    assert launched["_affine_bwd_kernel"] == (coupling == "affine")
    reference, exact = run(folded_step_ref, dtype), run(folded_step_ref, torch.float64)
    relative = tf32 if dtype == torch.float32 else TOLERANCE[dtype]  # the log-dets are float32 whatever the dtype
    for index, (a, b, c) in enumerate(zip(fused, reference, exact)):
        assert_close_scaled(a, b, c, f"fused training step {dtype} {rows}x{d} output {index}", relative)


def test_float32_glow_trains_under_tf32_on_gpu(tf32):
    """The first backward of a float32 Glow under TF32 used to need 245,760 B of shared memory
    (Hopper allows 232,448) and raise OutOfResources: a two-level Glow fits a few steps on the
    Triton backend and matches the PyTorch backend's losses."""
    torch.manual_seed(0)
    data = (torch.randn(4096, 256) @ torch.randn(256, 256) / 16 + 1).numpy()
    losses = {}
    for backend in ("triton", "torch"):
        glow = flowcore.Glow(256, levels=2, depth=2, width=32).cuda()
        with use_backend(backend):
            losses[backend] = flowcore.fit(glow, data, epochs=2, batch_size=512, lr=1e-3, seed=0,
                                           show_progress_bar=False)
    assert losses["triton"][1] < losses["triton"][0]
    torch.testing.assert_close(torch.tensor(losses["triton"]), torch.tensor(losses["torch"]), rtol=1e-2, atol=1e-2)


def test_offsets_past_two_to_the_31_elements_on_gpu():
    """Rows far apart in one 8.6 GB storage, the last one starting past element 2**31 (as in a
    batch of 2.8 M rows at d = 768): read and written where they are."""
    d, stride = 256, 2**30 + 512
    storage = torch.empty(2 * stride + 3 * d, device="cuda")
    x = storage.as_strided((3, d), (stride, 1))
    x.copy_(torch.randn(3, d, device="cuda"))
    h = storage[d:].as_strided((3, 2 * d), (stride, 1))
    h.copy_(torch.randn(3, 2 * d, device="cuda"))
    loc, logs = _cuda(d, dtype=torch.float32), _cuda(d, dtype=torch.float32, scale=0.3)
    with torch.no_grad():
        pairs = [(TRITON.actnorm(x, loc, logs), actnorm_ref(x, loc, logs)),
                 (TRITON.couple(x[:, : d // 2], h[:, :d])[0], couple_ref(x[:, : d // 2], h[:, :d])[0])]
    del storage
    for out, ref in pairs:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,d2,dtype", CASES, ids=CASE_IDS)
def test_coupling_on_gpu(rows, d2, dtype):
    x2, h = _cuda(rows, d2, dtype=dtype), _cuda(rows, 2 * d2, dtype=dtype, scale=1.5)
    check_op(TRITON.couple, couple_ref, (x2, h), f"affine {dtype} {rows}x{d2}")
    check_op(TRITON.uncouple, uncouple_ref, (x2, h), f"affine inverse {dtype} {rows}x{d2}")


@pytest.mark.parametrize("rows,d,dtype", CASES, ids=CASE_IDS)
def test_fused_inference_step_on_gpu(rows, d, dtype, tf32):
    split = d // 2
    x = _cuda(rows, d, dtype=torch.float64, shift=0.3)
    weight = torch.linalg.qr(torch.randn(d, d, device="cuda", dtype=torch.float64))[0]
    bias, net_weight = 0.2 * torch.randn(d, device="cuda", dtype=torch.float64), torch.randn(
        2 * (d - split), split, device="cuda", dtype=torch.float64) / split**0.5

    def run(op, precision):
        conditioner = lambda y1: y1 @ net_weight.to(precision).T  # noqa: E731
        with torch.no_grad():
            return op(x.to(precision), weight.to(precision), bias.to(precision), split, conditioner)

    z, logdet = run(TRITON.folded_step, dtype)
    z_ref, logdet_ref = run(folded_step_ref, dtype)
    z64, logdet64 = run(folded_step_ref, torch.float64)
    relative = tf32 if dtype == torch.float32 else TOLERANCE[dtype]  # the log-dets are float32 whatever the dtype
    assert_close_scaled(z, z_ref, z64, f"fused step z {dtype} {rows}x{d}", relative)
    assert_close_scaled(logdet, logdet_ref, logdet64, f"fused step logdet {dtype} {rows}x{d}", relative)


def test_strided_inputs_on_gpu(tf32):
    x = torch.randn(768, 4096, device="cuda").T
    weight = torch.linalg.qr(torch.randn(768, 768, device="cuda"))[0].T
    vectors = torch.randn(3, 1536, device="cuda")
    loc, logs, bias = vectors[0, ::2], 0.2 * vectors[1, 1::2], vectors[2, ::2]
    net = _step_conditioner(384, 768, torch.float32)

    def step(x, weight, bias):
        return TRITON.folded_step(x, weight, bias, 384, net)

    def step_ref(x, weight, bias):
        return folded_step_ref(x, weight, bias, 384, net if x.dtype == torch.float32 else net.double())

    check_op(step, step_ref, (x, weight, bias), "step transposed", relative=tf32)
    check_op(TRITON.actnorm, actnorm_ref, (x, loc, logs), "actnorm transposed")
    y = torch.randn(4096, 1535, device="cuda")
    check_op(TRITON.couple, couple_ref, (y[:, 767:], torch.randn(4096, 1536, device="cuda")), "affine slice")


def test_batch_reductions_are_bitwise_deterministic_on_gpu(tf32):
    x = torch.randn(65536, 768, device="cuda", requires_grad=True)
    loc = torch.randn(768, device="cuda", requires_grad=True)
    logs = (0.1 * torch.randn(768, device="cuda")).requires_grad_()
    weight = torch.randn(768, 768, device="cuda", requires_grad=True)
    bias = torch.randn(768, device="cuda", requires_grad=True)
    upstream = torch.randn(65536, 768, device="cuda")
    net = _step_conditioner(384, 384, torch.float32)

    def additive_step(x, weight, bias):
        return TRITON.folded_step(x, weight, bias, 384, net, "additive")[0]

    for op, args in ((TRITON.actnorm, (x, loc, logs)), (additive_step, (x, weight, bias))):
        first = torch.autograd.grad(op(*args), args, upstream)
        for _ in range(3):
            again = torch.autograd.grad(op(*args), args, upstream)
            assert all(torch.equal(a, b) for a, b in zip(first, again)), op.__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_glow_on_gpu_matches_torch_backend(dtype):
    torch.manual_seed(0)
    reference = flowcore.Glow(768, levels=2, depth=3, width=32).cuda()
    x = torch.randn(4096, 768, device="cuda") * 1.5 + 0.5
    with torch.no_grad():
        reference(x)  # data-dependent ActNorm initialisation, in float32
    reference = reference.to(dtype)
    fused = copy.deepcopy(reference)
    x = x.to(dtype)
    with use_backend("torch"):
        loss_ref = reference.bits_per_dim(x)
        loss_ref.backward()
    with use_backend("triton"), triton_launches() as launched:
        loss = fused.bits_per_dim(x)
        loss.backward()
    assert launched["_folded_gemm_kernel"] and launched["_affine_bwd_kernel"]
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss.float(), loss_ref.float(), rtol=tolerance, atol=tolerance)
    for (name, pa), (_, pb) in zip(fused.named_parameters(), reference.named_parameters()):
        scale = max(pb.grad.abs().max().item(), 1e-3)
        error = (pa.grad.float() - pb.grad.float()).abs().max().item() / scale
        assert error <= 20 * tolerance, f"gradient of {name}: relative error {error:.2e}"


def _fused_pipeline(x, loc, logs, weight, bias, h):
    y = torch.addmm(bias, x, weight.T)
    z2, logdet = TRITON.couple(y[:, 384:], h)
    return TRITON.actnorm(torch.cat([y[:, :384], z2], dim=1), loc, logs), logdet


def test_ops_compile_with_torch_compile():
    """The ops are torch.library.triton_op's: torch.compile traces them without graph breaks
    (fullgraph=True) and the compiled forward + backward equals eager Triton."""
    torch._dynamo.reset()
    dtype = torch.bfloat16
    args = [_cuda(2048, 768, dtype=dtype, shift=0.5), _cuda(768, dtype=dtype), _cuda(768, dtype=dtype, scale=0.1),
            torch.linalg.qr(torch.randn(768, 768, device="cuda"))[0].to(dtype), _cuda(768, dtype=dtype),
            _cuda(2048, 768, dtype=dtype)]
    args = [a.requires_grad_() for a in args]
    upstream = _cuda(2048, 768, dtype=dtype)

    def loss(fn):
        z, logdet = fn(*args)
        return (z * upstream).sum() + logdet.sum()

    compiled = torch.compile(_fused_pipeline, fullgraph=True)
    eager_loss = loss(_fused_pipeline)
    eager_grads = torch.autograd.grad(eager_loss, args)
    compiled_loss = loss(compiled)
    compiled_grads = torch.autograd.grad(compiled_loss, args)
    tolerance = 1e-2
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=tolerance, atol=tolerance)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * b.abs().max().item())
