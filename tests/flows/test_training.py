"""Maximum-likelihood training: it learns, it is reproducible, it refuses bad data and stops on NaN."""
import numpy as np
import pytest
import torch

import flowcore
from flowcore.flows import train as train_module
from flowcore.flows.actnorm import ActNorm
from flowcore.flows.train import TrainingDivergedError


def anisotropic_gaussian(rows=3000, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(dim, dim)) * np.linspace(0.1, 3.0, dim)
    return (rng.normal(size=(rows, dim)) @ mixing + rng.normal(size=dim) * 4).astype(np.float32)


def test_training_lowers_loss_and_whitens():
    X = anisotropic_gaussian()
    glow = flowcore.Glow(12, levels=2, depth=3, width=16)
    losses = flowcore.fit(glow, X, epochs=4, batch_size=64, lr=2e-3, show_progress_bar=False)
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
        losses = flowcore.fit(glow, X, epochs=2, batch_size=50, seed=7, show_progress_bar=False)
        results.append((losses, [p.detach().clone() for p in glow.parameters()]))
        assert next(glow.parameters()).dtype == torch.float64
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    torch.manual_seed(5)
    other = flowcore.Glow(8, levels=2, depth=2, width=8).double()
    assert flowcore.fit(other, X, epochs=2, batch_size=50, seed=8, show_progress_bar=False) != results[0][0]


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
        flowcore.fit(glow, X, batch_size=32, show_progress_bar=False)
    for name, parameter in glow.named_parameters():
        assert torch.isfinite(parameter).all()
        assert torch.equal(parameter, snapshot[name]), f"{name} changed after the NaN step"


def test_bad_training_data_is_refused():
    glow = flowcore.Glow(8, levels=2, depth=2, width=8)
    X = anisotropic_gaussian(rows=64, dim=8)
    with pytest.raises(ValueError, match="has 7 features per row but the flow expects 8"):
        flowcore.fit(glow, X[:, :7], show_progress_bar=False)
    with pytest.raises(ValueError, match="at least 2 are needed"):
        flowcore.fit(glow, X[:1], show_progress_bar=False)
    bad = X.copy()
    bad[17, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf values in row\\(s\\) 17"):
        flowcore.fit(glow, bad, show_progress_bar=False)
    constant = X.copy()
    constant[:, 5] = 2.5
    with pytest.raises(ValueError, match="feature\\(s\\) 5 have zero variance"):
        flowcore.fit(glow, constant, show_progress_bar=False)


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


class _Killed(Exception):
    """Stands in for a kill -9 just after a checkpoint was written (the checkpoint is atomic, so a
    kill anywhere else loses only the steps since it)."""


def _tiny_glow(dim=8):
    torch.manual_seed(3)
    return flowcore.Glow(dim, levels=2, depth=2, width=8)


def _state(glow):
    return {name: value.clone() for name, value in glow.state_dict().items()}


def test_killed_and_resumed_training_ends_with_the_same_weights_bit_for_bit(tmp_path, monkeypatch):
    X = anisotropic_gaussian(rows=256, dim=8)
    options = dict(epochs=3, batch_size=32, lr=2e-3, seed=1, show_progress_bar=False)  # 24 steps
    reference = _tiny_glow()
    expected_losses = flowcore.fit(reference, X, **options)

    checkpoint = tmp_path / "fit.ckpt"
    seen, kill_at = [], 13
    save_checkpoint = train_module._save_checkpoint

    def save_then_maybe_die(*args):  # a checkpoint is written, then the process dies
        save_checkpoint(*args)
        seen.append(args[-2].epoch * 8 + args[-2].step)  # steps done (8 a epoch)
        if seen[-1] == kill_at:
            raise _Killed

    monkeypatch.setattr(train_module, "_save_checkpoint", save_then_maybe_die)
    with pytest.raises(_Killed):
        flowcore.fit(_tiny_glow(), X, checkpoint=checkpoint, checkpoint_every=13, **options)
    assert seen == [8, 13]  # after epoch 1 and at step 13 (mid-epoch 2)
    resumed, seen[:], kill_at = _tiny_glow(), [], None
    losses = flowcore.fit(resumed, np.load(_saved(tmp_path, X), mmap_mode="r"), checkpoint=checkpoint,
                          checkpoint_every=13, **options)
    assert seen == [16, 24]  # epoch 2's end, then the final checkpoint
    assert losses == expected_losses
    for name, value in _state(reference).items():
        assert torch.equal(resumed.state_dict()[name], value), name
    again = _tiny_glow()  # a finished checkpoint: nothing left to train
    assert flowcore.fit(again, X, checkpoint=checkpoint, **options) == expected_losses
    assert all(torch.equal(again.state_dict()[name], value) for name, value in _state(reference).items())


def _saved(folder, X):
    path = folder / "X.npy"
    np.save(path, X)
    return path


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    X = anisotropic_gaussian(rows=128, dim=8)
    checkpoint = tmp_path / "fit.ckpt"
    flowcore.fit(_tiny_glow(), X, epochs=1, batch_size=32, checkpoint=checkpoint, show_progress_bar=False)
    with pytest.raises(flowcore.flows.train.CheckpointMismatchError, match=r"fit.ckpt is a checkpoint of another.*"
                       r"lr was 0.001, now 0.002"):
        flowcore.fit(_tiny_glow(), X, epochs=1, batch_size=32, lr=2e-3, checkpoint=checkpoint, show_progress_bar=False)
    checkpoint.write_bytes(b"not a checkpoint")
    with pytest.raises(flowcore.flows.train.CheckpointMismatchError, match="unreadable training checkpoint"):
        flowcore.fit(_tiny_glow(), X, epochs=1, batch_size=32, checkpoint=checkpoint, show_progress_bar=False)


def test_on_epoch_stops_training_and_its_state_is_checkpointed(tmp_path):
    X = anisotropic_gaussian(rows=128, dim=8)

    class StopAfterTwo:
        def __init__(self):
            self.calls = []

        def __call__(self, epochs_done, loss):
            self.calls.append(epochs_done)
            return epochs_done == 2

        def checkpoint_state(self):
            return {"marker": torch.tensor([len(self.calls)])}, {"calls": self.calls}

        def restore_checkpoint_state(self, tensors, info):
            assert int(tensors["marker"]) == len(info["calls"])
            self.calls = list(info["calls"])

    first = StopAfterTwo()
    checkpoint = tmp_path / "fit.ckpt"
    losses = flowcore.fit(_tiny_glow(), X, epochs=5, batch_size=32, checkpoint=checkpoint, on_epoch=first,
                          show_progress_bar=False)
    assert len(losses) == 2 and first.calls == [1, 2]
    rerun = StopAfterTwo()
    assert flowcore.fit(_tiny_glow(), X, epochs=5, batch_size=32, checkpoint=checkpoint, on_epoch=rerun,
                        show_progress_bar=False) == losses
    assert rerun.calls == [1, 2]  # restored, not called again


def test_evaluations_within_epochs_can_stop_training_and_a_killed_run_resumes_to_the_same_end(tmp_path,
                                                                                             monkeypatch):
    """`evaluate_every`: `on_epoch` also runs every N steps of an epoch, with the fraction of epochs
    trained; a stop there ends the losses with that part-epoch's mean; killed after a checkpoint,
    the same call resumes and ends with the same weights, losses and evaluations."""
    X = anisotropic_gaussian(rows=256, dim=8)
    options = dict(epochs=3, batch_size=32, lr=2e-3, seed=1, show_progress_bar=False, evaluate_every=3)

    class StopAt:
        def __init__(self):
            self.calls = []

        def __call__(self, epochs_done, loss):
            self.calls.append(epochs_done)
            return epochs_done == 1.75

        def checkpoint_state(self):
            return {}, {"calls": self.calls}

        def restore_checkpoint_state(self, tensors, info):
            self.calls = list(info["calls"])

    reference, stop = _tiny_glow(), StopAt()
    losses = flowcore.fit(reference, X, on_epoch=stop, **options)  # 8 steps an epoch: steps 3, 6, the end
    assert stop.calls == [3 / 8, 6 / 8, 1, 1 + 3 / 8, 1 + 6 / 8] and len(losses) == 2
    partial = _tiny_glow()
    six_steps = flowcore.fit(partial, X, epochs=2, batch_size=32, lr=2e-3, seed=1, show_progress_bar=False)
    assert losses[0] == six_steps[0]  # the first epoch is the first epoch of a run without evaluations

    checkpoint, saves = tmp_path / "fit.ckpt", []
    save_checkpoint = train_module._save_checkpoint

    def save_then_maybe_die(*args):
        save_checkpoint(*args)
        saves.append(args[-2].epoch * 8 + args[-2].step)
        if saves[-1] == 10:
            raise _Killed

    monkeypatch.setattr(train_module, "_save_checkpoint", save_then_maybe_die)
    with pytest.raises(_Killed):
        flowcore.fit(_tiny_glow(), X, on_epoch=StopAt(), checkpoint=checkpoint, checkpoint_every=5, **options)
    resumed, again = _tiny_glow(), StopAt()
    assert flowcore.fit(resumed, X, on_epoch=again, checkpoint=checkpoint, checkpoint_every=5, **options) == losses
    assert again.calls == stop.calls  # restored up to step 10, then evaluated at 1 + 6/8 as before
    assert all(torch.equal(resumed.state_dict()[name], value) for name, value in _state(reference).items())
    with pytest.raises(flowcore.flows.train.CheckpointMismatchError, match="evaluate_every was 3, now 4"):
        flowcore.fit(_tiny_glow(), X, on_epoch=StopAt(), checkpoint=checkpoint, **{**options, "evaluate_every": 4})
    with pytest.raises(ValueError, match="evaluate_every must be >= 1"):
        flowcore.fit(_tiny_glow(), X, evaluate_every=0)


def test_paper_setting_fit_descends_without_a_spike():
    """Batch 32, lr 1e-3 at d = 512 (the paper's setting, smaller): every step's loss stays below
    the first one's. From the LU factors of a random rotation (condition number ~1000 at this d)
    the same fit rose 60 % above its start within 15 steps."""
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(1600, 512)) @ (rng.normal(size=(512, 512)) / 512**0.5) + 0.5).astype(np.float32)
    torch.manual_seed(1)
    glow = flowcore.Glow.from_config("l2_d3_w32", 512)
    losses = []
    real = glow.bits_per_dim

    def recorded(batch):
        loss = real(batch)
        losses.append(loss.item())
        return loss

    glow.bits_per_dim = recorded
    flowcore.fit(glow, X, batch_size=32, lr=1e-3, show_progress_bar=False)
    steps = losses  # ActNorm's initialisation pass calls the flow, not bits_per_dim
    assert len(steps) == 50
    assert max(steps[1:]) < steps[0] + 0.05
    assert np.mean(steps[-10:]) < steps[0] - 0.2


@pytest.mark.parametrize("batch_size, threads, expected", [(32, None, 1), (512, None, None), (32, 2, 2)])
def test_fit_pins_its_thread_count_and_restores_it(batch_size, threads, expected):
    """Small batches train on one thread (each op too small to share, and a busy core would stall
    every op's barrier); `threads` overrides; torch's setting is restored afterwards."""
    from flowcore.runtime import available_cpus, training_threads
    X = anisotropic_gaussian(rows=600, dim=8)
    glow = flowcore.Glow(8, levels=2, depth=2, width=8)
    before = torch.get_num_threads()
    seen = []
    flowcore.fit(glow, X, batch_size=batch_size, show_progress_bar=False, threads=threads,
                 on_epoch=lambda epoch, loss: seen.append(torch.get_num_threads()))
    assert seen == [expected if expected is not None else max(1, min(before, available_cpus()))]
    assert torch.get_num_threads() == before
    assert training_threads(batch_size) == (1 if batch_size < 256 else seen[0])
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        flowcore.fit(glow, X, threads=0, show_progress_bar=False)


def test_the_gradient_check_tells_overflowing_sums_from_non_finite_gradients():
    from flowcore.flows.train import _all_finite

    big = torch.full((4,), 3e38)  # finite, but its sum overflows
    assert _all_finite([torch.ones(3), big])
    assert not _all_finite([torch.ones(3), torch.tensor([1.0, float("nan")])])
    assert not _all_finite([torch.tensor([float("inf"), -float("inf")]), torch.ones(2)])
    assert not _all_finite([torch.tensor([float("inf")])])
