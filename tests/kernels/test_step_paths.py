"""Every path of the plan (`flowcore.kernels.PATHS`), for every kind of step (LU or reversal, affine
or additive coupling), against the composed twins `step_ref` and `inverse_step_ref`, in the same
dtype and in float64: z (or x), the whole log-det and the gradient of every input (x, loc, logs, lu,
log_s and each conditioner parameter), in training and inference, on awkward shapes. The Triton
path runs in the interpreter. Then what only some paths have: the factors' block layouts, both GEMM
routes of the Triton step, exact second-order gradients, 16-bit activations, vanishing scales; and
`plan`, the one chooser."""
import pytest
import torch

import flowcore
import flowcore.kernels.triton._utils as triton_utils
from flowcore.backend import use_backend
from flowcore.kernels import PATHS, Plan, StepParameters, inverse_step_ref, plan, step_ref, triangular

from helpers.kernel_checks import assert_as_accurate_as_ref, assert_close_scaled, coupling_mlp
from helpers.launches import triton_launches

NAMES = ["x", "loc", "logs", "lu", "log_s"]
KINDS = [("affine", "lu"), ("additive", "lu"), ("affine", "reverse"), ("additive", "reverse")]
KIND_IDS = [f"{coupling}-{permutation}" for coupling, permutation in KINDS]
DEFAULT = KINDS[0]


def _step(rows, d, dtype=torch.float64, depth=3, width=8, seed=0, kind=DEFAULT):
    """(inputs, conditioner): x, loc, logs, lu, log_s, sign, perm (the last four None for the
    reversal) and an MLP, drawn in float64 then cast, so every dtype gets the same values."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape, std=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * std).to(dtype)

    split = d // 2
    coupling, permutation = kind
    net = coupling_mlp(split, (2 if coupling == "affine" else 1) * (d - split), dtype, depth, width, generator)
    sign = torch.where(torch.rand(d, generator=generator) < 0.5, -1.0, 1.0).to(dtype)
    inputs = [draw(rows, d) + 0.3, draw(d, std=0.5), draw(d, std=0.3), draw(d, d, std=0.2), draw(d, std=0.3), sign,
              torch.randperm(d, generator=generator)]
    if permutation == "reverse":
        inputs[3:] = [None] * 4
    return inputs, net


def _params(inputs, net, kind=DEFAULT) -> StepParameters:
    d = inputs[1].shape[0]
    return StepParameters(*inputs[1:7], d // 2, net, kind[0])


def _backend(path):
    return use_backend("triton" if path == "triton" else "torch")


def _run(path, inputs, net, cotangents=None, trainable=NAMES, kind=DEFAULT, inverse=False):
    """(z, logdet, {name: gradient}) of the step (or its inverse) on `path` (or the twin for path None)."""
    leaves = [t if t is None else t.detach().clone().requires_grad_(name in trainable)
              for name, t in zip(NAMES, inputs)]
    with _backend(path):
        p = _params([*leaves, *inputs[5:]], net, kind)
        if path is None:
            z, logdet = (inverse_step_ref if inverse else step_ref)(leaves[0], p)
        else:
            z, logdet = (Plan(path).inverse if inverse else Plan(path).step)(leaves[0], p)
        if cotangents is None:
            return z, logdet, {}
        wanted = [(name, t) for name, t in zip(NAMES, leaves) if t is not None and t.requires_grad]
        wanted += [(f"net.{name}", p) for name, p in net.named_parameters() if p.requires_grad]
        outputs = [(out, cotangent.to(out.dtype)) for out, cotangent in zip((z, logdet), cotangents)
                   if out.requires_grad]  # an additive step's log-det is constant unless loc, logs or log_s train
        outs, cotangents = zip(*outputs)
        grads = torch.autograd.grad(outs, [t for _, t in wanted], cotangents)
    return z, logdet, dict(zip([name for name, _ in wanted], grads))


def _cotangents(rows, d, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, d, generator=generator, dtype=torch.float64),
            torch.randn(rows, generator=generator, dtype=torch.float64))


def _check_path(path, rows, d, dtype, training=True, trainable=NAMES, seed=0, kind=DEFAULT, inverse=False):
    """The path's outputs and gradients against the twin in `dtype` and in float64."""
    cotangents = _cotangents(rows, d) if training else None
    results = {}
    for label, run_path, run_dtype in ((path, path, dtype), ("twin", None, dtype), ("float64", None, torch.float64)):
        inputs, net = _step(rows, d, run_dtype, seed=seed, kind=kind)
        if training:
            net.requires_grad_(True)
        results[label] = _run(run_path, inputs, net, cotangents, trainable, kind, inverse)
    (z, logdet, grads), (z_twin, logdet_twin, grads_twin), (z64, logdet64, grads64) = (
        results[path], results["twin"], results["float64"])
    close = assert_as_accurate_as_ref if dtype in (torch.float16, torch.bfloat16) else assert_close_scaled
    what = f"{path} {'inverse ' if inverse else ''}step {kind} {rows}x{d} {dtype}"
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
    not use tensor cores) with the coupling run in place after it."""
    if request.param == "cublas-gemm":
        monkeypatch.setattr(triton_utils, "triton_gemm", lambda tensor: False)
    return request.param


SHAPES = [(1, 2), (3, 7), (32, 64), (17, 383), (300, 95)]
VARIANT_SHAPES = [(1, 2), (3, 7), (300, 95)]


def _kind_cases(shapes):
    """(kind, rows, d): the default step on `shapes`, the variants on the fewer `VARIANT_SHAPES`."""
    return [pytest.param(kind, rows, d, id=f"{kind_id}-{rows}x{d}") for kind, kind_id in zip(KINDS, KIND_IDS)
            for rows, d in (shapes if kind == DEFAULT else VARIANT_SHAPES)]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind,rows,d", _kind_cases(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_path_matches_the_twin_in_training(path, kind, rows, d, dtype):
    grads = _check_path(path, rows, d, dtype, kind=kind)
    names = set(NAMES) if kind[1] == "lu" else {"x", "loc", "logs"}
    assert names | {"net.0.weight", "net.4.bias"} <= grads.keys()


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind,rows,d", _kind_cases(SHAPES))
def test_every_path_matches_the_twin_in_inference(path, kind, rows, d):
    with torch.no_grad():
        _check_path(path, rows, d, torch.float32, training=False, kind=kind)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind,rows,d", _kind_cases([(3, 7), (300, 95)]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_path_inverts_as_the_twin(path, kind, rows, d, dtype):
    grads = _check_path(path, rows, d, dtype, kind=kind, inverse=True)
    assert "x" in grads and "net.0.weight" in grads


@pytest.mark.parametrize("trainable", [("loc", "logs", "lu", "log_s"), ("x",), ()],
                         ids=["frozen-input", "input-only", "conditioner-only"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_frozen_inputs_get_no_gradient_and_the_rest_match(path, trainable, kind):
    grads = _check_path(path, 45, 30, torch.float64, trainable=trainable, kind=kind)
    expected = set(trainable) if kind[1] == "lu" else set(trainable) - {"lu", "log_s"}
    assert {name for name in grads if not name.startswith("net.")} == expected


def test_the_factored_path_on_whole_and_blocked_triangles(factor_layout):
    _check_path("factored", 17, 383, torch.float64)
    _check_path("factored", 4, 13, torch.float32)


@pytest.mark.parametrize("coupling", ["affine", "additive"])
@pytest.mark.parametrize("rows,d", [(1, 96), (7, 383), (1023, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_triton_path_on_both_gemm_routes(gemm_route, coupling, rows, d, dtype):
    with triton_launches() as launched:
        _check_path("triton", rows, d, dtype, kind=(coupling, "lu"))
    if gemm_route == "triton-gemm":  # both GEMMs fused, the coupling in the second's epilogue
        assert launched["_folded_gemm_kernel"] == 2, launched
    else:
        assert "_folded_gemm_kernel" not in launched
        assert launched["_affine_fwd_kernel"] == (coupling == "affine"), launched
    assert launched["_affine_bwd_kernel"] == (coupling == "affine"), launched


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
        return Plan(path).step(args[0], _params([*args, *inputs[5:]], net))

    assert torch.autograd.gradcheck(run, leaves)
    assert torch.autograd.gradgradcheck(run, leaves)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("upstream", ["zero-dz", "zero-dlogdet", "expanded"])
def test_any_upstream_gradient(path, upstream):
    results = []
    for run_path in (path, None):
        inputs, net = _step(9, 14, seed=4)
        leaves = [t.detach().clone().requires_grad_() for t in inputs[:5]]
        p = _params([*leaves, *inputs[5:]], net)
        with _backend(run_path):
            z, logdet = Plan(run_path).step(leaves[0], p) if run_path else step_ref(leaves[0], p)
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
        z, logdet = Plan(path).step(inputs[0], _params(inputs, net))
        z_twin, logdet_twin = step_ref(inputs[0], _params(inputs, net))
    assert torch.isfinite(logdet).all()
    torch.testing.assert_close(logdet, logdet_twin)
    torch.testing.assert_close(z, z_twin)


def test_bad_arguments_are_named():
    inputs, net = _step(4, 8)
    with pytest.raises(ValueError, match=r"split must be in 1\.\.7, got 8"):
        Plan("folded").step(inputs[0], _params(inputs, net)._replace(split=8))
    wrong = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 6)).double()
    for path in ("factored", "folded"):
        with pytest.raises(ValueError, match="conditioner output must have 8 columns, got 6"):
            Plan(path).step(inputs[0], _params(inputs, wrong))
    with pytest.raises(ValueError, match="unknown step path 'fast'"):
        Plan("fast")
    with pytest.raises(ValueError, match="need a plain MLP conditioner"):
        Plan("folded").step(inputs[0], _params(inputs, lambda y1: net(y1)))
    with pytest.raises(ValueError, match=r"step loc must have shape \(8,\)"):
        Plan("folded").step(inputs[0], _params(inputs, net)._replace(loc=torch.zeros(7, dtype=torch.float64)))
    with pytest.raises(ValueError, match="unknown coupling 'spline'"):
        Plan("folded").step(inputs[0], _params(inputs, net)._replace(coupling="spline"))


# --- plan: the one place a path is chosen


def test_cpu_training_on_small_batches_applies_the_factors():
    inputs, net = _step(31, 64)
    assert plan(inputs[0], 64, [net], training=True).path == "factored"
    assert plan(torch.zeros(32, 64), 64, [net], training=True).path == "folded"
    assert plan(inputs[0], 64, [net], training=False).path == "folded"


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
    chosen = plan(inputs[0], 10, [conditioner], training=True)
    assert chosen.path == "reference"
    z, _ = chosen.step(inputs[0], _params(inputs, conditioner))
    y = triangular.factored_linear_ref(*inputs[:4], inputs[5] * torch.exp(inputs[4]), inputs[6])
    h = conditioner(y[:, :5])
    scale = torch.sigmoid(h[:, 1::2] + flowcore.kernels.SCALE_OFFSET)
    torch.testing.assert_close(z[:, 5:], (y[:, 5:] + h[:, 0::2]) * scale)


def test_transforms_and_autocast_take_the_reference_path():
    inputs, net = _step(3, 8, seed=6)
    seen = []
    torch.func.vmap(lambda row: seen.append(plan(row[None], 8, [net], training=True).path) or row)(inputs[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        seen.append(plan(inputs[0], 8, [net], training=True).path)
    assert seen == ["reference", "reference"]
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in inputs]

    def logdet_of(logs, run):
        p = _params([*detached[:2], logs, *detached[3:]], net)
        return run(detached[0], p)[1]

    jacobian = torch.func.jacrev(lambda logs: logdet_of(logs, plan(detached[0], 8, [net], training=True).step))(
        detached[2])
    expected = torch.autograd.functional.jacobian(lambda logs: logdet_of(logs, step_ref), detached[2])
    torch.testing.assert_close(jacobian, expected, rtol=1e-12, atol=1e-12)


def test_the_triton_backend_takes_the_triton_path_unless_a_gradient_needs_a_module():
    inputs, net = _step(3, 8, seed=7)
    with use_backend("triton"):
        assert plan(inputs[0], 8, [net], training=True).path == "triton"
        assert plan(inputs[0], 8, [lambda y1: net(y1)], training=True).path == "reference"
        with torch.no_grad():
            assert plan(inputs[0], 8, [lambda y1: net(y1)], training=False).path == "triton"


def test_the_backend_is_read_once_per_plan(monkeypatch):
    """The plan keeps the backend it was made with: a later change applies to the next plan."""
    inputs, net = _step(3, 8, seed=7)
    with use_backend("triton"):
        chosen = plan(inputs[0], 8, [net], training=False)
    with torch.no_grad(), triton_launches() as launched:
        chosen.step(inputs[0], _params(inputs, net))
    assert chosen.backend == "triton" and launched["_folded_gemm_kernel"] == 2
    assert plan(inputs[0], 8, [net], training=False).backend == "torch"


@pytest.mark.parametrize("coupling,permutation", KINDS, ids=KIND_IDS)
def test_a_glow_asks_for_one_plan_per_call_and_runs_every_step_on_it(monkeypatch, coupling, permutation):
    """At 150 rows and d = 384 the first level alone would apply its factors (150 < 192) and the
    second fold its weight (150 > 96): the whole flow takes the one plan chosen for its width."""
    made, steps = [], []
    original_plan, original_step = flowcore.kernels.plan, Plan.step

    def planned(*args, **kwargs):
        made.append(original_plan(*args, **kwargs))
        return made[-1]

    def step(self, x, p):
        steps.append(self.path)
        return original_step(self, x, p)

    monkeypatch.setattr(flowcore.kernels, "plan", planned)
    monkeypatch.setattr(Plan, "step", step)
    glow = flowcore.Glow(384, levels=2, depth=2, width=8, coupling=coupling, permutation=permutation)
    glow.bits_per_dim(torch.randn(150, 384)).backward()
    assert [p.path for p in made] == ["factored"] and steps == ["factored"] * 4
    made.clear()
    steps.clear()
    glow.eval()
    with torch.no_grad():
        z, _ = glow(torch.randn(150, 384))
        glow.inverse(z)
    assert [p.path for p in made] == ["folded", "folded"] and steps == ["folded"] * 4
