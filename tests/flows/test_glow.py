"""Glow structure, configs, the eval-mode folded fast path and its cache."""
import pytest
import torch

import flowcore
from flowcore import kernels
from flowcore.flows.glow import CONFIGS, Glow

from helpers.contract import randomize


def trained_like_glow(dim=16, **kwargs):
    torch.manual_seed(0)
    glow = randomize(Glow(dim, **{"levels": 2, "depth": 2, "width": 8, **kwargs}), std=0.1)
    glow.train()
    glow(torch.randn(64, dim) * 2 + 1)  # initialise ActNorms
    return glow


def test_public_api_names():
    assert flowcore.Glow is Glow and set(CONFIGS) == {
        "l2_d2_w32", "l2_d3_w16", "l2_d3_w32", "l3_d2_w32", "l3_d3_w16", "l3_d3_w32"}
    glow = Glow.from_config("l3_d3_w16", 40)
    assert (len(glow.levels), len(glow.levels[0]), glow.config["width"]) == (3, 3, 16)
    assert glow.level_dims == [40, 20, 10]


def test_from_config_errors_are_clear():
    with pytest.raises(ValueError, match="unknown Glow config 'l9'"):
        Glow.from_config("l9", 8)
    with pytest.raises(TypeError, match="needs the embedding width"):
        Glow.from_config("l2_d3_w32")
    with pytest.raises(ValueError, match="needs at least 2"):
        Glow(3, levels=2)
    with pytest.raises(ValueError, match="unknown coupling"):
        Glow(8, coupling="spline")
    with pytest.raises(ValueError, match="expects shape \\(batch, 8\\)"):
        Glow(8)(torch.zeros(2, 9))


def test_latents_keep_positions_of_features_that_left():
    """Features that leave after level 1 are not touched by level 2."""
    glow = trained_like_glow(16)
    glow.eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        h = x
        for step in glow.levels[0]:
            h, _ = step(h)
        z, _ = glow(x)
    torch.testing.assert_close(z[:, 8:], h[:, 8:])


def test_log_prob_and_bits_per_dim():
    glow = trained_like_glow(16).double()
    x = torch.randn(7, 16, dtype=torch.float64)
    z, logdet = glow(x)
    expected = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(1) + logdet
    torch.testing.assert_close(glow.log_prob(x), expected)
    log2 = torch.log(torch.tensor(2.0, dtype=torch.float64))
    torch.testing.assert_close(glow.bits_per_dim(x), -expected.mean() / (16 * log2))


@pytest.mark.parametrize("permutation", ["lu", "reverse"])
def test_eval_fast_path_equals_training_path(permutation):
    glow = trained_like_glow(16, permutation=permutation).double()
    x = torch.randn(33, 16, dtype=torch.float64)
    z_train, logdet_train = glow(x)
    glow.eval()
    with torch.no_grad():
        z_eval, logdet_eval = glow(x)
    torch.testing.assert_close(z_eval, z_train, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logdet_eval, logdet_train, rtol=1e-12, atol=1e-12)


def test_eval_cache_follows_parameter_changes():
    glow = trained_like_glow(16).eval()
    x = torch.randn(10, 16)
    step = glow.levels[0][0]
    with torch.no_grad():
        glow(x)
        cached = step._fold_cache[1]
        glow(x)
        assert step._fold_cache[1] is cached, "the folded weight must be reused while parameters are unchanged"
        step.mixing.lu.add_(0.05)  # an in-place update, as an optimizer makes
        z_after, _ = glow(x)
    assert step._fold_cache[1] is not cached
    with torch.enable_grad():
        z_fresh, _ = glow(x)  # grad-enabled eval call recomputes without the cache
    torch.testing.assert_close(z_after, z_fresh.detach(), rtol=1e-5, atol=1e-5)
    glow.train()
    assert step._fold_cache is None


def test_eval_mode_still_gives_gradients_when_asked():
    glow = trained_like_glow(16).eval()
    glow.bits_per_dim(torch.randn(10, 16)).backward()
    assert all(p.grad is not None for p in glow.parameters())


def test_lu_weight_and_logdet():
    from flowcore.flows.invertible_linear import LULinear
    layer = randomize(LULinear(9).double(), std=0.2)
    weight = layer.weight()
    torch.testing.assert_close(torch.linalg.slogdet(weight)[1], layer.logdet())
    lower, upper = layer.factors()
    assert torch.equal(torch.diagonal(lower), torch.ones(9, dtype=torch.float64))
    torch.testing.assert_close(weight, (lower @ upper)[layer.perm])


def test_lu_initialisation_is_a_random_permutation():
    """L = U = I and P a random permutation: W is a permutation matrix (well conditioned for Adam)."""
    from flowcore.flows.invertible_linear import LULinear
    torch.manual_seed(0)
    layer = LULinear(12).double()
    weight = layer.weight()
    assert torch.equal(weight, torch.eye(12, dtype=torch.float64)[layer.perm])
    assert not torch.equal(layer.perm, torch.arange(12))
    assert torch.equal(layer.lu, torch.zeros(12, 12, dtype=torch.float64)) and layer.logdet() == 0


def test_cache_built_in_inference_mode_still_serves_gradients_to_inputs():
    """A frozen flow used for calibration (inference_mode) can afterwards give input gradients."""
    glow = trained_like_glow(16).eval().requires_grad_(False)
    x = torch.randn(10, 16)
    with torch.inference_mode():
        glow(x)
    x.requires_grad_(True)
    glow.log_prob(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dim", [1, 2, 7, 64, 383])
def test_lu_weight_from_triangular_blocks_matches_the_dense_product(dim):
    """`LULinear.weight()` skips the zero blocks of L @ U; value and gradients equal the dense
    autograd product in float64."""
    from flowcore.flows.invertible_linear import LULinear
    layer = randomize(LULinear(dim).double(), std=0.2, seed=dim)
    cotangent = torch.randn(dim, dim, dtype=torch.float64)

    def dense():
        lower, upper = layer.factors()
        return (lower @ upper)[layer.perm]

    results = []
    for build in (layer.weight, dense):
        weight = build()
        results.append((weight, torch.autograd.grad((weight * cotangent).sum(), list(layer.parameters()))))
    (weight, grads), (expected, expected_grads) = results
    torch.testing.assert_close(weight, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_log_prob_gradient_equals_autograd_of_the_formula():
    glow = trained_like_glow(16).double()
    x = torch.randn(9, 16, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(glow.log_prob(x).sum(), x)
    z, logdet = glow(x)
    naive = (-0.5 * (z * z).sum(1) - 8 * torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64)) + logdet).sum()
    (expected,) = torch.autograd.grad(naive, x)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [20, 300], ids=["factored", "folded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_fused_training_step_equals_the_composed_layers(dtype, rows):
    """A FlowStep (lu, affine) on the plan a Glow would ask for trains through the CPU step Function,
    its factors applied to small batches and folded into one GEMM for larger ones; it equals ActNorm +
    LU + coupling composed under autograd, in value and in every parameter's gradient."""
    from flowcore.flows.step import FlowStep
    torch.manual_seed(0)
    step = randomize(FlowStep(95, width=16), std=0.2).to(dtype)
    step.actnorm.initialize((torch.randn(300, 95) * 2 + 1).to(dtype))
    x = (torch.randn(rows, 95) * 2 + 1).to(dtype)
    plan = kernels.plan(x, 95, [step.coupling.net], training=True)
    assert plan.path == ("factored" if rows < 95 / 2 else "folded")

    def composed(v):
        y, actnorm_logdet = step.actnorm(v)
        y, mixing_logdet = step.mixing(y)
        z, coupling_logdet = step.coupling(y)
        return z, coupling_logdet + mixing_logdet + actnorm_logdet

    results = []
    for run in (lambda v: plan.step(v, step.params(v)), composed):
        z, logdet = run(x)
        results.append((z, logdet, torch.autograd.grad(z.square().sum() + logdet.sum(), list(step.parameters()))))
    (z, logdet, grads), (z_ref, logdet_ref, grads_ref) = results
    assert type(z.grad_fn).__name__ == "_AffineStepBackward"
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(z, z_ref, **tolerance)
    torch.testing.assert_close(logdet, logdet_ref, **tolerance)
    for grad, grad_ref in zip(grads, grads_ref):
        scale = grad_ref.abs().max().item()
        torch.testing.assert_close(grad, grad_ref, rtol=tolerance["rtol"], atol=tolerance["atol"] * max(scale, 1.0))


@pytest.mark.parametrize("dim", [3, 7, 40])
def test_small_batch_training_applies_the_factors_and_equals_the_folded_step(dim):
    """A training batch smaller than FACTORED_ROWS_PER_FEATURE x d takes the factored path; value
    and every gradient equal the folded path's, in float64."""
    from flowcore.flows.step import FlowStep
    from flowcore.kernels.plan import FACTORED_ROWS_PER_FEATURE
    torch.manual_seed(dim)
    step = randomize(FlowStep(dim, width=8), std=0.3).double()
    step.actnorm.initialize(torch.randn(50, dim, dtype=torch.float64) * 2 + 1)
    x = torch.randn(max(1, dim // 4), dim, dtype=torch.float64) * 2 + 1
    assert x.shape[0] < FACTORED_ROWS_PER_FEATURE * dim
    assert kernels.plan(x, dim, [step.coupling.net], training=True).path == "factored"
    results = []
    for path in ("factored", "folded"):
        z, logdet = kernels.Plan(path).step(x, step.params(x))
        results.append((z, logdet, torch.autograd.grad(z.square().sum() + logdet.sum(), list(step.parameters()))))
    (z, logdet, grads), (z_ref, logdet_ref, grads_ref) = results
    torch.testing.assert_close(z, z_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logdet, logdet_ref, rtol=1e-10, atol=1e-10)
    for grad, grad_ref in zip(grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-9)


def test_cpu_inference_in_row_blocks_equals_the_whole_batch(monkeypatch):
    from flowcore import defaults
    glow = trained_like_glow(16).double().eval()
    x = torch.randn(1000, 16, dtype=torch.float64)
    with torch.no_grad():
        z_whole, logdet_whole = glow(x)
        log_prob_whole = glow.log_prob(x)
    blocks = []
    latent_parts = glow._latent_parts
    monkeypatch.setattr(glow, "_latent_parts", lambda rows, plan: blocks.append(len(rows)) or latent_parts(rows, plan))
    monkeypatch.setattr(defaults, "CPU_BLOCK_BYTES", 128 * 16 * 8)  # 128 rows per block
    with torch.no_grad():
        z, logdet = glow(x)
        log_prob = glow.log_prob(x)
    assert sorted(blocks) == sorted([128] * 7 + [104] + [128] * 7 + [104])  # side by side: any order
    torch.testing.assert_close(z, z_whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logdet, logdet_whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_prob, log_prob_whole, rtol=1e-12, atol=1e-12)
    glow.train()
    blocks.clear()
    glow(x)
    assert blocks == [1000], "training runs the whole batch at once"


def _side_by_side(monkeypatch, rows_per_block: int, dim: int, workers: int = 2):
    """Row blocks of `rows_per_block` float32 rows, `workers` CPUs and torch threads."""
    import flowcore.runtime as runtime
    from flowcore import defaults
    monkeypatch.setattr(defaults, "CPU_BLOCK_BYTES", rows_per_block * dim * 4)
    monkeypatch.setattr(runtime, "available_cpus", lambda: workers)
    before = torch.get_num_threads()
    torch.set_num_threads(workers)
    return before


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_cpu_inference_blocks_run_side_by_side_as_one_thread_would(monkeypatch, mode):
    """With 2 threads the blocks run in 2 worker threads of one torch thread each, and z, logdet
    and log_prob equal bit for bit those of a one-thread run (no dependence on thread count)."""
    import threading
    glow = trained_like_glow(32).eval()
    x = torch.randn(900, 32)
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode
    before = _side_by_side(monkeypatch, 64, 32)
    try:
        torch.set_num_threads(1)
        with context():
            z_one, logdet_one = glow(x)
            log_prob_one = glow.log_prob(x)
        torch.set_num_threads(2)
        seen = []
        latent_parts = glow._latent_parts
        monkeypatch.setattr(glow, "_latent_parts", lambda rows, plan: seen.append(
            (threading.get_ident(), torch.get_num_threads(), torch.is_grad_enabled())) or latent_parts(rows, plan))
        with context():
            z, logdet = glow(x)
            log_prob = glow.log_prob(x)
        assert torch.get_num_threads() == 2, "torch's thread count is restored"
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 2 * 15 and {threads for _, threads, _ in seen} == {1}
    assert threading.get_ident() not in {ident for ident, _, _ in seen}, "blocks ran in worker threads"
    assert not any(grad for _, _, grad in seen), "the workers run without autograd, as the caller"
    assert torch.equal(z, z_one) and torch.equal(logdet, logdet_one) and torch.equal(log_prob, log_prob_one)


def test_cpu_inference_block_failure_is_raised(monkeypatch):
    glow = trained_like_glow(16).eval()
    before = _side_by_side(monkeypatch, 32, 16)
    calls = []
    latent_parts = glow._latent_parts

    def failing(rows, plan):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("block 3 failed")
        return latent_parts(rows, plan)

    monkeypatch.setattr(glow, "_latent_parts", failing)
    try:
        with torch.no_grad(), pytest.raises(RuntimeError, match="block 3 failed"):
            glow(torch.randn(640, 16))
        assert torch.get_num_threads() == 2, "torch's thread count is restored after a failure"
    finally:
        torch.set_num_threads(before)


def test_cpu_inference_blocks_with_forward_hooks_stay_in_the_calling_thread(monkeypatch):
    """A hook on a module the flow calls (a step's conditioner) runs in the caller's thread, once per block."""
    import threading
    glow = trained_like_glow(16).eval()
    before = _side_by_side(monkeypatch, 32, 16)
    threads = []
    glow.levels[0][0].coupling.net.register_forward_hook(
        lambda module, inputs, output: threads.append(threading.get_ident()))
    try:
        with torch.no_grad():
            glow(torch.randn(320, 16))
    finally:
        torch.set_num_threads(before)
    assert threads == [threading.get_ident()] * 10


def test_custom_functions_have_exact_second_order_gradients():
    """The hand-written backwards (blocked L @ U, the fused step, the squared norm) fall back to
    autograd under create_graph, so double backward is exact (each Function on its own:
    tests/kernels/test_triangular.py, test_squared_norm.py, test_step_paths.py)."""
    generator = torch.Generator().manual_seed(0)
    glow = trained_like_glow(8, depth=1, width=4).double()
    x = torch.randn(3, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda v: glow.log_prob(v), (x,))


def test_torch_func_transforms_run_the_composed_ops():
    """`torch.func.grad` and `jacrev` cannot enter the custom autograd Functions; the flow gives
    them composed ops with the same values."""
    glow = trained_like_glow(8, depth=1, width=4).double()
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    (expected,) = torch.autograd.grad(glow.log_prob(x).sum(), x)
    grad = torch.func.grad(lambda v: glow.log_prob(v).sum())(x.detach())
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)
    jacobian = torch.func.jacrev(lambda v: glow(v.unsqueeze(0))[0][0])(x[0].detach())
    expected_jacobian = torch.autograd.functional.jacobian(lambda v: glow(v.unsqueeze(0))[0][0], x[0].detach())
    torch.testing.assert_close(jacobian, expected_jacobian, rtol=1e-10, atol=1e-12)


def test_training_under_cpu_autocast_runs_the_composed_ops():
    glow = trained_like_glow(16)
    x = torch.randn(64, 16)
    glow.bits_per_dim(x).backward()
    expected = [p.grad.clone() for p in glow.parameters()]
    glow.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = glow.bits_per_dim(x)
    loss.backward()
    for parameter, grad in zip(glow.parameters(), expected):
        assert torch.isfinite(parameter.grad).all()
        assert (parameter.grad - grad).abs().max() <= 0.1 * grad.abs().max() + 1e-3


def test_log_prob_fires_the_glows_forward_hooks():
    glow = trained_like_glow(16)
    calls = []
    glow.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    glow.log_prob(torch.randn(5, 16))
    assert calls == [5]


def test_a_scalar_input_gets_the_shape_error():
    glow = trained_like_glow(16).eval()
    for call in (glow, glow.log_prob):
        with pytest.raises(ValueError, match=r"expects shape \(batch, 16\), got \(\)"):
            call(torch.tensor(1.0))
