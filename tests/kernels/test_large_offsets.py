"""Offsets past 2**31 elements: rows far apart in one storage (a last row starting past element
2**31, as in a batch of 2.8 M rows at d = 768) are read and written where they are. With 32-bit
offsets they wrapped and the kernels read outside the tensor (the interpreter segfaulted). The
storage is 8 GiB of address space of which only a few pages are touched; a subprocess keeps a
crash a test failure."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import torch
    from flowcore.kernels import Plan, StepParameters, actnorm_ref, couple_ref, folded_step_ref

    d = 256
    stride = 2**30 + 512  # the last row starts past 2**31 elements
    storage = torch.empty(2 * stride + 3 * d, dtype=torch.float32)  # 8 GiB of address space, a few pages touched
    x = storage.as_strided((3, d), (stride, 1))
    x.copy_(torch.randn(3, d))
    h = storage[d:].as_strided((3, 2 * d), (stride, 1))  # beside x in each row (disjoint: stride > 3d)
    h.copy_(torch.randn(3, 2 * d))
    loc, logs = torch.randn(d), 0.3 * torch.randn(d)
    weight, bias = torch.randn(d, d) / 16, torch.randn(d)
    net = torch.nn.Sequential(torch.nn.Linear(d // 2, 8), torch.nn.ReLU(), torch.nn.Linear(8, d))
    triton = Plan("triton")
    with torch.no_grad():
        results = {"actnorm": (triton.actnorm(x, loc, logs), actnorm_ref(x, loc, logs)),
                   "step": (triton.folded_step(x, weight, bias, d // 2, net),
                            folded_step_ref(x, weight, bias, d // 2, net)),
                   "affine_coupling": (triton.couple(x[:, : d // 2], h[:, :d]), couple_ref(x[:, : d // 2], h[:, :d]))}
    for name, (out, ref) in results.items():
        for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    print("ok", sorted(results))
    """
)


def test_kernels_index_rows_past_two_to_the_31_elements():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "ok ['actnorm', 'affine_coupling', 'step']" in result.stdout
