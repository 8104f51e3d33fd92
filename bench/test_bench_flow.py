"""CPU flow suite: inference (x -> z, logdet) and one training step at d = 768, batch 8192,
flowcore against normflows built with the same structure, plus the machine's fp32 GEMM roofline.

Goals: inference >= 3x normflows and >= 70 % of the roofline (one d x d GEMM per step);
training step >= 2x normflows. Run: `pytest bench/test_bench_flow.py`.
"""
import normflows as nf
import pytest
import torch

import flowcore

DIM, BATCH, CONFIG = 768, 8192, "l2_d3_w32"
LEVELS, DEPTH, WIDTH = 2, 3, 32


class NormflowsGlow(torch.nn.Module):
    """The same multi-scale structure from normflows parts: per level `DEPTH` x (ActNorm,
    LULinearPermute, AffineCouplingBlock with MLP [d/2, 32, 32, d], sigmoid scale); half of the
    features leave after the first level. normflows maps latent -> data in `forward`, so the
    data -> latent direction is `inverse`."""

    def __init__(self):
        super().__init__()
        self.levels = torch.nn.ModuleList()
        for level in range(LEVELS):
            d = DIM // 2**level
            steps = []
            for _ in range(DEPTH):
                steps += [
                    nf.flows.AffineCouplingBlock(nf.nets.MLP([d // 2, WIDTH, WIDTH, d], init_zeros=True),
                                                 scale_map="sigmoid"),
                    nf.flows.LULinearPermute(d),
                    nf.flows.ActNorm((d,)),
                ]
            self.levels.append(torch.nn.ModuleList(steps))

    def latent(self, x):
        logdet = x.new_zeros(x.shape[0])
        leaving = []
        for index, steps in enumerate(self.levels):
            for flow in reversed(steps):
                x, step_logdet = flow.inverse(x)
                logdet = logdet + step_logdet
            if index + 1 < LEVELS:
                keep = x.shape[1] // 2
                leaving.append(x[:, keep:])
                x = x[:, :keep]
        return torch.cat([x, *reversed(leaving)], 1), logdet

    def bits_per_dim(self, x):
        z, logdet = self.latent(x)
        log_prob = -0.5 * (z * z).sum(1) - 0.5 * DIM * torch.log(torch.tensor(2 * torch.pi)) + logdet
        return -log_prob.mean() / (DIM * torch.log(torch.tensor(2.0)))


@pytest.fixture(scope="module")
def data():
    torch.manual_seed(0)
    return torch.randn(BATCH, DIM) @ (torch.randn(DIM, DIM) / DIM**0.5) + 0.5


@pytest.fixture(scope="module")
def flowcore_glow(data):
    glow = flowcore.Glow.from_config(CONFIG, DIM)
    flowcore.fit(glow, data[:1024], batch_size=512, progress=False)  # ActNorm init + a few steps
    return glow


@pytest.fixture(scope="module")
def normflows_glow(data):
    model = NormflowsGlow()
    with torch.no_grad():
        model.latent(data[:1024])  # ActNorm data-dependent init
    return model


def gemm_roofline_seconds(benchmark_gemm) -> float:
    """Time of the flow's irreducible work at the measured GEMM speed: one d x d GEMM per step."""
    flops = sum(DEPTH * 2 * BATCH * (DIM // 2**level) ** 2 for level in range(LEVELS))
    return flops / benchmark_gemm


@pytest.fixture(scope="module")
def gemm_flops_per_second():
    a, b = torch.randn(BATCH, DIM), torch.randn(DIM, DIM)
    import time
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * BATCH * DIM * DIM / best


@pytest.mark.benchmark(group="flow-inference-cpu")
def test_inference_flowcore(benchmark, record, flowcore_glow, data, gemm_flops_per_second):
    flowcore_glow.eval()

    def run():
        with torch.inference_mode():
            return flowcore_glow(data)

    benchmark.pedantic(run, rounds=8, warmup_rounds=2)
    roofline = gemm_roofline_seconds(gemm_flops_per_second)
    median = record("flow-inference-cpu", "flowcore", gemm_gflops=gemm_flops_per_second / 1e9)
    record("flow-inference-cpu", "flowcore", roofline_fraction=roofline / median)


@pytest.mark.benchmark(group="flow-inference-cpu")
def test_inference_normflows(benchmark, record, normflows_glow, data):
    def run():
        with torch.inference_mode():
            return normflows_glow.latent(data)

    benchmark.pedantic(run, rounds=4, warmup_rounds=1)
    record("flow-inference-cpu", "normflows")


@pytest.mark.benchmark(group="gemm-roofline-cpu")
def test_gemm_roofline(benchmark, record, data):
    weight = torch.randn(DIM, DIM)
    benchmark.pedantic(lambda: data @ weight, rounds=20, warmup_rounds=3)
    record("gemm-roofline-cpu", f"fp32 GEMM {BATCH}x{DIM}x{DIM}")


def train_step(model, optimizer, data):
    optimizer.zero_grad(set_to_none=True)
    loss = model.bits_per_dim(data)
    loss.backward()
    optimizer.step()
    return loss


@pytest.mark.benchmark(group="flow-train-step-cpu")
def test_train_step_flowcore(benchmark, record, flowcore_glow, data):
    flowcore_glow.train()
    optimizer = torch.optim.Adam(flowcore_glow.parameters(), lr=1e-5)
    benchmark.pedantic(train_step, args=(flowcore_glow, optimizer, data), rounds=4, warmup_rounds=1)
    record("flow-train-step-cpu", "flowcore")
    flowcore_glow.eval()


@pytest.mark.benchmark(group="flow-train-step-cpu")
def test_train_step_normflows(benchmark, record, normflows_glow, data):
    optimizer = torch.optim.Adam(normflows_glow.parameters(), lr=1e-5)
    benchmark.pedantic(train_step, args=(normflows_glow, optimizer, data), rounds=3, warmup_rounds=1)
    record("flow-train-step-cpu", "normflows")
