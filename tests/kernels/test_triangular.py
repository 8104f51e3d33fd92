"""The blocked L @ U product of `LULinear` (`flowcore.kernels.triangular`) against the dense
`lu_product_ref`, in float64, with first- and second-order gradients."""
import pytest
import torch

from flowcore.kernels import lu_factors, lu_product, lu_product_ref
from flowcore.kernels.triangular import _TriangularProduct


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
