"""Fault tests: the hypothesis profiles (fixed seed and few examples in CI, many with
FLOWCORE_FUZZ=long; docs/faults.md) and the flow every test calibrates with."""
import os

import pytest
from faults_support import fitted_flow
from hypothesis import HealthCheck, settings

_SHARED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                       HealthCheck.data_too_large], print_blob=True)
settings.register_profile("ci", derandomize=True, max_examples=int(os.environ.get("FLOWCORE_FUZZ_EXAMPLES", 25)),
                          database=None, **_SHARED)
settings.register_profile("long", max_examples=int(os.environ.get("FLOWCORE_FUZZ_EXAMPLES", 2000)), **_SHARED)
settings.load_profile(os.environ.get("FLOWCORE_FUZZ", "ci"))


@pytest.fixture(scope="session")
def flow_path(tmp_path_factory):
    """A small flow fitted on random 8-wide vectors."""
    return fitted_flow(tmp_path_factory.mktemp("flow"))
