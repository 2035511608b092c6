"""Capture every tensor a torch callable computes, with no instrumentation in the callable.

A ``TorchFunctionMode`` sees each torch function and tensor method the code calls (``F.linear``,
``@``, ``view``, ``masked_fill_``, ``softmax``) and records its output with the user's line; module
forward hooks give each value its module path; parameters and buffers read in forward are leaves
named as in the module's ``state_dict``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from parity_tests.locate import expand as fused
from parity_tests.locate.trace import Raised, Trace, cotangent_for, model_stack, split_result

__all__ = ["capture_torch", "torch_module_of"]

_DROPOUTS = ("dropout", "dropout_", "feature_dropout", "alpha_dropout")  # their keep-masks are recorded


def torch_module_of(fn: Any) -> Any:
    """The ``nn.Module`` behind ``fn`` (itself, a ``functools.partial`` of it, a bound ``forward``),
    or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for candidate in (fn, getattr(fn, "func", None), getattr(fn, "__self__", None)):
        if isinstance(candidate, torch.nn.Module):
            return candidate
    return None


def _user_stack() -> tuple[tuple[str, str], ...]:
    """The user's frames calling the current op, innermost first (or the model code's, for a
    reference from an installed package: ``model_stack``)."""
    frames, frame = [], sys._getframe(2)
    while frame is not None:
        # the qualified name: two modules' ``forward`` in one file are two functions
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_qualname))
        frame = frame.f_back
    return model_stack(frames)


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _numpy(tensor: Any) -> Any:
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype in (torch.bfloat16, torch.float16):  # NumPy has no bfloat16
        tensor = tensor.float()
    return tensor.numpy()


def _opened(mode: Any, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s one function) with
    ``mode`` on inside it, so that its steps (in-projection, scores, softmax, context,
    out-projection) are recorded one by one instead of as one opaque op: its own
    ``has_torch_function`` check, which would hand the whole call to ``mode`` again, answers
    False for the call. It computes the attention weights even when not asked for them (its
    explicit path rather than one fused ``scaled_dot_product_attention``), and returns None
    for them then, as asked."""
    import torch.nn.functional as F

    asked = kwargs.get("need_weights", True)
    if not (kwargs.get("is_causal") and kwargs.get("attn_mask") is None):  # that path needs a mask
        kwargs = {**kwargs, "need_weights": True}
    check = F.has_torch_function
    F.has_torch_function = lambda *_args: False
    try:
        with mode:
            output, weights = func(*args, **kwargs)
    finally:
        F.has_torch_function = check
    return output, weights if asked else None


def capture_torch(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], gradient_seed: int | None = None
) -> Trace:
    """Run ``fn(*args, **kwargs)`` (tensors in, under ``torch.no_grad`` unless differentiating)
    recording every tensor it computes; the trace's leaves ``input0``, ``input1``... are the
    positional tensor arguments (a dict of tensors, the weights, gives one leaf per key), its
    ``output`` the record of the output (see ``split_result``), its ``steps`` those the code
    recorded.

    Each dropout that drops (train mode) adds its keep-mask to ``trace.keep_masks`` (True = kept:
    the same draw, from the same generator state, on a tensor of ones) and its rate ``p`` to
    ``trace.drop_rates`` (None where the call gives none).

    With ``gradient_seed``, autograd runs too (floating inputs require grad) and a tensor hook on
    every recorded value fills ``trace.cotangents`` for the loss ``sum(output * cotangent)``
    (``cotangent_for``); a hook placed before an in-place update sees the value before it. An
    exception ``fn`` raises comes as ``Raised``, with the tensors recorded before it."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    from parity_tests.locate.run import returned_framework

    trace = Trace("torch")
    produced: dict[int, int] = {}  # id(tensor) -> record index
    alive: list[Any] = []  # keeps every recorded tensor alive so that ids stay unique
    module = torch_module_of(fn)
    names: dict[int, str] = {}
    module_names: dict[int, str] = {}
    if module is not None:
        names = {id(t): n for n, t in [*module.named_parameters(), *module.named_buffers()]}
        module_names = {id(m): n for n, m in module.named_modules()}
    module_stack: list[str] = []

    def index_of(tensor: Any) -> int:
        key = id(tensor)
        if key not in produced:
            leaf = names.get(key, "constant")
            produced[key] = trace.add(
                "leaf",
                _numpy(tensor),
                _dtype(tensor),
                "?",
                leaf=leaf,
                stack=_user_stack(),
                copy=leaf == "constant",
            )  # a weight is read, not updated: no copy
            alive.append(tensor)
            hook(produced[key], tensor)
        return produced[key]

    differentiate = gradient_seed is not None
    hooked: list[tuple[int, Any]] = []  # (record index, tensor) whose cotangent autograd gives

    def keep(index: int, grad: Any) -> None:
        if grad is not None:  # None: an undefined gradient, zero
            trace.cotangents[index] = _numpy(grad)

    def hook(index: int, tensor: Any) -> None:
        if differentiate and tensor.requires_grad and tensor.is_floating_point():
            if tensor.grad_fn is None:
                hooked.append((index, tensor))  # a leaf: its gradient comes from autograd.grad
            else:  # zeros unless autograd reaches it
                trace.cotangents[index] = np.zeros(trace.records[index].shape, np.float32)
                tensor.register_hook(functools.partial(keep, index))

    for position, arg in enumerate(args):
        for key, value in arg.items() if isinstance(arg, dict) else ():
            if isinstance(value, torch.Tensor):
                names[id(value)] = key
                if differentiate and value.is_floating_point():
                    value.requires_grad_(True)
        if isinstance(arg, torch.Tensor):
            if differentiate and arg.is_floating_point():
                arg.requires_grad_(True)
            produced[id(arg)] = trace.add("input", _numpy(arg), _dtype(arg), "input", leaf=f"input{position}")
            alive.append(arg)
            hook(produced[id(arg)], arg)

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.multi_head_attention_forward:
                return _opened(self, func, args, kwargs)
            name = getattr(func, "__name__", str(func))
            keep = None
            if name in _DROPOUTS and args and isinstance(args[0], torch.Tensor):
                before = torch.random.get_rng_state()
                result = func(*args, **kwargs)
                after = torch.random.get_rng_state()
                torch.random.set_rng_state(before)  # the same draw on ones is the keep-mask
                with torch.no_grad():
                    keep = func(torch.ones_like(args[0]), *args[1:], **kwargs).cpu().numpy() != 0
                torch.random.set_rng_state(after)
            else:
                result = func(*args, **kwargs)
            inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            if name == "__setitem__":
                outputs = inputs[:1]
            in_place = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
            input_ids = {id(t) for t in inputs}
            keywords = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float))}  # scale=
            sources = tuple(index_of(t) for t in inputs)
            if keep is not None and outputs and outputs[0] is not inputs[0]:  # it dropped (train mode)
                trace.keep_masks.append(keep)  # a record too: the candidate's injected mask matches it
                rate = kwargs.get("p", args[1] if len(args) > 1 else None)  # F.dropout's p=, torch.dropout's
                trace.drop_rates.append(float(rate) if isinstance(rate, (int, float)) else None)
                module = module_stack[-1] if module_stack else None
                mask = trace.add("keep_mask", keep, "bool", "?", sources[:1], module, stack=_user_stack())
                sources = (*sources, mask)
            for tensor in outputs:
                if id(tensor) in input_ids and not in_place:
                    continue  # an alias of an input (contiguous() of a contiguous tensor)
                produced[id(tensor)] = trace.add(
                    name,
                    _numpy(tensor),
                    _dtype(tensor),
                    "?",
                    sources,
                    module_stack[-1] if module_stack else None,
                    stack=_user_stack(),
                    keywords=keywords,
                )
                alive.append(tensor)
                hook(produced[id(tensor)], tensor)
            if name in fused.EXPANDED and len(outputs) == 1 and id(outputs[0]) in produced:
                expand(name, produced[id(outputs[0])], inputs, sources, args, kwargs)
            return result

    def expand(name, op, inputs, sources, args, kwargs) -> None:
        """The steps of fused operation ``name`` (record ``op``): values of the trace feeding nothing."""
        tensors = [_numpy(t) for t in inputs]  # in their own precision: a float32 product as torch's
        record = trace.records[op]
        for step, value, of in fused.steps(name, tensors, args, kwargs):
            index = trace.add(
                f"{name}: {step}", value.astype(record.value.dtype), record.dtype, "?",
                tuple(sources[i] for i in of), record.module, stack=record.stack,
            )  # fmt: skip
            trace.records[index].expands = op

    def enter(mod, _inputs):
        module_stack.append(module_names.get(id(mod), type(mod).__name__))

    def leave(mod, _inputs, _output):
        module_stack.pop()

    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        with torch.set_grad_enabled(differentiate), Recorder():
            result = fn(*args, **kwargs)
    except BaseException as error:  # an exit too: the port failed at its line
        raise Raised(error, trace) from error
    finally:
        for handle in handles:
            handle.remove()
    output, steps = split_result(result)
    trace.returned = returned_framework(output)
    if not isinstance(output, torch.Tensor):
        output = torch.as_tensor(np.asarray(output))
    trace.output = index_of(output)
    if differentiate and output.requires_grad:
        cotangent = torch.from_numpy(cotangent_for(output, gradient_seed)).to(output.dtype)
        leaves = [tensor for _, tensor in hooked]
        grads = torch.autograd.grad(output, leaves, cotangent, allow_unused=True, materialize_grads=True)
        trace.cotangents.update((index, _numpy(g)) for (index, _), g in zip(hooked, grads, strict=True))
    trace.name_steps({k: v for k, v in steps.items() if k != "output"})
    return trace
