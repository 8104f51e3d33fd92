"""Maximum-likelihood training: it learns, it is reproducible, it refuses bad data and stops on NaN."""
import numpy as np
import pytest
import torch

import flowcore
from flowcore.flows.actnorm import ActNorm
from flowcore.flows.train import TrainingDivergedError


def anisotropic_gaussian(rows=3000, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)) * np.linspace(0.1, 3.0, dim)
    return (rng.normal(size=(rows, dim)) @ mixing + rng.normal(size=dim) * 4).astype(np.float32)


def test_training_lowers_loss_and_whitens():
    X = anisotropic_gaussian()
    glow = flowcore.Glow(12, levels=2, depth=3, width=16)
    losses = flowcore.fit(glow, X, epochs=4, batch_size=64, lr=2e-3, progress=False)
    assert losses[-1] < losses[0]
    with torch.no_grad():
        z, _ = glow(torch.from_numpy(X))
    raw = torch.from_numpy(X)
    raw_eigenvalues = torch.linalg.eigvalsh(torch.corrcoef(raw.T))
    assert raw_eigenvalues[0] < 0.01  # the input is far from isotropic
    assert z.mean(0).abs().max() < 0.15
    covariance = torch.cov(z.T)
    assert (covariance - torch.eye(12)).abs().max() < 0.45
    eigenvalues = torch.linalg.eigvalsh(covariance)
    assert eigenvalues[0] > 0.3 and eigenvalues[-1] < 2.0


def test_same_seed_same_result_and_float64():
    X = anisotropic_gaussian(rows=500, dim=8)
    results = []
    for _ in range(2):
        torch.manual_seed(5)
        glow = flowcore.Glow(8, levels=2, depth=2, width=8).double()
        losses = flowcore.fit(glow, X, epochs=2, batch_size=50, seed=7, progress=False)
        results.append((losses, [p.detach().clone() for p in glow.parameters()]))
        assert next(glow.parameters()).dtype == torch.float64
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    torch.manual_seed(5)
    other = flowcore.Glow(8, levels=2, depth=2, width=8).double()
    assert flowcore.fit(other, X, epochs=2, batch_size=50, seed=8, progress=False) != results[0][0]


def test_non_finite_loss_stops_with_clear_message_and_clean_weights(monkeypatch):
    X = anisotropic_gaussian(rows=256, dim=8)
    glow = flowcore.Glow(8, levels=2, depth=2, width=8)
    calls = {"n": 0}
    real = glow.bits_per_dim
    snapshot = {}

    def exploding(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            snapshot.update({n: p.detach().clone() for n, p in glow.named_parameters()})
            return real(batch) * float("nan")
        return real(batch)

    monkeypatch.setattr(glow, "bits_per_dim", exploding)
    with pytest.raises(TrainingDivergedError, match=r"epoch 1, step 3/8.*lower learning rate"):
        flowcore.fit(glow, X, batch_size=32, progress=False)
    for name, parameter in glow.named_parameters():
        assert torch.isfinite(parameter).all()
        assert torch.equal(parameter, snapshot[name]), f"{name} changed after the NaN step"


def test_bad_training_data_is_refused():
    glow = flowcore.Glow(8, levels=2, depth=2, width=8)
    X = anisotropic_gaussian(rows=64, dim=8)
    with pytest.raises(ValueError, match="has 7 features per row but the flow expects 8"):
        flowcore.fit(glow, X[:, :7], progress=False)
    with pytest.raises(ValueError, match="at least 2 are needed"):
        flowcore.fit(glow, X[:1], progress=False)
    bad = X.copy()
    bad[17, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf values in row\\(s\\) 17"):
        flowcore.fit(glow, bad, progress=False)
    constant = X.copy()
    constant[:, 5] = 2.5
    with pytest.raises(ValueError, match="feature\\(s\\) 5 have zero variance"):
        flowcore.fit(glow, constant, progress=False)


def test_actnorm_init_needs_two_rows():
    with pytest.raises(ValueError, match="at least 2 rows in the first training batch, got 1"):
        ActNorm(4).train()(torch.randn(1, 4))


def test_actnorm_initialises_to_zero_mean_unit_variance():
    layer = ActNorm(6).train()
    x = torch.randn(200, 6, dtype=torch.float64) * torch.arange(1, 7) + 3
    y, _ = layer.double()(x)
    torch.testing.assert_close(y.mean(0), torch.zeros(6, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.std(0, unbiased=False), torch.ones(6, dtype=torch.float64))
    assert bool(layer.initialized)
