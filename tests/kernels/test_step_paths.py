"""Every path of the default Glow step (`flowcore.kernels.PATHS`) against its composed twin
`affine_step_ref`, in the same dtype and in float64: z, the whole log-det and the gradient of
every input (x, loc, logs, lu, log_s and each conditioner parameter), in training and inference,
on awkward shapes. The Triton path runs in the interpreter. Then what only some paths have: the
factors' block layouts, both GEMM routes of the Triton step, exact second-order gradients,
16-bit activations, vanishing scales; and `step_path`, the table's one chooser."""
import pytest
import torch

import flowcore
import flowcore.kernels.triton._utils as triton_utils
from flowcore.backend import use_backend
from flowcore.kernels import PATHS, affine_step, affine_step_ref, step, step_path, triangular

from helpers.kernel_checks import assert_as_accurate_as_ref, assert_close_scaled, coupling_mlp
from helpers.launches import triton_launches

NAMES = ["x", "loc", "logs", "lu", "log_s"]


def _step(rows, d, dtype=torch.float64, depth=3, width=8, seed=0):
    """(inputs, conditioner): x, loc, logs, lu, log_s, sign, perm, split and an MLP, drawn in
    float64 then cast, so every dtype gets the same values."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape, std=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * std).to(dtype)

    split = d // 2
    net = coupling_mlp(split, 2 * (d - split), dtype, depth, width, generator)
    sign = torch.where(torch.rand(d, generator=generator) < 0.5, -1.0, 1.0).to(dtype)
    inputs = [draw(rows, d) + 0.3, draw(d, std=0.5), draw(d, std=0.3), draw(d, d, std=0.2), draw(d, std=0.3), sign,
              torch.randperm(d, generator=generator), split]
    return inputs, net


def _backend(path):
    return use_backend("triton" if path == "triton" else "torch")


def _run(path, inputs, net, cotangents=None, trainable=NAMES):
    """(z, logdet, {name: gradient}) of the step on `path` (or the twin for path None)."""
    leaves = [t.detach().clone().requires_grad_(name in trainable) for name, t in zip(NAMES, inputs)]
    with _backend(path):
        if path is None:
            z, logdet = affine_step_ref(*leaves, *inputs[5:], net)
        else:
            z, logdet = affine_step(*leaves, *inputs[5:], net, path=path)
        if cotangents is None:
            return z, logdet, {}
        wanted = [(name, t) for name, t in zip(NAMES, leaves) if t.requires_grad]
        wanted += [(f"net.{name}", p) for name, p in net.named_parameters() if p.requires_grad]
        grads = torch.autograd.grad((z, logdet), [t for _, t in wanted],
                                    (cotangents[0].to(z.dtype), cotangents[1].to(logdet.dtype)))
    return z, logdet, dict(zip([name for name, _ in wanted], grads))


def _cotangents(rows, d, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, d, generator=generator, dtype=torch.float64),
            torch.randn(rows, generator=generator, dtype=torch.float64))


def _check_path(path, rows, d, dtype, training=True, trainable=NAMES, seed=0):
    """The path's outputs and gradients against the twin in `dtype` and in float64."""
    cotangents = _cotangents(rows, d) if training else None
    results = {}
    for label, run_path, run_dtype in ((path, path, dtype), ("twin", None, dtype), ("float64", None, torch.float64)):
        inputs, net = _step(rows, d, run_dtype, seed=seed)
        if training:
            net.requires_grad_(True)
        results[label] = _run(run_path, inputs, net, cotangents, trainable)
    (z, logdet, grads), (z_twin, logdet_twin, grads_twin), (z64, logdet64, grads64) = (
        results[path], results["twin"], results["float64"])
    close = assert_as_accurate_as_ref if dtype in (torch.float16, torch.bfloat16) else assert_close_scaled
    what = f"{path} step {rows}x{d} {dtype}"
    assert z.dtype == dtype and logdet.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    close(z, z_twin, z64, f"{what} z")
    close(logdet, logdet_twin, logdet64, f"{what} logdet")
    assert grads.keys() == grads_twin.keys(), what
    for name, grad in grads.items():
        close(grad, grads_twin[name], grads64[name], f"{what} d{name}")
    return grads


@pytest.fixture(params=["whole", "blocked"])
def factor_layout(request, monkeypatch):
    """The factored path's L and U as whole masked triangles, or on a split into diagonal blocks
    of 3 or more features (uneven blocks, many of them)."""
    monkeypatch.setattr(triangular, "BLOCK_WIDTH", 1 << 30 if request.param == "whole" else 3)
    return request.param


@pytest.fixture(params=["triton-gemm", "cublas-gemm"])
def gemm_route(request, monkeypatch):
    """The Triton step with its GEMMs as Triton kernels, or on cuBLAS (where a Triton GEMM would
    not use tensor cores) with the coupling as its own kernel."""
    if request.param == "cublas-gemm":
        monkeypatch.setattr(triton_utils, "triton_gemm", lambda tensor: False)
    return request.param


SHAPES = [(1, 2), (3, 7), (32, 64), (17, 383), (300, 95)]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("rows,d", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_path_matches_the_twin_in_training(path, rows, d, dtype):
    grads = _check_path(path, rows, d, dtype)
    assert set(NAMES) | {"net.0.weight", "net.4.bias"} <= grads.keys()


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("rows,d", SHAPES)
def test_every_path_matches_the_twin_in_inference(path, rows, d):
    with torch.no_grad():
        _check_path(path, rows, d, torch.float32, training=False)


@pytest.mark.parametrize("trainable", [("loc", "logs", "lu", "log_s"), ("x",), ()],
                         ids=["frozen-input", "input-only", "conditioner-only"])
@pytest.mark.parametrize("path", list(PATHS))
def test_frozen_inputs_get_no_gradient_and_the_rest_match(path, trainable):
    grads = _check_path(path, 45, 30, torch.float64, trainable=trainable)
    assert {name for name in grads if not name.startswith("net.")} == set(trainable)


def test_the_factored_path_on_whole_and_blocked_triangles(factor_layout):
    _check_path("factored", 17, 383, torch.float64)
    _check_path("factored", 4, 13, torch.float32)


@pytest.mark.parametrize("rows,d", [(1, 96), (7, 383), (1023, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_triton_path_on_both_gemm_routes(gemm_route, rows, d, dtype):
    inputs, net = _step(rows, d, dtype)
    with triton_launches() as launched:
        _check_path("triton", rows, d, dtype)
    if gemm_route == "triton-gemm":  # both GEMMs fused, the coupling in the second's epilogue
        assert launched["_folded_gemm_kernel"] == 2 and launched["_affine_bwd_kernel"] == 1, launched
    else:
        assert launched["_affine_fwd_kernel"] == 1 and launched["_affine_bwd_kernel"] == 1, launched
    assert not {"_linear_fwd_kernel", "_linear_bwd_dx_kernel", "_linear_bwd_dw_kernel"} & launched.keys()


@pytest.mark.parametrize("path", ["factored", "folded"])
@pytest.mark.parametrize("dtype, d", [(torch.bfloat16, 96), (torch.float32, 390)])
def test_cpu_paths_in_low_precision_are_as_accurate_as_the_twin(path, dtype, d):
    _check_path(path, 32, d, dtype)


@pytest.mark.parametrize("path", ["factored", "folded"])
def test_cpu_paths_have_exact_second_order_gradients(path):
    """Under create_graph the CPU Function's backward differentiates the composed twin."""
    inputs, net = _step(4, 6, seed=3)
    leaves = tuple(t.detach().clone().requires_grad_() for t in inputs[:5])

    def run(*args):
        return affine_step(*args, *inputs[5:], net, path=path)

    assert torch.autograd.gradcheck(run, leaves)
    assert torch.autograd.gradgradcheck(run, leaves)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("upstream", ["zero-dz", "zero-dlogdet", "expanded"])
def test_any_upstream_gradient(path, upstream):
    results = []
    for run_path in (path, None):
        inputs, net = _step(9, 14, seed=4)
        leaves = [t.detach().clone().requires_grad_() for t in inputs[:5]]
        with _backend(run_path):
            z, logdet = (affine_step(*leaves, *inputs[5:], net, path=run_path) if run_path
                         else affine_step_ref(*leaves, *inputs[5:], net))
            loss = {"expanded": z.sum() + logdet.sum(), "zero-dz": logdet.square().sum(),
                    "zero-dlogdet": z.square().sum()}[upstream]
            results.append(torch.autograd.grad(loss, [*leaves, *net.parameters()]))
    for fused, twin in zip(*results):
        torch.testing.assert_close(fused, twin, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", ["factored", "folded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_a_vanishing_scale_keeps_the_log_det_exact(path, dtype):
    """The CPU log-det is the log of sigmoid's output; where that underflows to 0 (a logit of
    -200) it falls back to log-sigmoid, so the log-det stays finite and equal to the twin's."""
    inputs, net = _step(5, 8, dtype, depth=1)
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.fill_(-200.0)
        z, logdet = affine_step(*inputs, net, path=path)
        z_twin, logdet_twin = affine_step_ref(*inputs, net)
    assert torch.isfinite(logdet).all()
    torch.testing.assert_close(logdet, logdet_twin)
    torch.testing.assert_close(z, z_twin)


def test_bad_arguments_are_named():
    inputs, net = _step(4, 8)
    with pytest.raises(ValueError, match=r"split must be in 1\.\.7, got 8"):
        affine_step(*inputs[:7], 8, net, path="folded")
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 6)).double()
    for path in ("factored", "folded"):
        with pytest.raises(ValueError, match="conditioner output must have 8 columns, got 6"):
            affine_step(*inputs, wrong, path=path)
    with pytest.raises(ValueError, match="unknown step path 'fast'"):
        affine_step(*inputs, net, path="fast")
    with pytest.raises(ValueError, match="need a plain MLP conditioner"):
        affine_step(*inputs, lambda y1: net(y1), path="folded")


# --- step_path: the one place a path is chosen


def test_cpu_training_on_small_batches_applies_the_factors():
    inputs, net = _step(31, 64)
    assert step_path(inputs[0], 64, [net], training=True) == "factored"
    assert step_path(torch.zeros(32, 64), 64, [net], training=True) == "folded"
    assert step_path(inputs[0], 64, [net], training=False) == "folded"


class _ShiftedSequential(torch.nn.Sequential):
    def forward(self, y1):
        return super().forward(y1) + 1.0


@pytest.mark.parametrize("kind", ["subclass", "forward-hook", "pre-hook", "function"])
def test_other_conditioners_run_the_twin_and_keep_their_own_behaviour(kind):
    """A Sequential subclass, hooks or a plain function change what the conditioner computes, so
    the CPU Function (which reads the Linear weights directly) must not run."""
    inputs, net = _step(12, 10, seed=5)
    conditioner = net
    if kind == "subclass":
        conditioner = _ShiftedSequential(*net)
    elif kind == "forward-hook":
        net[0].register_forward_hook(lambda module, args, output: output * 0.5)
    elif kind == "pre-hook":
        net.register_forward_pre_hook(lambda module, args: (args[0] * 2.0,))
    else:
        conditioner = lambda y1: net(y1) * 0.5  # noqa: E731
    path = step_path(inputs[0], 10, [conditioner], training=True)
    assert path == "reference"
    z, _ = affine_step(*inputs, conditioner, path=path)
    y = triangular.factored_linear_ref(*inputs[:4], inputs[5] * torch.exp(inputs[4]), inputs[6])
    h = conditioner(y[:, :5])
    scale = torch.sigmoid(h[:, 1::2] + flowcore.kernels.SCALE_OFFSET)
    torch.testing.assert_close(z[:, 5:], (y[:, 5:] + h[:, 0::2]) * scale)


def test_transforms_and_autocast_take_the_reference_path():
    inputs, net = _step(3, 8, seed=6)
    seen = []
    torch.func.vmap(lambda row: seen.append(step_path(row[None], 8, [net], training=True)) or row)(inputs[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen.append(step_path(inputs[0], 8, [net], training=True))
    assert seen == ["reference", "reference"]
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]
    jacobian = torch.func.jacrev(lambda logs: affine_step(*detached[:2], logs, *detached[3:], net, path=step_path(
        detached[0], 8, [net], training=True))[1])(detached[2])
    expected = torch.autograd.functional.jacobian(
        lambda logs: affine_step_ref(*detached[:2], logs, *detached[3:], net)[1], detached[2])
    torch.testing.assert_close(jacobian, expected, rtol=1e-12, atol=1e-12)


def test_the_triton_backend_takes_the_triton_path_unless_a_gradient_needs_a_module():
    inputs, net = _step(3, 8, seed=7)
    with use_backend("triton"):
        assert step_path(inputs[0], 8, [net], training=True) == "triton"
        assert step_path(inputs[0], 8, [lambda y1: net(y1)], training=True) == "reference"
        with torch.no_grad():
            assert step_path(inputs[0], 8, [lambda y1: net(y1)], training=False) == "triton"


def test_a_glow_runs_every_step_on_one_path(monkeypatch):
    """At 150 rows and d = 384 the first level alone would apply its factors (150 < 192) and the
    second fold its weight (150 > 96): the whole flow takes the one path chosen for its width."""
    seen = []
    original = step.affine_step

    def spy(*args, path, **kwargs):
        seen.append(path)
        return original(*args, path=path, **kwargs)

    monkeypatch.setattr(step, "affine_step", spy)
    monkeypatch.setattr(flowcore.kernels, "affine_step", spy)
    glow = flowcore.Glow(384, levels=2, depth=2, width=8)
    glow.bits_per_dim(torch.randn(150, 384)).backward()
    assert seen == ["factored"] * 4
    seen.clear()
    glow.eval()
    with torch.no_grad():
        glow(torch.randn(150, 384))
    assert seen == ["folded"] * 4
