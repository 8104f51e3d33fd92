"""Compile every Triton kernel variant the library launches on an H100/H200, for sm_90, with
Triton's real compiler, on a machine without a GPU; report and check what each one needs.

    python tests/helpers/sm90_compile.py [--jobs N] [--json FILE]

How: with TRITON_INTERPRET=0 and a stand-in CUDA driver that reports an sm_90 device, the
library's own entry points (the Triton plan's steps of every kind in training and inference, its
inverses and its elementwise ops, forward and backward) run on CPU tensors with the GPU tile tables
and an H200's 132 SMs. Each kernel launch goes through Triton's own argument binder, so it is specialised exactly
as a real launch would be (`== 1` constexprs, divisibility by 16 of sizes, strides and
pointers), and is then compiled without launching (`warmup`). Outputs are never written, so the
numbers flowing through are junk; only the launches matter. Cases: float32 under TF32, bfloat16
and float16, at an aligned (4096 x 768) and an awkward (1 or 1003 rows x 383) shape.

Checks (exit status 1 and the offending variants on failure):
- shared memory per program within Hopper's opt-in limit, 232,448 B (a launch needing more
  raises OutOfResources);
- the GEMMs on tensor cores: `wgmma` in the PTX of every GEMM kernel;
- no register spills (`ptxas -v`) in any variant.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

HOPPER_SHARED_BYTES = 232448
H200_SMS = 132
CASES = [  # (dtype, float32 matmul precision, [(rows, d), ...])
    ("float32", "high", [(4096, 768), (1, 383)]),
    ("bfloat16", "highest", [(4096, 768), (1003, 383)]),
    ("float16", "highest", [(1003, 383)]),
]
GEMM_KERNELS = {"_folded_gemm_kernel"}


class _Sm90Driver:
    """The parts of Triton's CUDA driver a launch asks for before it compiles."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def is_active(self):
        return True


def _ptxas_report(ptx: str) -> dict:
    """Registers and spill bytes from `ptxas -v` (Triton's bundled ptxas)."""
    import triton.backends.nvidia.compiler as nvidia
    try:
        ptxas = nvidia.get_ptxas(90).path
    except TypeError:  # Triton 3.6: get_ptxas() takes no architecture
        ptxas = nvidia.get_ptxas().path
    arch = re.search(r"\.target (\S+)", ptx).group(1)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as stream:
        stream.write(ptx)
    try:
        report = subprocess.run([ptxas, "-v", f"--gpu-name={arch}", stream.name, "-o", os.devnull],
                                capture_output=True, text=True, check=True).stderr
    finally:
        os.unlink(stream.name)
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_bytes": int(spills.group(1)) + int(spills.group(2)) if spills else 0}


def _run_entry_points(dtype_name: str, precision: str, shapes) -> None:
    """Every Triton launch the library makes for this dtype at these shapes, forward and backward."""
    import torch
    from torch import nn

    from flowcore.kernels import Plan, StepParameters

    torch.set_float32_matmul_precision(precision)
    dtype = getattr(torch, dtype_name)
    triton = Plan("triton")
    for rows, d in shapes:
        split = d // 2
        x = torch.randn(rows, d).to(dtype).requires_grad_()
        loc, logs = torch.randn(d).to(dtype).requires_grad_(), torch.randn(d).to(dtype).requires_grad_()
        lu, log_s = torch.randn(d, d).to(dtype).requires_grad_(), torch.randn(d).to(dtype).requires_grad_()
        lu_tensors = (lu, log_s, torch.ones(d, dtype=dtype), torch.randperm(d))
        for coupling, width in (("affine", 2 * (d - split)), ("additive", d - split)):
            net = nn.Sequential(nn.Linear(split, 64), nn.ReLU(), nn.Linear(64, width)).to(dtype)
            for mixing in (lu_tensors, (None,) * 4):  # the LU 1x1, the reversal
                p = StepParameters(loc, logs, *mixing, split, net, coupling)
                z, logdet = triton.step(x, p)  # the training step
                torch.autograd.grad(triton.squared_norm(z).sum() - logdet.sum(), [x, loc])  # a Glow's loss
                with torch.no_grad():
                    triton.step(x, p)  # the inference step
            # the inverse launches the same kernels with either 1x1 (the LU's solves are torch's, without
            # a 16-bit CPU kernel): the reversal's
            back, logdet = triton.inverse(x, p)
            torch.autograd.grad(back.float().sum() + logdet.sum(), [x, loc])


def compile_case(case) -> list[dict]:
    """Compile the variants of one (dtype, precision, shapes) case; one report per variant."""
    dtype_name, precision, shapes = case
    os.environ["TRITON_INTERPRET"] = "0"
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    driver.set_active(_Sm90Driver())
    import flowcore.kernels.triton._utils as kernel_utils

    kernel_utils._sm_count = lambda index: H200_SMS
    kernel_utils.require_launchable = lambda tensor, op: None
    compiled: dict[tuple, dict] = {}
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        key = (self.fn.__name__, kernel.hash if hasattr(kernel, "hash") else id(kernel))
        if key not in compiled:
            compiled[key] = {"kernel": self.fn.__name__, "dtype": dtype_name, "precision": precision,
                             "shared": kernel.metadata.shared, "num_warps": kernel.metadata.num_warps,
                             "wgmma": "wgmma.mma_async" in kernel.asm["ptx"], **_ptxas_report(kernel.asm["ptx"])}
        return kernel

    JITFunction.run = compile_only
    _run_entry_points(dtype_name, precision, shapes)
    return list(compiled.values())


def problems(reports: list[dict]) -> list[str]:
    found = []
    for r in reports:
        name = f"{r['kernel']} ({r['dtype']}, precision {r['precision']})"
        if r["shared"] > HOPPER_SHARED_BYTES:
            found.append(f"{name}: {r['shared']} B of shared memory > {HOPPER_SHARED_BYTES}")
        if r["kernel"] in GEMM_KERNELS and not r["wgmma"]:
            found.append(f"{name}: GEMM without wgmma (not on tensor cores)")
        if r["spill_bytes"]:
            found.append(f"{name}: {r['spill_bytes']} B of register spills ({r['registers']} registers)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=min(len(CASES), os.cpu_count() or 1))
    parser.add_argument("--json", help="write the per-variant reports here")
    args = parser.parse_args(argv)
    with ProcessPoolExecutor(args.jobs) as pool:
        reports = [r for case in pool.map(compile_case, CASES) for r in case]
    import triton
    if args.json:
        with open(args.json, "w") as stream:
            json.dump({"triton": triton.__version__, "variants": reports}, stream, indent=1)
    found = problems(reports)
    kernels = sorted({r["kernel"] for r in reports})
    registers = max(r["registers"] or 0 for r in reports)
    print(f"triton {triton.__version__}: compiled {len(reports)} variants of {len(kernels)} kernels for sm_90; "
          f"max shared {max(r['shared'] for r in reports)} B; max registers {registers}")
    for line in found:
        print("PROBLEM", line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
