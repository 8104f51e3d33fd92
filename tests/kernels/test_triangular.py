"""The LU ops of `LULinear` (`flowcore.kernels.triangular`) against their dense twins
`lu_product_ref` and `factored_linear_ref`, in float64, with first- and second-order gradients."""
import pytest
import torch

from flowcore.kernels import lu_factors, lu_product, lu_product_ref, triangular
from flowcore.kernels.triangular import _TriangularProduct, factored_linear_ref


@pytest.fixture(params=["whole", "blocked"])
def factor_layout(request, monkeypatch):
    """Run a test with the factors applied as whole masked triangles and on a split into diagonal
    blocks of 3 or more features (`triangular.BLOCK_WIDTH` moved: uneven blocks, many of them)."""
    monkeypatch.setattr(triangular, "BLOCK_WIDTH", 1 << 30 if request.param == "whole" else 3)
    return request.param


def _factors_inputs(dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
                 for shape in ((dim, dim), (dim, dim), (dim,)))


@pytest.mark.parametrize("dim", [1, 2, 7, 64, 383])
def test_blocked_product_matches_the_dense_product(dim):
    """`lu_product` skips the zero blocks of L @ U; value and gradients equal the dense autograd
    product in float64."""
    inputs = _factors_inputs(dim, seed=dim)
    cotangent = torch.randn(dim, dim, dtype=torch.float64)
    results = []
    for build in (lu_product, lu_product_ref):
        weight = build(*inputs)
        results.append((weight, torch.autograd.grad((weight * cotangent).sum(), inputs)))
    (weight, grads), (expected, expected_grads) = results
    assert weight.grad_fn is not None and type(weight.grad_fn).__name__ == "_TriangularProductBackward"
    torch.testing.assert_close(weight, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_factors_are_unit_lower_and_upper_with_the_diagonal():
    lower, upper, diagonal = (t.detach() for t in _factors_inputs(6))
    L, U = lu_factors(lower, upper, diagonal)
    assert torch.equal(torch.diagonal(L), torch.ones(6, dtype=torch.float64))
    assert torch.equal(torch.diagonal(U), diagonal)
    assert torch.equal(L, torch.tril(L)) and torch.equal(U, torch.triu(U))
    torch.testing.assert_close(lu_product_ref(lower, upper, diagonal), L @ U, rtol=0, atol=0)


def test_triangular_product_passes_gradcheck():
    inputs = (torch.randn(5, 5, dtype=torch.float64, requires_grad=True),
              torch.randn(5, 5, dtype=torch.float64, requires_grad=True),
              torch.randn(5, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(_TriangularProduct.apply, inputs)


def test_triangular_product_has_exact_second_order_gradients():
    """Under create_graph the backward differentiates the dense product, so double backward is exact."""
    generator = torch.Generator().manual_seed(0)

    def random(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    assert torch.autograd.gradgradcheck(_TriangularProduct.apply, (random(5, 5), random(5, 5), random(5)))


def test_torch_func_transforms_run_the_dense_product():
    inputs = tuple(t.detach() for t in _factors_inputs(6))
    jacobian = torch.func.jacrev(lu_product, argnums=2)(*inputs)
    expected = torch.autograd.functional.jacobian(lambda d: lu_product_ref(inputs[0], inputs[1], d), inputs[2])
    torch.testing.assert_close(jacobian, expected, rtol=1e-12, atol=1e-12)


def _factored_inputs(rows, dim, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    shapes = ((rows, dim), (dim,), (dim,), (dim, dim), (dim,))
    inputs = [torch.randn(*shape, generator=generator, dtype=dtype) for shape in shapes]
    inputs[2] = inputs[2] * 0.3  # logs
    return [t.requires_grad_() for t in inputs], torch.randperm(dim, generator=generator)


@pytest.mark.parametrize("rows, dim", [(1, 1), (1, 2), (3, 3), (5, 7), (32, 64), (17, 383)])
def test_the_factored_map_and_its_backward_match_the_dense_twin(factor_layout, rows, dim):
    """`factored_forward` and `factored_backward` (whole triangles or diagonal blocks, rank-batch
    gradients) equal ((x + loc) * exp(logs)) @ (P L U).T composed densely and its autograd
    gradients; lu's unused diagonal gets 0."""
    inputs, perm = _factored_inputs(rows, dim, seed=dim)
    cotangent = torch.randn(rows, dim, dtype=torch.float64)
    expected = factored_linear_ref(*inputs, perm)
    expected_grads = torch.autograd.grad((expected * cotangent).sum(), inputs)
    with torch.no_grad():
        y, saved = triangular.factored_forward(*inputs, perm)
        grads = triangular.factored_backward(cotangent, inputs[3], perm, saved, (True,) * 5)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-11, atol=1e-11)
    assert torch.equal(grads[3].diagonal(), torch.zeros(dim, dtype=torch.float64))
    with torch.no_grad():
        wanted = triangular.factored_backward(cotangent, inputs[3], perm, saved, (False, False, True, False, True))
    assert wanted[1] is None and wanted[3] is None and wanted[2] is not None and wanted[4] is not None


@pytest.mark.parametrize("dim, blocks", [(191, 1), (383, 1), (384, 2), (767, 3), (768, 4)])
def test_the_default_layout_splits_every_192_features(dim, blocks):
    """d // `BLOCK_WIDTH` diagonal blocks (at least one): the forward saves scale, a, t and each
    block of L and of U."""
    assert triangular.BLOCK_WIDTH == 192
    inputs, perm = _factored_inputs(2, dim)
    with torch.no_grad():
        saved = triangular.factored_forward(*inputs, perm)[1]
    assert len(saved) == 3 + 2 * blocks
    assert sum(block.shape[0] for block in saved[3:3 + blocks]) == dim
