"""The peers the benchmarks compare against, built the way their own users build them."""
import copy
import math
import time

import normflows as nf
import torch


class NormflowsGlow(torch.nn.Module):
    """flowcore's multi-scale Glow from normflows parts: per level `depth` x (ActNorm,
    LULinearPermute, AffineCouplingBlock with MLP [d/2, width, width, d], sigmoid scale); half of
    the features leave after each level but the last. normflows maps latent -> data in `forward`,
    so the data -> latent direction is `inverse`; `cache(True)` switches on its LU weight cache
    (what its users do in eval)."""

    def __init__(self, dim: int, levels: int = 2, depth: int = 3, width: int = 32):
        super().__init__()
        self.dim, self.levels = dim, torch.nn.ModuleList()
        for level in range(levels):
            d = dim // 2**level
            steps = []
            for _ in range(depth):
                steps += [
                    nf.flows.AffineCouplingBlock(nf.nets.MLP([d // 2, width, width, d], init_zeros=True),
                                                 scale_map="sigmoid"),
                    nf.flows.LULinearPermute(d),
                    nf.flows.ActNorm((d,)),
                ]
            self.levels.append(torch.nn.ModuleList(steps))

    def cache(self, enabled: bool) -> "NormflowsGlow":
        """normflows' (nflows') LU weight cache: W and its inverse computed once, reused in eval."""
        for module in self.modules():
            if isinstance(module, nf.flows.mixing._LULinear):
                module.use_cache(enabled)
        return self

    def latent(self, x):
        logdet = x.new_zeros(x.shape[0])
        leaving = []
        for index, steps in enumerate(self.levels):
            for flow in reversed(steps):
                x, step_logdet = flow.inverse(x)
                logdet = logdet + step_logdet
            if index + 1 < len(self.levels):
                keep = x.shape[1] // 2
                leaving.append(x[:, keep:])
                x = x[:, :keep]
        return torch.cat([x, *reversed(leaving)], 1), logdet

    def bits_per_dim(self, x):
        z, logdet = self.latent(x)
        log_prob = -0.5 * (z * z).sum(1) - 0.5 * self.dim * math.log(2 * math.pi) + logdet
        return -log_prob.mean() / (self.dim * math.log(2.0))


def compiled(model: torch.nn.Module, method: str) -> tuple:
    """(a copy of `model` whose `method` runs under `torch.compile`, that copy): what a normflows user
    tries first for speed, the default inductor backend with static shapes (one batch size is timed).
    The copy keeps the original's state; the first call at a shape compiles (`first_call_seconds`)."""
    twin = copy.deepcopy(model)
    return torch.compile(getattr(twin, method), dynamic=False), twin


def first_call_seconds(call) -> float:
    """Seconds of the first call of a compiled function: the compilation and one run."""
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def fit_normflows(model: NormflowsGlow, X: torch.Tensor, batch_size: int = 32, lr: float = 1e-3, seed: int = 0,
                  init_rows: int = 1024, step_times: list | None = None) -> float:
    """The paper-setting loop a normflows user writes: ActNorm's data-dependent start on the first
    `init_rows` shuffled rows, then one epoch of Adam (torch's default implementation) on shuffled
    batches. Returns the epoch's mean loss; `step_times` collects each step's seconds."""
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.latent(X[order[:max(batch_size, init_rows)]])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    total = 0.0
    for start in range(0, len(X), batch_size):
        began = time.perf_counter()
        batch = X[order[start:start + batch_size]]
        loss = model.bits_per_dim(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(batch)
        if step_times is not None:
            step_times.append(time.perf_counter() - began)
    return total / len(X)


class NflowsGlow(torch.nn.Module):
    """The same multi-scale Glow from nflows transforms (data -> noise is nflows' `forward`): per
    level `depth` x (ActNorm, RandomPermutation + LULinear, AffineCouplingTransform on the second
    half with the MLP [d/2, width, width, d], last layer zero); `cache(True)` switches on
    LULinear's weight cache, as nflows users do in eval."""

    def __init__(self, dim: int, levels: int = 2, depth: int = 3, width: int = 32):
        from nflows import transforms

        super().__init__()
        self.dim, self.levels = dim, torch.nn.ModuleList()
        for level in range(levels):
            d = dim // 2**level
            mask = torch.cat([-torch.ones(d // 2), torch.ones(d - d // 2)])
            steps = []
            for _ in range(depth):
                steps += [transforms.ActNorm(d), transforms.RandomPermutation(d), transforms.LULinear(d),
                          transforms.AffineCouplingTransform(mask, _coupling_net(width))]
            self.levels.append(transforms.CompositeTransform(steps))

    def cache(self, enabled: bool) -> "NflowsGlow":
        from nflows.transforms import LULinear

        for module in self.modules():
            if isinstance(module, LULinear):
                module.use_cache(enabled)
        return self

    def latent(self, x):
        logdet = x.new_zeros(x.shape[0])
        leaving = []
        for index, level in enumerate(self.levels):
            x, level_logdet = level(x)
            logdet = logdet + level_logdet
            if index + 1 < len(self.levels):
                keep = x.shape[1] // 2
                leaving.append(x[:, keep:])
                x = x[:, :keep]
        return torch.cat([x, *reversed(leaving)], 1), logdet


class _CouplingNet(torch.nn.Module):
    """The coupling MLP [in, width, width, out] (last layer zero), called as nflows calls it."""

    def __init__(self, features_in: int, features_out: int, width: int):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features_in, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, features_out))
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)

    def forward(self, x, context=None):
        return self.net(x)


def _coupling_net(width: int):
    return lambda features_in, features_out: _CouplingNet(features_in, features_out, width)
