"""Invertible linear ("1x1") map z = x @ W.T with the step's ActNorm fused in, and its LU inverse.

- `actnorm_linear(x, loc, logs, weight)`: z = ((x + loc) * exp(logs)) @ weight.T (training path;
  gradients reach x, loc, logs and weight, and from weight autograd reaches L, U, log_s).
- `folded_linear(x, weight, bias)`: z = x @ weight.T + bias (eval path, ActNorm folded in).
- `lu_inverse(z, perm, lower, upper)`: x with z = x @ W.T, W = P @ lower @ upper, where
  `W[i] = (lower @ upper)[perm[i]]`, `lower` unit lower-triangular, `upper` upper-triangular
  with the diagonal; two triangular solves, never an explicit inverse. It always runs on
  PyTorch (cuBLAS/LAPACK triangular solves): it is off the training and calibration hot path.
The log-det, sum(log_s), needs no kernel.

Triton path (x: (B, K) any strides; weight (N, K), bias/loc/logs vectors, any strides; outputs
contiguous in x's dtype; float64 computes in float64, everything else accumulates in float32;
float32 GEMMs use TF32 only when `torch.get_float32_matmul_precision()` allows it):
- forward: one GEMM whose prologue applies the ActNorm to each x tile as it is loaded (the
  normalized activations never touch memory) and whose epilogue adds the bias;
- backward: a dx GEMM (dz @ W) whose epilogue scales by exp(logs) and writes per-program
  partial column sums for dloc and dlogs, and a split-over-batch dW GEMM (dz.T @ actnorm(x))
  writing one float32 partial per split; partials are summed in a fixed order afterwards
  (deterministic, no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from flowcore.backend import resolve
from flowcore.kernels import _launch


def actnorm_linear_ref(x, loc, logs, weight):
    return ((x + loc) * torch.exp(logs)) @ weight.T


def folded_linear_ref(x, weight, bias):
    return torch.addmm(bias, x, weight.T)


def lu_inverse_ref(z, perm, lower, upper):
    inverse_perm = torch.argsort(perm)
    y = z[:, inverse_perm]
    # x (L U)^T = y  <=>  (x U^T) L^T = y: solve against L^T (upper, unit), then U^T (lower).
    y = torch.linalg.solve_triangular(lower.T, y, upper=True, left=False, unitriangular=True)
    return torch.linalg.solve_triangular(upper.T, y, upper=False, left=False)


@triton.jit
def _load_actnorm_tile(
    x_ptr, loc_ptr, logs_ptr, rows, ks, B, K, stride_xb, stride_xk, stride_loc, stride_logs,
    HAS_ACTNORM: tl.constexpr, compute: tl.constexpr,
):
    """x[rows, ks], with (x + loc) * exp(logs) applied when HAS_ACTNORM; zero outside the matrix."""
    k_ok = ks < K
    mask = (rows[:, None] < B) & k_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :] * stride_xk, mask=mask, other=0.0)
    if HAS_ACTNORM:
        loc = tl.load(loc_ptr + ks * stride_loc, mask=k_ok, other=0.0).to(compute)
        logs = tl.load(logs_ptr + ks * stride_logs, mask=k_ok, other=0.0).to(compute)
        x = (x.to(compute) + loc[None, :]) * tl.exp(logs)[None, :]
        x = tl.where(mask, x, 0.0)
    return x


@triton.jit
def _linear_fwd_kernel(
    x_ptr, loc_ptr, logs_ptr, w_ptr, bias_ptr, z_ptr,
    B, N, K, stride_xb, stride_xk, stride_loc, stride_logs, stride_wn, stride_wk, stride_bias,
    HAS_ACTNORM: tl.constexpr, HAS_BIAS: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """z[rows, ns] = actnorm(x)[rows, :] @ W[ns, :].T (+ bias[ns]). Column blocks of one row
    block are neighbouring programs, so each x tile is read from DRAM once."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = x_ptr.dtype.element_ty
    col_blocks = tl.cdiv(N, BLOCK_N)
    rows = (tl.program_id(0) // col_blocks) * BLOCK_B + tl.arange(0, BLOCK_B)
    ns = (tl.program_id(0) % col_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=compute)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = _load_actnorm_tile(x_ptr, loc_ptr, logs_ptr, rows, ks, B, K, stride_xb, stride_xk,
                               stride_loc, stride_logs, HAS_ACTNORM, compute)
        w = tl.load(w_ptr + ns[None, :] * stride_wn + ks[:, None] * stride_wk,
                    mask=(ns[None, :] < N) & (ks[:, None] < K), other=0.0)
        acc = tl.dot(a.to(operand), w.to(operand), acc, input_precision="tf32" if TF32 else "ieee",
                     out_dtype=compute)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + ns * stride_bias, mask=ns < N, other=0.0).to(compute)[None, :]
    mask = (rows[:, None] < B) & (ns[None, :] < N)
    tl.store(z_ptr + rows[:, None] * N + ns[None, :], acc.to(z_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_bwd_dx_kernel(
    dz_ptr, w_ptr, x_ptr, loc_ptr, logs_ptr, dx_ptr, part_loc_ptr, part_logs_ptr,
    B, N, K, stride_db, stride_dn, stride_wn, stride_wk, stride_xb, stride_xk, stride_loc, stride_logs,
    HAS_ACTNORM: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """dx[rows, ks] = (dz[rows, :] @ W[:, ks]) * exp(logs[ks]); with the ActNorm, also this row
    block's column sums of dx (-> dloc) and dx * (x + loc) (-> dlogs)."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = dz_ptr.dtype.element_ty
    k_blocks = tl.cdiv(K, BLOCK_K)
    row_block = tl.program_id(0) // k_blocks
    rows = row_block * BLOCK_B + tl.arange(0, BLOCK_B)
    ks = (tl.program_id(0) % k_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < K
    acc = tl.zeros((BLOCK_B, BLOCK_K), dtype=compute)
    for n0 in range(0, N, BLOCK_N):
        ns = n0 + tl.arange(0, BLOCK_N)
        dz = tl.load(dz_ptr + rows[:, None] * stride_db + ns[None, :] * stride_dn,
                     mask=(rows[:, None] < B) & (ns[None, :] < N), other=0.0)
        w = tl.load(w_ptr + ns[:, None] * stride_wn + ks[None, :] * stride_wk,
                    mask=(ns[:, None] < N) & k_ok[None, :], other=0.0)
        acc = tl.dot(dz.to(operand), w.to(operand), acc, input_precision="tf32" if TF32 else "ieee",
                     out_dtype=compute)
    mask = (rows[:, None] < B) & k_ok[None, :]
    if HAS_ACTNORM:
        loc = tl.load(loc_ptr + ks * stride_loc, mask=k_ok, other=0.0).to(compute)
        logs = tl.load(logs_ptr + ks * stride_logs, mask=k_ok, other=0.0).to(compute)
        acc = acc * tl.exp(logs)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xb + ks[None, :] * stride_xk, mask=mask, other=0.0)
        centred = tl.where(mask, x.to(compute) + loc[None, :], 0.0)
        tl.store(part_loc_ptr + row_block * K + ks, tl.sum(acc, axis=0), mask=k_ok)
        tl.store(part_logs_ptr + row_block * K + ks, tl.sum(acc * centred, axis=0), mask=k_ok)
    tl.store(dx_ptr + rows[:, None] * K + ks[None, :], acc.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_bwd_dw_kernel(
    dz_ptr, x_ptr, loc_ptr, logs_ptr, part_dw_ptr, part_db_ptr,
    B, N, K, stride_db, stride_dn, stride_xb, stride_xk, stride_loc, stride_logs,
    HAS_ACTNORM: tl.constexpr, HAS_BIAS: tl.constexpr, FP64: tl.constexpr, TF32: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program (split, tile) sums dz[rows, ns].T @ actnorm(x)[rows, ks] over row blocks
    split, split + splits, ... into its own partial dW (and, for the first k tile, partial db)."""
    compute: tl.constexpr = tl.float64 if FP64 else tl.float32
    operand: tl.constexpr = dz_ptr.dtype.element_ty
    split = tl.program_id(0)
    splits = tl.num_programs(0)
    k_blocks = tl.cdiv(K, BLOCK_K)
    n_block = tl.program_id(1) // k_blocks
    k_block = tl.program_id(1) % k_blocks
    ns = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = k_block * BLOCK_K + tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=compute)
    acc_db = tl.zeros((BLOCK_N, BLOCK_B), dtype=compute)
    for block in range(split, tl.cdiv(B, BLOCK_B), splits):
        rows = block * BLOCK_B + tl.arange(0, BLOCK_B)
        dz_t = tl.load(dz_ptr + ns[:, None] * stride_dn + rows[None, :] * stride_db,
                       mask=(ns[:, None] < N) & (rows[None, :] < B), other=0.0)
        a = _load_actnorm_tile(x_ptr, loc_ptr, logs_ptr, rows, ks, B, K, stride_xb, stride_xk,
                               stride_loc, stride_logs, HAS_ACTNORM, compute)
        acc = tl.dot(dz_t.to(operand), a.to(operand), acc, input_precision="tf32" if TF32 else "ieee",
                     out_dtype=compute)
        if HAS_BIAS:
            acc_db += dz_t.to(compute)
    mask = (ns[:, None] < N) & (ks[None, :] < K)
    tl.store(part_dw_ptr + split * N * K + ns[:, None] * K + ks[None, :], acc, mask=mask)
    if HAS_BIAS:
        db_columns = tl.where(k_block == 0, N, 0)  # only the first k tile writes db
        tl.store(part_db_ptr + split * N + ns, tl.sum(acc_db, axis=1), mask=ns < db_columns)


def _interpreter_blocks(B: int, D: int) -> tuple[int, int, int, dict]:
    """Few, large tiles (the interpreter pays per program), shrunk to small inputs because its
    dot products cost per padded element."""
    block_b = min(max(triton.next_power_of_2(B), 16), 128)
    block_d = min(max(triton.next_power_of_2(D), 16), 128)
    return block_b, block_d, block_d, {}


def _gemm_blocks(dtype: torch.dtype, B: int, D: int) -> tuple[int, int, int, dict]:
    """(BLOCK_B, BLOCK_N, BLOCK_K, launch options) for the GEMM kernels."""
    if _launch.INTERPRETED:
        return _interpreter_blocks(B, D)
    if dtype == torch.float64:
        return 64, 64, 32, {"num_warps": 4, "num_stages": 2}
    if dtype == torch.float32:
        return 128, 128, 32, {"num_warps": 8, "num_stages": 3}
    return 128, 128, 64, {"num_warps": 8, "num_stages": 3}


def _dw_blocks(dtype: torch.dtype, B: int, D: int) -> tuple[int, int, int, dict]:
    """(BLOCK_B, BLOCK_N, BLOCK_K, launch options) for the split-batch dW kernel."""
    if _launch.INTERPRETED:
        return _interpreter_blocks(B, D)
    if dtype == torch.float64:
        return 32, 64, 64, {"num_warps": 4, "num_stages": 2}
    return 64, 64, 64, {"num_warps": 4, "num_stages": 3}


def _partial_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if _launch.is_fp64(x) else torch.float32


@triton_op("flowcore::linear_fwd", mutates_args=())
def _linear_fwd(
    x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    has_actnorm: bool, has_bias: bool,
) -> torch.Tensor:
    B, K = x.shape
    N = weight.shape[0]
    z = torch.empty((B, N), dtype=x.dtype, device=x.device)
    block_b, block_n, block_k, options = _gemm_blocks(x.dtype, B, max(N, K))
    _launch.record_launch("actnorm_linear" if has_actnorm else "folded_linear")
    grid = (triton.cdiv(B, block_b) * triton.cdiv(N, block_n),)
    wrap_triton(_linear_fwd_kernel)[grid](
        x, loc, logs, weight, bias, z, B, N, K, x.stride(0), x.stride(1), loc.stride(0), logs.stride(0),
        weight.stride(0), weight.stride(1), bias.stride(0),
        HAS_ACTNORM=has_actnorm, HAS_BIAS=has_bias, FP64=_launch.is_fp64(x), TF32=_launch.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return z


@triton_op("flowcore::linear_bwd_dx", mutates_args=())
def _linear_bwd_dx(
    dz: torch.Tensor, weight: torch.Tensor, x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor,
    has_actnorm: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx, and with the ActNorm the per-row-block partial sums for dloc and dlogs."""
    B, K = x.shape
    N = weight.shape[0]
    dx = torch.empty((B, K), dtype=x.dtype, device=x.device)
    block_b, block_n, block_k, options = _gemm_blocks(x.dtype, B, max(N, K))
    row_blocks = triton.cdiv(B, block_b)
    part_rows = row_blocks if has_actnorm else 0
    part_loc = torch.empty((part_rows, K), dtype=_partial_dtype(x), device=x.device)
    part_logs = torch.empty((part_rows, K), dtype=_partial_dtype(x), device=x.device)
    _launch.record_launch("actnorm_linear_backward_dx" if has_actnorm else "folded_linear_backward_dx")
    wrap_triton(_linear_bwd_dx_kernel)[(row_blocks * triton.cdiv(K, block_k),)](
        dz, weight, x, loc, logs, dx, part_loc, part_logs,
        B, N, K, dz.stride(0), dz.stride(1), weight.stride(0), weight.stride(1), x.stride(0), x.stride(1),
        loc.stride(0), logs.stride(0),
        HAS_ACTNORM=has_actnorm, FP64=_launch.is_fp64(x), TF32=_launch.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return dx, part_loc, part_logs


@triton_op("flowcore::linear_bwd_dw", mutates_args=())
def _linear_bwd_dw(
    dz: torch.Tensor, x: torch.Tensor, loc: torch.Tensor, logs: torch.Tensor, has_actnorm: bool, has_bias: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split partials of dW = dz.T @ actnorm(x) and (with a bias) db = dz.sum(0)."""
    B, K = x.shape
    N = dz.shape[1]
    block_b, block_n, block_k, options = _dw_blocks(x.dtype, B, max(N, K))
    tiles = triton.cdiv(N, block_n) * triton.cdiv(K, block_k)
    splits = _launch.row_splits(triton.cdiv(B, block_b), tiles, x.device)
    part_dw = torch.empty((splits, N, K), dtype=_partial_dtype(x), device=x.device)
    part_db = torch.empty((splits if has_bias else 0, N), dtype=_partial_dtype(x), device=x.device)
    _launch.record_launch("actnorm_linear_backward_dw" if has_actnorm else "folded_linear_backward_dw")
    wrap_triton(_linear_bwd_dw_kernel)[(splits, tiles)](
        dz, x, loc, logs, part_dw, part_db,
        B, N, K, dz.stride(0), dz.stride(1), x.stride(0), x.stride(1), loc.stride(0), logs.stride(0),
        HAS_ACTNORM=has_actnorm, HAS_BIAS=has_bias, FP64=_launch.is_fp64(x), TF32=_launch.allow_tf32(x),
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k, **options,
    )
    return part_dw, part_db


class _ActNormLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, loc, logs, weight):
        ctx.save_for_backward(x, loc, logs, weight)
        # No bias here: loc stands in for the bias pointer, which is never read.
        return _linear_fwd(x, loc, logs, weight, loc, True, False)

    @staticmethod
    def backward(ctx, dz):
        x, loc, logs, weight = ctx.saved_tensors
        need_x, need_loc, need_logs, need_w = ctx.needs_input_grad
        dx = dloc = dlogs = dweight = None
        if need_x or need_loc or need_logs:
            dx, part_loc, part_logs = _linear_bwd_dx(dz, weight, x, loc, logs, True)
            dloc = part_loc.sum(dim=0).to(loc.dtype)
            dlogs = part_logs.sum(dim=0).to(logs.dtype)
        if need_w:
            part_dw, _ = _linear_bwd_dw(dz, x, loc, logs, True, False)
            dweight = part_dw.sum(dim=0).to(weight.dtype)
        return dx, dloc, dlogs, dweight


class _FoldedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        # Without the ActNorm the loc/logs pointers are never read: bias stands in for them.
        return _linear_fwd(x, bias, bias, weight, bias, False, True)

    @staticmethod
    def backward(ctx, dz):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dweight = dbias = None
        if need_x:
            dx, _, _ = _linear_bwd_dx(dz, weight, x, bias, bias, False)
        if need_w or need_b:
            part_dw, part_db = _linear_bwd_dw(dz, x, bias, bias, False, True)
            dweight = part_dw.sum(dim=0).to(weight.dtype)
            dbias = part_db.sum(dim=0).to(bias.dtype)
        return dx, dweight, dbias


def _check_linear(op: str, x, weight) -> None:
    _launch.require_matrix(f"{op} input", x)
    _launch.require_matrix(f"{op} weight", weight, x.shape[1])
    _launch.require_launchable(x, op)


def actnorm_linear(x, loc, logs, weight):
    if resolve(x) == "triton":
        _check_linear("actnorm_linear", x, weight)
        _launch.require_vector("actnorm_linear loc", loc, x.shape[1])
        _launch.require_vector("actnorm_linear logs", logs, x.shape[1])
        return _ActNormLinear.apply(x, loc, logs, weight)
    return actnorm_linear_ref(x, loc, logs, weight)


def folded_linear(x, weight, bias):
    if resolve(x) == "triton":
        _check_linear("folded_linear", x, weight)
        _launch.require_vector("folded_linear bias", bias, weight.shape[0])
        return _FoldedLinear.apply(x, weight, bias)
    return folded_linear_ref(x, weight, bias)


def lu_inverse(z, perm, lower, upper):
    return lu_inverse_ref(z, perm, lower, upper)
