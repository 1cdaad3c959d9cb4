"""AdamW's step with a correctly rounded square root, for trainings on the CPU whose bits must not depend on it.

On the CPU, ``torch.sqrt`` of a float tensor is MKL's vector-math kernel; its float32 one (``vsSqrt``) seeds the
result with ``rsqrtps``, an approximation whose bits the instruction set leaves to each processor, so Intel and
AMD CPUs may round a root differently, whatever ``MKL_CBWR`` says. Stock AdamW takes that root of its second moment
at every step. Run under an emulated CPU (QEMU, whose ``rsqrtps`` is not the processor's) on the same machine, a
smoke training gave other weights from its second step; with :func:`exact_sqrt` in the step it gave the same bits
(``book/reference.md``, "Training the miniature"). The step here is torch's AdamW (decoupled weight decay,
Loshchilov & Hutter 2019), line for line, with that one root replaced; the optimiser object, its state and its
``state_dict`` stay torch's, so resume states and the arms' pre-decay state load as before.
"""

from __future__ import annotations

__all__ = ["adamw_step", "exact_sqrt"]


def exact_sqrt(x):
    """The correctly rounded square root of a float32 tensor, the same bits on every IEEE-754 CPU.

    ``1 / rsqrt(x)`` in float64: ATen's ``rsqrt`` is a hardware square root and a division (no approximation
    instruction), and three float64 roundings stay far enough inside float32's half-unit that rounding to float32
    gives the correctly rounded root (checked on every float32 of [1, 4) in ``tests/unit/train``; the root of
    ``4x`` is twice the root of ``x``, so that range stands for every normal number). ``sqrt(0) = 1 / inf = 0``.

    Parameters
    ----------
    x : torch.Tensor
        Non-negative, float32 (AdamW's second moment).

    Returns
    -------
    torch.Tensor
        ``sqrt(x)`` in ``x``'s dtype.
    """
    return x.double().rsqrt_().reciprocal_().to(x.dtype)  # [same shape as x]


def adamw_step(optimizer) -> None:
    """One step of ``optimizer`` (a ``torch.optim.AdamW`` without amsgrad) with :func:`exact_sqrt` as its root.

    The same arithmetic as torch's single-tensor AdamW (``torch/optim/adam.py``, ``_single_tensor_adam``): weights
    decayed by ``1 - lr wd``; ``m <- lerp(m, g, 1 - beta1)``; ``v <- beta2 v + (1 - beta2) g^2``;
    ``w <- w - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``. State is made as torch makes it
    (``step`` a float32 scalar tensor, ``exp_avg`` and ``exp_avg_sq`` zeros like the parameter).

    Raises
    ------
    ValueError
        A parameter group asks for amsgrad, maximize or a learning rate given as a tensor, which this step does
        not implement.
    """
    import torch

    with torch.no_grad():
        for group in optimizer.param_groups:
            if group.get("amsgrad") or group.get("maximize") or torch.is_tensor(group["lr"]):
                raise ValueError("adamw_step implements plain AdamW: no amsgrad, maximize or tensor lr; use "
                                 "optimizer.step() for those")
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is not None:
                    _update(param, optimizer.state[param], group["lr"], beta1, beta2, group["eps"],
                            group["weight_decay"])


def _update(param, state: dict, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One parameter's AdamW update, in place (``param`` and its ``state``)."""
    import torch

    if not state:  # as torch's AdamW starts a parameter's state
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
    state["step"] += 1
    step = state["step"].item()
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = (exact_sqrt(exp_avg_sq) / (1 - beta2**step) ** 0.5).add_(eps)  # [param's shape]
    param.addcdiv_(exp_avg, denom, value=-step_size)
