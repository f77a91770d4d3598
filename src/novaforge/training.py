"""Training, compiled: the whole step in one program.

(Differentiable calls of `novaforge.compile(model)`, AOTAutograd's forward and backward graphs
compiled by novaforge, are `TrainEntry` in train_entry.py.)

* `compile_step(model, optimizer, loss_fn)`: forward, loss, backward (traced through
  `torch.autograd.grad`), gradient clipping by global norm and the optimizer update (AdamW,
  Adam, SGD with momentum, Nesterov and weight decay; `maximize`) as ONE graph, so the passes
  optimize forward, backward and update together (common subexpressions, fusion across the boundary) and the
  whole step is one program. Parameters, optimizer state (`exp_avg`, `exp_avg_sq`, `step`,
  `momentum_buffer`) and the buffers the forward updates (norm layers' running statistics in
  training mode; other buffers are constants) are graph inputs updated in place at the boundary; the
  optimizer's `state_dict()` stays valid both ways (state is created eagerly in torch's own
  format and loaded states are used as they are). The learning rates (one per parameter group)
  are a run-time input (an LR scheduler needs no recompile); other hyperparameters are part of
  the program's guard. Like `optimizer.step()`, an updating call runs the optimizer's step
  post-hooks and sets the flag LR schedulers check; step pre-hooks are refused (they may change
  gradients the program keeps to itself).
  Gradient accumulation (`accumulate=k`): k-1 calls add into gradient buffers, the k-th also
  updates and clears them. `model.train()` / `model.eval()` select a program per state
  (`ModuleModes`), as for `novaforge.compile`. A model with forward / backward hooks (on it or
  a submodule, or global) is stepped per call instead: its forward compiled by
  `novaforge.compile` (through Dynamo, which runs the hooks at every call), then eager's
  `loss.backward(); optimizer.step()`, so that the hooks' side effects happen at every step.
  A model trained with torch.distributed (DDP, FSDP2, tensor parallel: distributed.py) is stepped
  that way too: its collectives run from hooks and DDP's reducer, and the optimizer steps its
  sharded (DTensor) parameters and state eagerly.

Invariant: a compiled step computes exactly what eager's `loss.backward(); optimizer.step()`
computes (torch's single-tensor formulas, in the same order), up to float rounding; the tests
compare 50 steps of losses and the final parameters with eager.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from . import api, logs
from .distributed import distributed_style
from .frontend.capture import shadow_module
from .frontend.lower import COMPOSITES
from .frontend.module_state import ModuleModes

OPTIMIZERS = ("AdamW", "Adam", "SGD")


def _group_ids(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> list[int]:
    """Each parameter's group index in the optimizer (one pass over the groups per step)."""
    where = {id(q): i for i, g in enumerate(optimizer.param_groups) for q in g["params"]}
    if any(id(p) not in where for p in params):
        raise ValueError("a trainable parameter of the model is not in the optimizer")
    return [where[id(p)] for p in params]


def _step_hooks(optimizer: torch.optim.Optimizer) -> tuple[list[Any], list[Any]]:
    """The optimizer's step pre- and post-hooks, global ones first (torch's order)."""
    from torch.optim import optimizer as torch_optimizer
    pre = [*torch_optimizer._global_optimizer_pre_hooks.values(), *optimizer._optimizer_step_pre_hooks.values()]
    post = [*torch_optimizer._global_optimizer_post_hooks.values(), *optimizer._optimizer_step_post_hooks.values()]
    return pre, post


def _hyper(kind: str, group: dict[str, Any]) -> tuple:
    """The hyperparameters a compiled update bakes in (lr is a run-time input)."""
    if kind in ("AdamW", "Adam"):
        if group.get("amsgrad"):
            raise NotImplementedError(f"compile_step: {kind}(amsgrad=True) is not supported yet")
        return (kind, tuple(group["betas"]), group["eps"], group["weight_decay"], bool(group.get("maximize")))
    if group.get("dampening", 0) != 0:
        raise NotImplementedError("compile_step: SGD with dampening is not supported yet")
    return (kind, group.get("momentum", 0.0), group.get("weight_decay", 0.0), bool(group.get("nesterov")),
            bool(group.get("maximize")))


def _step_device(p: torch.Tensor) -> torch.device:
    """Where a parameter's step count lives: on the CPU for CPU parameters (torch's default), on
    the parameter's device otherwise (torch's fused/capturable layout, which its other
    implementations also accept), so one compiled step reads no tensor of another device."""
    return torch.device("cpu") if p.device.type == "cpu" else p.device


def _ensure_state(optimizer: torch.optim.Optimizer, kind: str, params: list[torch.Tensor],
                  group_ids: list[int]) -> list[list[torch.Tensor]]:
    """The optimizer's per-parameter state tensors, created in torch's own layout if absent
    (so `state_dict()` round-trips): AdamW/Adam [step, exp_avg, exp_avg_sq], SGD [momentum]."""
    out = []
    for p, gi in zip(params, group_ids, strict=True):
        st = optimizer.state[p]
        if kind in ("AdamW", "Adam"):
            if "step" not in st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32, device=_step_device(p))
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if not isinstance(st["step"], torch.Tensor) or st["step"].device != _step_device(p):
                st["step"] = torch.tensor(float(st["step"]), dtype=torch.float32, device=_step_device(p))
            out.append([st["step"], st["exp_avg"], st["exp_avg_sq"]])
        else:
            group = optimizer.param_groups[gi]
            if group.get("momentum", 0.0):
                if st.get("momentum_buffer") is None:
                    st["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                out.append([st["momentum_buffer"]])
            else:
                out.append([])
    return out


def _adam_math(p: torch.Tensor, g: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
               step: torch.Tensor, lr: torch.Tensor, beta1: float, beta2: float, eps: float, wd: float,
               adamw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One parameter's Adam(W) update as new values (parameter, exp_avg, exp_avg_sq, step):
    torch.optim's single-tensor formulas, in their order."""
    step = step + 1
    # eager computes these scalars as Python floats; float32 here keeps every kernel generated
    # (float64 is not), and the losses still agree to ~1e-7 relative (tests/test_training.py)
    step_size = lr / (1 - beta1 ** step)
    bias2_sqrt = (1 - beta2 ** step).sqrt()
    if adamw:
        p = p * (1 - lr * wd)
    elif wd:
        g = g + wd * p
    exp_avg = torch.lerp(exp_avg, g, 1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * g * g  # addcmul: self + (value * t1) * t2
    denom = exp_avg_sq.sqrt() / bias2_sqrt + eps
    p = p + (-step_size * exp_avg) / denom  # addcdiv: self + (value * t1) / t2
    return p, exp_avg, exp_avg_sq, step


@torch.library.custom_op("novaforge::adam_update", mutates_args=())
def adam_update(p: torch.Tensor, g: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: torch.Tensor, lr: torch.Tensor, beta1: float, beta2: float, eps: float, wd: float,
                adamw: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_adam_math` as one op: the step's trace records one node per parameter instead of ~20 (AdamW's
    update was about 60% of GPT-42M's compile_step trace); the lowering expands it
    (`lower.COMPOSITES`), tracing `_adam_math` once per parameter shape."""
    return _adam_math(p, g, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd, adamw)


@adam_update.register_fake
def _(p, g, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd, adamw):
    return torch.empty_like(p), torch.empty_like(exp_avg), torch.empty_like(exp_avg_sq), torch.empty_like(step)


COMPOSITES[torch.ops.novaforge.adam_update.default] = _adam_math


def _update(kind: str, hyper: tuple, p: torch.Tensor, g: torch.Tensor, state: list[torch.Tensor],
            lr: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One parameter's update as new values (parameter, state): torch.optim's single-tensor
    formulas, in their order (traced functionally: autograd.grad cannot be functionalized)."""
    if kind in ("AdamW", "Adam"):
        _, (beta1, beta2), eps, wd, maximize = hyper
        step, exp_avg, exp_avg_sq = state
        if maximize:
            g = -g
        p, exp_avg, exp_avg_sq, step = adam_update(p, g, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, wd,
                                                   kind == "AdamW")
        return p, [step, exp_avg, exp_avg_sq]
    _, momentum, wd, nesterov, maximize = hyper
    if maximize:
        g = -g
    if wd:
        g = g + wd * p
    new_state = []
    if momentum:
        buf = state[0] * momentum + g  # the buffer starts at zero: the first step gives g, as torch's clone
        new_state = [buf]
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, new_state


class CompiledStep:
    """`step(*args, **kwargs) -> loss`: see `compile_step`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable[..., Any] | None,
                 *, accumulate: int = 1, clip_grad_norm: float | None = None, backend: str = "auto",
                 **options: Any) -> None:
        kind = type(optimizer).__name__
        if kind not in OPTIMIZERS:
            raise NotImplementedError(f"compile_step supports {', '.join(OPTIMIZERS)}; got {kind} "
                                      "(compile the model with novaforge.compile and step the optimizer in eager)")
        if accumulate < 1:
            raise ValueError("accumulate must be >= 1")
        self.model, self.optimizer, self.loss_fn, self.kind = model, optimizer, loss_fn, kind
        self.accumulate, self.clip = accumulate, clip_grad_norm
        self.backend, self.options = backend, options
        self.calls = 0
        self._modes = ModuleModes(model)  # (model.eval() / hooks: a program per state, as for novaforge.compile)
        self._norms = _norm_layers(model)  # (their running statistics: step inputs in training mode)
        self._compiled: dict[tuple, Any] = {}
        self._grad_bufs: list[torch.Tensor] | None = None
        self._per_call: Any = None  # the model compiled per call: the step of a model with hooks (`_hooked_step`)
        self._lock = threading.RLock()
        self._distributed = distributed_style(model)  # DDP / FSDP2 / tensor parallel: stepped per call

    # the traced function: everything the step reads is an argument, everything it writes is
    # updated in place (and so becomes a write-back at the boundary)
    def _step_fn(self, names: list[str], hypers: list[tuple], group_ids: list[int], update: bool,
                 n_state: list[int], bnames: tuple[str, ...] = ()):
        model, loss_fn, kind, clip = self.model, self.loss_fn, self.kind, self.clip
        shadow = shadow_module(model)
        accumulate = self.accumulate

        def step(params: list[torch.Tensor], states: list[torch.Tensor], grad_bufs: list[torch.Tensor],
                 buffers: list[torch.Tensor], lrs: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
            with torch.enable_grad():
                leaves = [p.detach().requires_grad_(True) for p in params]  # the params are inputs
                # (buffers the forward updates are inputs too: their updates are write-backs)
                state = {**dict(zip(names, leaves, strict=True)), **dict(zip(bnames, buffers, strict=True))}
                out = torch.func.functional_call(shadow, state, args, kwargs, tie_weights=True, strict=False)
                loss = _loss(loss_fn, out, args, kwargs)
                grads = torch.autograd.grad(loss, leaves)
            grads = [g.detach() for g in grads]
            if accumulate > 1:
                grads = [b + g / accumulate for b, g in zip(grad_bufs, grads, strict=True)]
            with torch.no_grad():  # the writes below are the step's in-place updates (graph mutations)
                if not update:
                    for b, g in zip(grad_bufs, grads, strict=True):
                        b.copy_(g)
                    return loss.detach()
                if clip is not None:
                    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
                    coef = torch.clamp(clip / (norm + 1e-6), max=1.0)
                    grads = [g * coef for g in grads]
                it = iter(states)
                olds = [[next(it) for _ in range(n)] for n in n_state]
                for p, g, h, gi, old in zip(params, grads, hypers, group_ids, olds, strict=True):
                    new_p, new_state = _update(kind, h, p, g, old, lrs[gi])
                    p.copy_(new_p)
                    for dst, src in zip(old, new_state, strict=True):
                        dst.copy_(src)
                for b in grad_bufs:
                    b.copy_(torch.zeros_like(b))  # a final copy_, like every write of the step
            return loss.detach()

        # called with every tensor positional (parameters, state, gradient buffers, the groups' lrs, then the user's
        # arguments): a call of plain tensors binds without pytree work (api.CompiledModule.__call__)
        n_p, n_s = len(names), sum(n_state)
        n_g = n_p if accumulate > 1 else 0

        n_b = len(bnames)

        def flat_step(*xs: Any, **kwargs: Any) -> torch.Tensor:
            i = n_p + n_s + n_g
            return step(list(xs[:n_p]), list(xs[n_p:n_p + n_s]), list(xs[n_p + n_s:i]), list(xs[i:i + n_b]),
                        xs[i + n_b], tuple(xs[i + n_b + 1:]), kwargs)

        return flat_step

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self._lock:
            named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
            names = [n for n, _ in named]
            params = [p for _, p in named]
            opt = self.optimizer
            group_ids = _group_ids(opt, params)
            hypers = [_hyper(self.kind, opt.param_groups[i]) for i in group_ids]
            # one learning rate per parameter group, a run-time input: schedulers need no recompile
            lrs = torch.tensor([float(g["lr"]) for g in opt.param_groups], dtype=torch.float32,
                               device=params[0].device if params else None)
            states = _ensure_state(opt, self.kind, params, group_ids)
            self.calls += 1
            update = self.calls % self.accumulate == 0
            modes = self._modes.key()
            if (modes and modes[0]) or self._distributed:
                # forward / backward hooks: their side effects must run at every step; a distributed
                # model's collectives run from hooks and DDP's reducer (distributed.py)
                return self._hooked_step(args, kwargs, update)
            pre_hooks, post_hooks = _step_hooks(opt)
            if update and pre_hooks:
                raise NotImplementedError("compile_step: the optimizer has step pre-hooks (they could change the "
                                          "gradients, which live inside the compiled step); step it in eager")
            if self.accumulate > 1 and self._grad_bufs is None:
                self._grad_bufs = [torch.zeros_like(p) for p in params]
            bnames, buffers = _updated_buffers(self._norms)
            key = (tuple(names), tuple(hypers), tuple(group_ids), update, modes, bnames)
            fn = self._compiled.get(key)
            if fn is None:
                step = self._step_fn(names, hypers, group_ids, update, [len(s) for s in states], bnames)
                fn = api.compile(step, backend=self.backend, **self.options)
                self._compiled[key] = fn
            flat_states = [t for s in states for t in s]
            with torch.no_grad():  # the program computes the gradients itself
                loss = fn(*params, *flat_states, *(self._grad_bufs or []), *buffers, lrs, *args, **kwargs)
            if update:  # what eager's optimizer.step() also does: post-hooks, and the flag LR schedulers check
                opt._opt_called = True  # type: ignore[attr-defined]
                for hook in post_hooks:
                    hook(opt, (), {})
            return loss

    def _hooked_step(self, args: tuple, kwargs: dict, update: bool) -> torch.Tensor:
        """The step of a model with forward / backward hooks: one traced program would run their
        Python side effects (features collected, statistics logged) only when it is traced, so the
        model is compiled per call (`novaforge.compile`, which runs hooked modules through Dynamo:
        the hooks run at every call) and the backward, clipping and optimizer step run as eager's
        `loss.backward(); optimizer.step()` (step pre- and post-hooks included)."""
        opt = self.optimizer
        if self._per_call is None:
            why = f"is a {self._distributed} model" if self._distributed else "has forward / backward hooks"
            logs.get_logger("runtime").info("compile_step: the model %s; its forward is compiled per call and the "
                                            "optimizer steps eagerly, so that the hooks run at every step", why)
            self._per_call = api.compile(self.model, backend=self.backend, **self.options)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self._grad_bufs is not None:  # (gradients accumulated by the compiled step before hooks were added)
            for p, b in zip(params, self._grad_bufs, strict=False):
                p.grad = b.clone() if p.grad is None else p.grad + b
                b.zero_()
        with torch.enable_grad():
            loss = _loss(self.loss_fn, self._per_call(*args, **kwargs), args, kwargs)
            (loss / self.accumulate if self.accumulate > 1 else loss).backward()
        if update:
            if self.clip is not None:
                grads = [p.grad for p in params if p.grad is not None]
                norm = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
                coef = torch.clamp(self.clip / (norm + 1e-6), max=1.0)
                for g in grads:
                    g.mul_(coef)
            opt.step()  # (runs the step pre- and post-hooks itself)
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    @property
    def compilations(self) -> int:
        return sum(c.compilations for c in self._compiled.values())


def _norm_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(path, module) of the norm layers that can keep running statistics (BatchNorm, InstanceNorm)."""
    from torch.nn.modules.batchnorm import _NormBase

    return [(prefix, m) for prefix, m in model.named_modules() if isinstance(m, _NormBase)]


def _updated_buffers(norms: list[tuple[str, torch.nn.Module]]) -> tuple[tuple[str, ...], list[torch.Tensor]]:
    """The buffers a training forward updates in place: the running statistics of the norm layers
    in training mode that track them. The step takes them as inputs, so their updates are
    write-backs into the model's buffers (as constants they could not be updated: a BatchNorm
    model's step failed to capture). Other buffers stay constants the passes fold (causal masks,
    rotary tables)."""
    names, tensors = [], []
    for prefix, m in norms:
        if m.training and m.track_running_stats:
            for name, b in m.named_buffers(recurse=False):
                names.append(f"{prefix}.{name}" if prefix else name)
                tensors.append(b)
    return tuple(names), tensors


def _loss(loss_fn: Callable[..., Any] | None, out: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """The scalar to differentiate: `loss_fn(output, *args, **kwargs)`, or the output itself
    (a model that returns its loss), or a transformers output's `.loss`."""
    if loss_fn is not None:
        return loss_fn(out, *args, **kwargs)
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError("compile_step without loss_fn needs a model that returns its loss (a scalar tensor or .loss)")


def compile_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[..., Any] | None = None, *, accumulate: int = 1,
                 clip_grad_norm: float | None = None, backend: str = "auto", **options: Any) -> CompiledStep:
    """One compiled training step: `step = novaforge.compile_step(model, opt, loss_fn)`, then
    `loss = step(*args, **kwargs)` runs forward, `loss_fn(model(*args, **kwargs), *args,
    **kwargs)` (or the model's own loss when loss_fn is None), backward, optional clipping by
    global norm, and the optimizer update, as one program. See the module docstring."""
    return CompiledStep(model, optimizer, loss_fn, accumulate=accumulate, clip_grad_norm=clip_grad_norm,
                        backend=backend, **options)

