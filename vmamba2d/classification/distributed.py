"""Process-group setup for torchrun (DDP): one process per device, or a single plain process.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK (and the rendezvous address) for every process; the
same code then runs on 1 CPU process, 8 GPUs, or several nodes. Backend: nccl on CUDA, gloo on CPU.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from vmamba2d.cpu_malloc import keep_freed_memory

from .errors import UsageError


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes files and logs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str, local_rank: int) -> torch.device:
    """'auto' → this process's GPU when CUDA is available, else CPU; 'cuda' without CUDA → error."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available on this machine (use --device cpu)")
        if local_rank >= torch.cuda.device_count():
            raise UsageError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPU(s) "
                             "visible: launch at most one process per GPU")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if device == "cpu":
        return torch.device("cpu")
    raise UsageError(f"--device must be auto, cpu or cuda, got {device!r}")


def init_distributed(device: str) -> DistContext:
    """Join the torchrun process group when WORLD_SIZE > 1; a single process otherwise."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_device = resolve_device(device, local_rank)
    if torch_device.type == "cpu":
        # Activations of 10-100 MB are otherwise a fresh, kernel-zeroed mapping per tensor per step.
        keep_freed_memory()
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if torch_device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30),
                                device_id=torch_device if backend == "nccl" else None)
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=torch_device)


def shutdown_distributed() -> None:
    """Leave the process group (no-op for a single process)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Element-wise sum of ``values`` (any shape, float64 recommended) over all ranks."""
    if not ctx.distributed:
        return values
    reduced = values.to(ctx.device).clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced.to(values.device)


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not ctx.distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (no-op for a single process)."""
    if ctx.distributed:
        dist.barrier()
