"""One local Ray session (2 CPUs) shared by every test in this folder: starting one takes ~10 s."""
import pytest


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def vector_flow(tmp_path_factory):
    """A flow on 8-wide stored vectors (the tests' DIM), fitted for one epoch."""
    import numpy as np

    from flowcore import FlowCalibrator

    path = tmp_path_factory.mktemp("flow") / "model.flow"
    FlowCalibrator(seed=0, epochs=1).fit(np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32),
                                         show_progress_bar=False).save(path)
    return path


@pytest.fixture(scope="session")
def text_flow(tmp_path_factory):
    """A flow on a tiny BERT's mean-pooled vectors (over `helpers.tiny_models.WORDS`), recording that encoder."""
    import numpy as np

    from flowcore import Encoder, FlowCalibrator

    from helpers.tiny_models import WORDS, save_tiny_bert

    folder = tmp_path_factory.mktemp("text-flow")
    encoder = Encoder(model=save_tiny_bert(folder / "bert", WORDS, hidden_size=16, num_layers=2), pooling="mean")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 10))) for _ in range(256)]
    FlowCalibrator(seed=0, epochs=1).fit(encoder.encode(texts), show_progress_bar=False, encoder=encoder).save(
        folder / "text.flow")
    return folder / "text.flow"
