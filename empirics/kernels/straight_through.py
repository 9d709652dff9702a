"""Straight-through threshold functions: exact forward values, rectangle-kernel θ-gradients.

Two models use a Heaviside step H(u − θ) whose true gradient is zero almost everywhere:

* JumpReLU SAEs (Rajamanoharan et al. 2024, arXiv:2407.14435; docs/ecosystem.md §3), with the OPEN
  rectangle kernel K(v) = 1[|v| < ½] at v = (u − θ)/ε;
* the Group-Lasso BSF's STE gate on block norms (docs/bsf.md §2), with the CLOSED kernel
  1[|u − θ| ≤ w/2].

:class:`StepFn` serves both (``closed`` picks the kernel, each evaluated exactly as its spec writes it,
so the boundary cases are bit-for-bit those of the spec's formula); :class:`JumpReLUFn` is the JumpReLU
activation z = u·H(u − θ) built on the same kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rectangle_kernel", "StepFn", "JumpReLUFn"]


def rectangle_kernel(u: Tensor, theta: Tensor, width: float, closed: bool) -> Tensor:
    """1[|u − θ| ≤ w/2] when ``closed``, else K((u − θ)/w) = 1[|(u − θ)/w| < ½], as a 0/1 tensor."""
    if closed:
        return ((u - theta).abs() <= width / 2).to(u.dtype)
    return (((u - theta) / width).abs() < 0.5).to(u.dtype)


def _theta_grad(kernel_times_grad: Tensor, theta: Tensor) -> Tensor:
    """Sum over every axis but θ's (the last)."""
    return kernel_times_grad.reshape(-1, theta.shape[-1]).sum(0)


class StepFn(torch.autograd.Function):
    """H(u − θ) with STE gradients ∂H/∂u = 0, ∂H/∂θ = −(1/w)·kernel (see :func:`rectangle_kernel`).

    ``apply(u, theta, width, closed=False)``: JumpReLU's open kernel by default."""

    @staticmethod
    def forward(ctx, u: Tensor, theta: Tensor, width: float, closed: bool = False) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(u, theta)
        ctx.width, ctx.closed = width, closed
        return (u > theta).to(u.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        u, theta = ctx.saved_tensors
        w = ctx.width
        grad_theta = _theta_grad(-(1.0 / w) * rectangle_kernel(u, theta, w, ctx.closed) * grad_out, theta)
        return torch.zeros_like(u), grad_theta, None, None


class JumpReLUFn(torch.autograd.Function):
    """z = u·H(u − θ) with STE gradients ∂z/∂u = H(u − θ), ∂z/∂θ = −(θ/ε)·K((u − θ)/ε) (open kernel)."""

    @staticmethod
    def forward(ctx, u: Tensor, theta: Tensor, bandwidth: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(u, theta)
        ctx.bandwidth = bandwidth
        return u * (u > theta).to(u.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        u, theta = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_u = grad_out * (u > theta).to(u.dtype)
        grad_theta = _theta_grad(-(theta / eps) * rectangle_kernel(u, theta, eps, closed=False) * grad_out, theta)
        return grad_u, grad_theta, None
