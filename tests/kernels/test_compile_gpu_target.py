"""Every Triton kernel variant the library launches on an H100/H200 compiles for sm_90 through
Triton's real compiler, specialised exactly as a real launch would be, within Hopper's shared
memory, with its GEMMs on tensor cores (wgmma) and no register spills -- no GPU needed
(`helpers/sm90_compile.py` says how). Checked with the project's Triton and, when
$FLOWCORE_SECOND_TRITON names a folder holding another Triton (CI installs the GPU machine's
3.6 there), with that one too. Runs in subprocesses: the kernels must be imported with
TRITON_INTERPRET=0."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parents[1]
SECOND_TRITON = os.environ.get("FLOWCORE_SECOND_TRITON")


def _compile_all(tmp_path, extra_path=None) -> dict:
    report = tmp_path / "variants.json"
    path = [str(HELPERS)] + ([extra_path] if extra_path else [])
    env = {**os.environ, "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": os.pathsep.join(path[::-1] + [os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(HELPERS / "helpers" / "sm90_compile.py"), "--json", str(report)],
                            capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return json.loads(report.read_text())


def _assert_covers_the_library(report):
    variants = report["variants"]
    kernels = {v["kernel"] for v in variants}
    assert {"_folded_gemm_kernel", "_affine_fwd_kernel", "_affine_bwd_kernel", "_actnorm_fwd_kernel",
            "_actnorm_bwd_kernel"} <= kernels
    assert {v["dtype"] for v in variants} == {"float32", "bfloat16", "float16"}
    assert all(v["shared"] <= 232448 and v["spill_bytes"] == 0 for v in variants)


def test_every_launched_variant_compiles_for_sm90(tmp_path):
    _assert_covers_the_library(_compile_all(tmp_path))


@pytest.mark.skipif(not SECOND_TRITON, reason="FLOWCORE_SECOND_TRITON (a folder with another Triton) is not set")
def test_every_launched_variant_compiles_for_sm90_with_the_second_triton(tmp_path):
    report = _compile_all(tmp_path, SECOND_TRITON)
    import triton
    assert report["triton"] != triton.__version__, "the second Triton was not the one imported"
    _assert_covers_the_library(report)
