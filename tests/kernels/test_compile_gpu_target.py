"""Every Triton kernel variant the launchers use (float32 and bfloat16, with the launchers' own
tile choices) compiles, through Triton's real GPU compiler, to a cubin for an H100/H200
(sm_90) within Hopper's shared memory, its GEMMs on tensor cores (wgmma) -- no GPU needed, so
CI catches kernels that only work in the interpreter or would not launch on the card. Runs in a
subprocess because the kernels must be imported with TRITON_INTERPRET=0."""
import os
import subprocess
import sys
import textwrap

COMPILE_ALL = textwrap.dedent(
    """
    import importlib, os, sys, time
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    HOPPER_SHARED_BYTES = 232448
    TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
    actnorm = importlib.import_module("flowcore.kernels.actnorm")
    linear = importlib.import_module("flowcore.kernels.folded_linear")
    coupling = importlib.import_module("flowcore.kernels.coupling")
    step = importlib.import_module("flowcore.kernels.flow_step")
    utils = importlib.import_module("flowcore.kernels._utils")


    def tiles(blocks):
        block_b, block_d = blocks
        return {"BLOCK_B": block_b, "BLOCK_D": block_d}, {}


    def gemm(blocks):
        block_b, block_n, block_k, options = blocks
        return {"BLOCK_B": block_b, "BLOCK_N": block_n, "BLOCK_K": block_k}, options


    # (kernel, flag constexprs, block choice of its host launcher for (dtype, d = 768, batch 65536))
    KERNELS = [
        (kernel, {"INVERSE": inverse}, lambda dtype: tiles(utils.actnorm_tiles(768)))
        for kernel in (actnorm._actnorm_fwd_kernel, actnorm._actnorm_bwd_kernel) for inverse in (False, True)
    ] + [
        (linear._linear_fwd_kernel, {}, lambda dtype: gemm(utils.gemm_tiles(dtype, 65536, 768))),
        (linear._linear_bwd_dx_kernel, {}, lambda dtype: gemm(utils.dx_tiles(dtype, 65536, 768))),
    ] + [
        (linear._linear_bwd_dw_kernel, {}, lambda dtype: gemm(utils.dw_tiles(dtype, 65536, 768))),
    ] + [
        (kernel, {"INVERSE": inverse}, lambda dtype: tiles(utils.coupling_tiles(384)))
        for kernel in (coupling._affine_fwd_kernel, coupling._affine_bwd_kernel) for inverse in (False, True)
    ] + [(coupling._additive_kernel, {"SUBTRACT": False}, lambda dtype: tiles(utils.coupling_tiles(384)))] + [
        (step._folded_gemm_kernel, {"COUPLING": c}, lambda dtype: gemm(utils.fused_step_tiles(dtype, 65536, 768)))
        for c in (False, True)
    ]

    def compile_one(kernel, flags, blocks, dtype):
        import torch
        block_constexprs, options = blocks(getattr(torch, dtype))
        fp64 = dtype == "float64"
        constexprs = {**flags, **block_constexprs, "FP64": fp64}
        if "TF32" in kernel.arg_names:
            constexprs["TF32"] = dtype == "float32"
        if "SCALE_OFFSET" in kernel.arg_names:
            constexprs["SCALE_OFFSET"] = coupling.SCALE_OFFSET
        partial = "fp64" if fp64 else "fp32"
        signature = {}
        for arg in kernel.arg_names:
            if arg in constexprs:
                signature[arg] = "constexpr"
            elif arg.endswith("_ptr"):
                signature[arg] = "*" + (partial if arg.startswith("part_") else TYPES[dtype])
            else:
                signature[arg] = "i32"
        indexed = {(kernel.arg_names.index(k),): v for k, v in constexprs.items()}
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=indexed),
                                  target=GPUTarget("cuda", 90, 32), options=options)
        assert compiled.asm["cubin"], kernel
        # Hopper's opt-in shared memory per block: a launch needing more raises OutOfResources
        assert compiled.metadata.shared <= HOPPER_SHARED_BYTES, (kernel.fn.__name__, dtype, compiled.metadata.shared)
        if "BLOCK_K" in block_constexprs and not fp64:  # the GEMMs run on tensor cores (bf16, and fp32 as TF32)
            assert "wgmma" in compiled.asm["ptx"], (kernel.fn.__name__, dtype)

    count = 0
    for kernel, flags, blocks in KERNELS:
        for dtype in sys.argv[1:]:
            compile_one(kernel, flags, blocks, dtype)
            count += 1
    print("compiled", count)
    """
)


def test_every_kernel_compiles_for_sm90():
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_ALL, "float32", "bfloat16"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TRITON_DEFAULT_FP_FUSION": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "compiled 28" in result.stdout
