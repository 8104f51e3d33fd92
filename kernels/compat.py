"""Every probe of torch internals flowcore relies on, in one place: a torch upgrade that moves one breaks here."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.modules import module as _module_globals
from torch.utils._python_dispatch import _get_current_dispatch_mode


def functorch_transforms_active() -> bool:
    """True inside `torch.func` transforms (grad, vmap, jacrev, ...)."""
    return torch._C._are_functorch_transforms_active()


def composed_autograd_only(tensor: torch.Tensor) -> bool:
    """Inside `torch.func` transforms or under autocast: there the custom Functions give way to composed ops."""
    return functorch_transforms_active() or torch.is_autocast_enabled(tensor.device.type)


def composed_backward(outputs, inputs, needs_input_grad, grads) -> tuple:
    """A custom Function's backward under create_graph=True: gradients, with a graph, of `outputs` (recomputed
    from composed ops) w.r.t. the `inputs` flagged in `needs_input_grad` (None for the others)."""
    wanted = [t for t, needed in zip(inputs, needs_input_grad) if needed]
    computed = iter(torch.autograd.grad(outputs, wanted, grads, create_graph=True, allow_unused=True))
    return tuple(next(computed) if needed else None for needed in needs_input_grad)


def version_key(tensors) -> tuple:
    """A key that changes whenever one of `tensors` is replaced or updated in place (for caches built from them)."""
    return tuple((t.data_ptr(), t._version) for t in tensors)


def relu_backward(grad: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """grad where the ReLU's `output` is positive, else 0 (one pass, as autograd's own)."""
    return torch.ops.aten.threshold_backward(grad, output, 0)


def has_forward_hooks(module: nn.Module, recurse: bool = True) -> bool:
    """Forward (pre-)hooks on `module`, on its children (unless `recurse=False`), or global ones."""
    if _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks:
        return True
    modules = module.modules() if recurse else (module,)
    return any(m._forward_hooks or m._forward_pre_hooks for m in modules)


def plain_tensors(args) -> bool:
    """No torch.compile/export traces a call with `args`, and its tensors are plain (not fake, no subclasses)."""
    if torch.compiler.is_compiling():
        return False
    return all(type(a) in (torch.Tensor, nn.Parameter) for a in args if isinstance(a, torch.Tensor))


def plain_eager(args) -> bool:
    """`plain_tensors(args)` and no TorchDispatchMode either: a custom op's implementation may run directly."""
    return plain_tensors(args) and _get_current_dispatch_mode() is None  # compiling first: Dynamo can't trace the mode
