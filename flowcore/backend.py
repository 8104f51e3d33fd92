"""The public face of the backend choice (`flowcore.kernels.dispatch`): `use_backend`,
`set_backend`, `get_backend`, `BackendUnavailableError`.

Example:
    >>> with flowcore.use_backend("torch"):   # plain PyTorch ops, even on a GPU
    ...     z, logdet = glow(x)
"""
from flowcore.kernels.dispatch import (
    BACKENDS,
    ENV_VAR,
    HAS_TRITON,
    BackendUnavailableError,
    get_backend,
    set_backend,
    use_backend,
)

__all__ = ["BACKENDS", "ENV_VAR", "HAS_TRITON", "BackendUnavailableError", "get_backend", "set_backend",
           "use_backend"]
