"""GPU suite for the fused Triton kernels: each op forward, forward + backward, and a full flow
step (training and inference), Triton vs PyTorch eager vs torch.compile of the PyTorch path, at
d = 768 and 1024 and batch 4k / 64k / 256k. Skipped without CUDA.

The inference step also runs as `triton_fused` (`folded_affine_step`: one kernel per half,
the coupling in the second GEMM's epilogue).
Each group records median times of a round of repeated calls (labels `triton`, `eager`,
`compile`; the summary prints eager/triton and compile/triton as `Nx of triton`), each label's
`<label>_ms_per_op`, and `gbps` / `hbm_fraction` for the Triton run: the bytes the op must move
at minimum (inputs read once, outputs written once) over its time, against the GPU's HBM peak.
Goals on an H200: flow step forward + backward >= 2x eager and >= 1.2x torch.compile;
elementwise kernels >= 80 % of HBM bandwidth.
Every benchmark is marked `gpu(chunk=...)`: bench/gpu_check.py runs one chunk at a time with
`-m "gpu(chunk='NAME')"` (the chunk names are `CHUNKS`), most important first.
Run: `python bench/gpu_check.py --out DIR` (or `pytest bench/test_bench_kernels_gpu.py`).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flowcore.backend import use_backend
from flowcore.kernels import actnorm, affine_coupling, folded_affine_step, folded_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU benchmarks need CUDA")]

CHUNKS = ("flow_step_train", "elementwise_forward", "elementwise_backward", "flow_step_inference")
"""The benchmark chunks of bench/gpu_check.py, most important first."""


def chunk(name: str):
    """Put a benchmark in one of `CHUNKS` (selected by `-m "gpu(chunk='NAME')"`)."""
    assert name in CHUNKS, name
    return pytest.mark.gpu(chunk=name)

DIMS = (768, 1024)
BATCHES = (4096, 65536, 262144)
COMPILED_BATCHES = (4096, 262144)  # torch.compile compiles per shape: keep the suite short
IMPLEMENTATIONS = ("triton", "eager", "compile")
HBM_PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "A100": 2039.0}
WIDTH = 32  # conditioner hidden width of the l2_d3_w32 configuration


def hbm_peak_gbps() -> float | None:
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in HBM_PEAK_GBPS.items() if key in name), None)


def _sync_loop(fn, inner: int):
    def run():
        for _ in range(inner):
            fn()
        torch.cuda.synchronize()
    return run


def _inner_repeats(batch: int) -> int:
    return 20 if batch <= 4096 else 5


_COMPILED: dict = {}


def _compiled(key, fn):
    """One torch.compile per (op, d, dtype), dynamic in the batch, reused across batches."""
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, dynamic=True)
    return _COMPILED[key]


def _bench(benchmark, record, group: str, impl: str, fn, batch: int, bytes_moved: float, flops: float = 0.0):
    inner = _inner_repeats(batch)
    backend = "triton" if impl.startswith("triton") else "torch"
    with use_backend(backend):
        run = _sync_loop(fn, inner)
        run()  # warm up: compiles Triton kernels / torch.compile graphs, autotunes cuBLAS
        benchmark.pedantic(run, rounds=10, warmup_rounds=1)
    seconds = benchmark.stats.stats.median / inner
    extra = {f"{impl}_ms_per_op": seconds * 1e3}
    if impl.startswith("triton"):
        prefix = "" if impl == "triton" else f"{impl}_"
        extra[f"{prefix}gbps"] = bytes_moved / seconds / 1e9
        peak = hbm_peak_gbps()
        if peak:
            extra[f"{prefix}hbm_fraction"] = extra[f"{prefix}gbps"] / peak
        if flops:
            extra[f"{prefix}tflops"] = flops / seconds / 1e12
    record(group, impl, **extra)


def _group(op: str, d: int, batch: int, dtype: torch.dtype) -> str:
    return f"{op} d={d} batch={batch} {str(dtype).removeprefix('torch.')}"


def _cases(dtypes=(torch.bfloat16,), compiled=True):
    """(d, batch, dtype, impl) grid; `compiled=False` leaves out torch.compile (forward-only
    elementwise ops, where one fused pointwise kernel is all it can do and compile time counts)."""
    for dtype in dtypes:
        for d in DIMS:
            for batch in BATCHES:
                for impl in IMPLEMENTATIONS:
                    if impl == "compile" and (not compiled or batch not in COMPILED_BATCHES):
                        continue
                    yield pytest.param(d, batch, dtype, impl, id=f"d{d}-b{batch}-{str(dtype)[6:]}-{impl}")


@pytest.fixture(autouse=True)
def _tf32_for_everyone():
    """float32 GEMMs use TF32 in cuBLAS, in torch.compile and in the Triton kernels alike."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision(previous)


def _actnorm_inputs(batch, d, dtype, grad=False):
    x = torch.randn(batch, d, device="cuda", dtype=dtype, requires_grad=grad)
    loc = torch.randn(d, device="cuda", dtype=dtype, requires_grad=grad)
    logs = (0.1 * torch.randn(d, device="cuda", dtype=dtype)).requires_grad_(grad)
    return x, loc, logs


@chunk("elementwise_forward")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases(compiled=False)))
def test_actnorm_forward(benchmark, record, d, batch, dtype, impl):
    x, loc, logs = _actnorm_inputs(batch, d, dtype)
    _bench(benchmark, record, _group("actnorm forward", d, batch, dtype), impl,
           lambda: actnorm(x, loc, logs), batch, 2 * x.numel() * x.element_size())


def _actnorm_step(x, loc, logs, upstream):
    return torch.autograd.grad(actnorm(x, loc, logs), (x, loc, logs), upstream)


@chunk("elementwise_backward")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases()))
def test_actnorm_forward_backward(benchmark, record, d, batch, dtype, impl):
    x, loc, logs = _actnorm_inputs(batch, d, dtype, grad=True)
    upstream = torch.randn_like(x)
    op = _compiled(("actnorm_fb", d, dtype), _actnorm_step) if impl == "compile" else _actnorm_step
    _bench(benchmark, record, _group("actnorm forward+backward", d, batch, dtype), impl,
           lambda: op(x, loc, logs, upstream), batch, 5 * x.numel() * x.element_size())


def _coupling_inputs(batch, d, dtype, grad=False):
    x2 = torch.randn(batch, d // 2, device="cuda", dtype=dtype, requires_grad=grad)
    h = torch.randn(batch, d, device="cuda", dtype=dtype, requires_grad=grad)
    return x2, h


@chunk("elementwise_forward")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases(compiled=False)))
def test_affine_coupling_forward(benchmark, record, d, batch, dtype, impl):
    x2, h = _coupling_inputs(batch, d, dtype)
    _bench(benchmark, record, _group("affine coupling forward", d, batch, dtype), impl,
           lambda: affine_coupling(x2, h), batch, 4 * x2.numel() * x2.element_size())


def _coupling_step(x2, h, upstream):
    z2, logdet = affine_coupling(x2, h)
    return torch.autograd.grad((z2 * upstream).sum() - logdet.sum(), (x2, h))


@chunk("elementwise_backward")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases()))
def test_affine_coupling_forward_backward(benchmark, record, d, batch, dtype, impl):
    x2, h = _coupling_inputs(batch, d, dtype, grad=True)
    upstream = torch.randn_like(x2)
    op = _compiled(("coupling_fb", d, dtype), _coupling_step) if impl == "compile" else _coupling_step
    # forward reads x2, h (2x) and writes z2; backward reads upstream, x2, h (2x), writes dx2, dh (2x)
    _bench(benchmark, record, _group("affine coupling forward+backward", d, batch, dtype), impl,
           lambda: op(x2, h, upstream), batch, 11 * x2.numel() * x2.element_size())


class _StepParams:
    """Parameters of one flow step (ActNorm, d x d mixing, conditioner MLP d/2 -> 32 -> 32 -> d)."""

    def __init__(self, d, dtype):
        def param(*shape, scale=1.0):
            return (scale * torch.randn(*shape, device="cuda")).to(dtype).requires_grad_()
        self.loc, self.logs = param(d), param(d, scale=0.1)
        self.weight = torch.linalg.qr(torch.randn(d, d, device="cuda"))[0].to(dtype).requires_grad_()
        half = d // 2
        self.net = [param(WIDTH, half, scale=half**-0.5), param(WIDTH), param(WIDTH, WIDTH, scale=WIDTH**-0.5),
                    param(WIDTH), param(d, WIDTH, scale=0.01), param(d)]

    def all(self):
        return [self.loc, self.logs, self.weight, *self.net]


def _conditioner(x1, net):
    w1, b1, w2, b2, w3, b3 = net
    return F.linear(F.relu(F.linear(F.relu(F.linear(x1, w1, b1)), w2, b2)), w3, b3)


def _flow_step_loss(x, loc, logs, weight, *net):
    """One Glow training step as flowcore.flows.step.FlowStep runs it (ActNorm folded into the
    1x1 weight, differentiated through the d x d fold), data -> latent, and a Gaussian negative
    log-likelihood."""
    folded = weight * torch.exp(logs)
    y = folded_linear(x, folded, folded @ loc)
    half = y.shape[1] // 2
    y1, y2 = y[:, :half], y[:, half:]
    z2, logdet = affine_coupling(y2, _conditioner(y1, net))
    z = torch.cat([y1, z2], dim=1)
    return 0.5 * z.float().square().sum() - logdet.float().sum() - x.shape[0] * logs.float().sum()


def _flow_step_train(x, *params):
    return torch.autograd.grad(_flow_step_loss(x, *params), params)


@chunk("flow_step_train")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases((torch.bfloat16, torch.float32))))
def test_flow_step_forward_backward(benchmark, record, d, batch, dtype, impl):
    x = torch.randn(batch, d, device="cuda", dtype=dtype)
    params = _StepParams(d, dtype).all()
    op = _compiled(("step_fb", d, dtype), _flow_step_train) if impl == "compile" else _flow_step_train
    _bench(benchmark, record, _group("flow step forward+backward", d, batch, dtype), impl,
           lambda: op(x, *params), batch, 4 * x.numel() * x.element_size(), flops=3 * 2 * batch * d * d)


def _flow_step_inference(x, weight, bias, *net):
    """The eval path: ActNorm folded into the GEMM, then the coupling."""
    y = folded_linear(x, weight, bias)
    half = y.shape[1] // 2
    y1 = y[:, :half]
    z2, logdet = affine_coupling(y[:, half:], _conditioner(y1, net))
    return torch.cat([y1, z2], dim=1), logdet


def _flow_step_inference_fused(x, weight, bias, *net):
    """The same step through the fused kernel: coupling in the second GEMM's epilogue."""
    half = x.shape[1] // 2
    return folded_affine_step(x, weight, bias, half, lambda y1: _conditioner(y1, net))


@chunk("flow_step_inference")
@pytest.mark.parametrize("d,batch,dtype,impl", list(_cases()) + [
    pytest.param(d, batch, torch.bfloat16, "triton_fused", id=f"d{d}-b{batch}-bfloat16-triton_fused")
    for d in DIMS for batch in BATCHES])
def test_flow_step_inference(benchmark, record, d, batch, dtype, impl):
    x = torch.randn(batch, d, device="cuda", dtype=dtype)
    step = _StepParams(d, dtype)
    with torch.no_grad():
        weight = step.weight * torch.exp(step.logs)
        bias = weight @ step.loc
        net = [p.detach() for p in step.net]
    op = {"compile": lambda *args: _compiled(("step_infer", d, dtype), _flow_step_inference)(*args),
          "triton_fused": _flow_step_inference_fused}.get(impl, _flow_step_inference)

    def run():
        with torch.no_grad():
            return op(x, weight, bias, *net)
    _bench(benchmark, record, _group("flow step inference", d, batch, dtype), impl,
           run, batch, 2 * x.numel() * x.element_size(), flops=2 * batch * d * d)
