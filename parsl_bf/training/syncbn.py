"""Batch normalisation over the whole global batch, across ranks, with mpi4py.

A plain ``BatchNorm`` normalises each rank's share with that share's statistics, so a model
with batch norm trains differently at every world size and an elastic run that is rescaled
no longer follows the uninterrupted one. :class:`MPIBatchNorm` computes the mean and variance
of the global batch (one Allreduce of per-channel sums in the forward pass, one in the
backward pass), so every world size computes what one rank would on the whole batch, up to
floating-point summation order; the running statistics agree on every rank too. In eval mode
it is a plain batch norm (running statistics, no communication).

Every rank must run the forward and backward pass of a training step, with an empty share if
need be (the trainer sees to it), or the collectives would not match.
"""

from __future__ import annotations

import torch
from mpi4py import MPI
from torch import nn

__all__ = ["MPIBatchNorm", "convert_batchnorm", "has_batchnorm", "set_comm"]


def _allreduce(comm: MPI.Comm, tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` (any device) over ``comm``, in float64 on the host (a few floats)."""
    # A copy always: a float64 CPU tensor would otherwise be reduced in place, and the caller
    # keeps its local sums (the weight and bias gradients) apart from the global ones.
    host = tensor.detach().to("cpu", torch.float64, copy=True).contiguous().numpy()
    if comm.size > 1:
        comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
    return torch.from_numpy(host).to(tensor.device)


class _GlobalBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, comm, stats):  # noqa: D102
        # Sums in float64 (they are exact enough to be independent of how the batch is split);
        # the elementwise work in float32, also under autocast.
        xf = x.float()
        dims = [0, *range(2, x.dim())]
        channels = x.shape[1]
        local = torch.cat(
            [
                xf.sum(dims, dtype=torch.float64),
                (xf * xf).sum(dims, dtype=torch.float64),
                torch.tensor([xf.numel() // channels], dtype=torch.float64, device=x.device),
            ]
        )
        total = _allreduce(comm, local)
        n = float(total[-1])
        mean = total[:channels] / n
        var = (total[channels : 2 * channels] / n - mean**2).clamp_min(0.0)
        stats.update(mean=mean, var=var, n=n)
        shape = [1, channels] + [1] * (x.dim() - 2)
        invstd = (var + eps).rsqrt().float()
        xhat = (xf - mean.float().view(shape)) * invstd.view(shape)
        out = xhat * weight.float().view(shape) + bias.float().view(shape)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.comm, ctx.n, ctx.dims, ctx.shape = comm, n, dims, shape
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        xhat, weight, invstd = ctx.saved_tensors
        dy = grad_out.float()
        channels = xhat.shape[1]
        local = torch.cat(
            [dy.sum(ctx.dims, dtype=torch.float64), (dy * xhat).sum(ctx.dims, dtype=torch.float64)]
        )
        # The bias and weight gradients stay this rank's share: the gradient exchange sums
        # them over ranks like every other parameter's.
        grad_bias, grad_weight = local[:channels], local[channels:]
        total = _allreduce(ctx.comm, local)
        sum_dy = total[:channels].float().view(ctx.shape)
        sum_dy_xhat = total[channels:].float().view(ctx.shape)
        n = ctx.n
        scale = (weight.float() * invstd).view(ctx.shape) / n
        grad_x = scale * (n * dy - sum_dy - xhat * sum_dy_xhat)
        return (
            grad_x.to(grad_out.dtype),
            grad_weight.to(weight.dtype),
            grad_bias.to(weight.dtype),
            None,
            None,
            None,
        )


class MPIBatchNorm(nn.modules.batchnorm._BatchNorm):
    """``BatchNorm1d/2d/3d`` with the statistics of the global batch across ``comm``'s ranks."""

    def __init__(self, num_features: int, comm: MPI.Comm, **kwargs) -> None:
        super().__init__(num_features, **kwargs)
        self.comm = comm

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input (got {x.dim()}-D)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training:
            return super().forward(x)
        if not self.affine:
            raise ValueError("MPIBatchNorm needs affine=True")
        stats: dict = {}
        out = _GlobalBatchNorm.apply(x, self.weight, self.bias, self.eps, self.comm, stats)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = (
                    1.0 / float(self.num_batches_tracked)
                    if self.momentum is None
                    else self.momentum
                )
                n = stats["n"]
                unbiased = stats["var"] * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - momentum).add_(momentum * stats["mean"].float())
                self.running_var.mul_(1 - momentum).add_(momentum * unbiased.float())
        return out


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def convert_batchnorm(module: nn.Module, comm: MPI.Comm) -> nn.Module:
    """``module`` with every BatchNorm replaced by an :class:`MPIBatchNorm` holding the same
    parameters and buffers (the state dict keys are unchanged)."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, MPIBatchNorm):
        new = MPIBatchNorm(
            module.num_features,
            comm,
            eps=module.eps,
            momentum=module.momentum,
            affine=module.affine,
            track_running_stats=module.track_running_stats,
        )
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        converted = convert_batchnorm(child, comm)
        if converted is not child:
            setattr(module, name, converted)
    return module


def set_comm(module: nn.Module, comm: MPI.Comm) -> None:
    """Every :class:`MPIBatchNorm` of ``module`` normalises over ``comm`` from now on (the
    ranks left after an in-place shrink)."""
    for m in module.modules():
        if isinstance(m, MPIBatchNorm):
            m.comm = comm
