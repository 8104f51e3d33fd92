"""Every probe of torch internals flowcore relies on, in one place, so that a torch upgrade that
moves one of them breaks here and nowhere else.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.utils._python_dispatch import _get_current_dispatch_mode


def functorch_transforms_active() -> bool:
    """True inside `torch.func` transforms (grad, vmap, jacrev, ...)."""
    return torch._C._are_functorch_transforms_active()


def composed_autograd_only(tensor: torch.Tensor) -> bool:
    """True inside `torch.func` transforms and under autocast for the tensor's device: there the
    custom autograd Functions give way to composed PyTorch ops, which those know how to handle."""
    return functorch_transforms_active() or torch.is_autocast_enabled(tensor.device.type)


def composed_backward(outputs, inputs, needs_input_grad, grads) -> tuple:
    """A custom Function's backward under create_graph=True: gradients of `outputs` (recomputed
    from composed ops) w.r.t. the `inputs` flagged in `needs_input_grad` (None for the others),
    with a graph, so that higher-order gradients are exact."""
    wanted = [t for t, needed in zip(inputs, needs_input_grad) if needed]
    computed = iter(torch.autograd.grad(outputs, wanted, grads, create_graph=True, allow_unused=True))
    return tuple(next(computed) if needed else None for needed in needs_input_grad)


def version_key(tensors) -> tuple:
    """A key that changes whenever one of `tensors` is replaced or updated in place (autograd's
    version counter), so caches built from them know when to rebuild."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def relu_backward(grad: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """grad where the ReLU's `output` is positive, else 0 (one pass, as autograd's own)."""
    return torch.ops.aten.threshold_backward(grad, output, 0)


def has_forward_hooks(module: nn.Module, recurse: bool = True) -> bool:
    """Forward (pre-)hooks on `module`, on its children (unless `recurse=False`), or registered
    globally for all modules (`torch.nn.modules.module.register_module_forward_hook`)."""
    if _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks:
        return True
    modules = module.modules() if recurse else (module,)
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def plain_tensors(args) -> bool:
    """True when no torch.compile/export traces a call with `args` and its tensors are plain
    (no fake or functional tensors, no subclasses)."""
    if torch.compiler.is_compiling():
        return False
    return all(type(a) in (torch.Tensor, nn.Parameter) for a in args if isinstance(a, torch.Tensor))


def plain_eager(args) -> bool:
    """`plain_tensors(args)` and no TorchDispatchMode intercepting the call either, so a custom
    op's implementation may run directly, without the dispatcher."""
    return plain_tensors(args) and _get_current_dispatch_mode() is None  # compiling first: Dynamo can't trace the mode
