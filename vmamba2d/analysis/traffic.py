"""Byte account of a forward pass: the bytes every aten op reads and writes, without a GPU.

:class:`TrafficCounter` is a ``TorchDispatchMode`` that records, for every aten op a forward
dispatches, the bytes of its input tensors (read) and output tensors (written), the op kind, the
model stage it ran in and whether it is a dtype cast. It is the traffic of an unfused execution:
each op reads its inputs from memory and writes its outputs back. :func:`account_model` traces a
timm model as on a CUDA device, on fake tensors (no GPU, no arithmetic: any batch and image size
traces in about a second), with CUDA's autocast policy when asked.

Counting rules:

- a tensor's bytes are its distinct elements times the element size (a broadcast input, stride 0
  along a dimension, counts each distinct element once);
- views (ops whose outputs alias an input: ``view``, ``permute``, ``expand``, ``slice``, ...),
  in-place restrides (``as_strided_``), ``_unsafe_view``, ``detach``, allocations (``empty*``)
  and ops returning no tensor (``prim.device``, ``promote_types``) move nothing;
- an argument an op only writes (``out=``; the destination of ``copy_`` / ``fill_`` / ``zero_``)
  counts as written, the ``self`` of any other in-place op as read and written;
- a kernel's own contiguous copy of a strided input (``native_layer_norm`` on CPU and CUDA) is
  counted as one more op, ``<op>:contiguous``;
- dtype casts: ``aten._to_copy`` with a dtype change and ``aten.copy_`` between dtypes (autocast's
  own casts of inputs and weights included);
- the scan ops (the ``vmamba2d::*selective_scan*`` custom ops) by their traffic formula,
  :func:`scan_op_traffic` (what a fused kernel must move), not by what their CPU implementation
  does inside; with ``scan_traffic="cuda"`` the four-route forward op by the passes its CUDA path
  runs today (:func:`vmamba2d.analysis.scan_passes.cuda_cross_forward_passes`: layout copies,
  the step-size projection, the kernel's own re-reads), one record per pass.

Convolutions on CUDA (cuDNN) write channels-last when their input or weight is channels-last;
fake tensors do not know cuDNN is there, so the counter restrides a convolution's output to
channels-last in that case (moving no bytes) to keep the layouts the following ops see as on a GPU.

The roofline estimate (:func:`roofline_seconds`) gives every op the larger of its bytes over a
bandwidth and its GEMM FLOPs over a peak rate, and adds them up (no overlap between ops): an
estimate, not a measurement.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .scan_passes import CROSS_FORWARD_OP, cuda_cross_forward_passes

Tensor = torch.Tensor
aten = torch.ops.aten

MODES = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")
SCAN_TRAFFIC = ("fused", "cuda")

# Measured: a plain copy on the H200 of the 2026-11-28 run reads + writes 4.2 TB/s
# (benchmarks/gpu-followup-20261128-h200-798a329.md).
H200_COPY_BYTES_PER_S = 4.2e12
# Estimates: NVIDIA's H200 SXM datasheet peaks (dense, no sparsity), FLOP/s by the dtype a GEMM or
# convolution computes in; fp32 convolutions run on TF32 tensor cores (PyTorch's cuDNN default),
# fp32 matmuls on the CUDA cores (torch.backends.cuda.matmul.allow_tf32 is off by default).
H200_PEAK_FLOPS = {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12}

_FREE_OPS = {
    aten._unsafe_view, aten.detach, aten.alias, aten.lift_fresh, aten.empty, aten.empty_like,
    aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten.empty_permuted,
}
_WRITE_ONLY_SELF = {aten.copy_, aten.fill_, aten.zero_, aten.uniform_, aten.normal_, aten.bernoulli_}
# Kernels that copy these (positional) tensor arguments to a contiguous tensor first when they are
# not: CPU and CUDA layer_norm (input.expect_contiguous()). The copy runs inside the op, below the
# dispatcher a mode sees, so the counter adds it.
_CONTIGUOUS_INPUTS = {aten.native_layer_norm: (0,)}
_CONVOLUTIONS = {aten.convolution, aten._convolution, aten.cudnn_convolution}
_GEMMS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten._convolution, aten.cudnn_convolution}

# The scan custom ops' arguments a kernel reads (any op in namespace vmamba2d whose name holds
# "selective_scan"); every tensor output is written.
SCAN_READ_ARGUMENTS = ("u", "delta", "A", "B", "C", "D", "delta_bias", "delta_proj_weight", "dy",
                       "vcarry", "hcarry")


def tensor_bytes(t: Tensor) -> int:
    """Bytes of the distinct elements t addresses: the product of its sizes along dimensions with a
    non-zero stride, times the element size (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    distinct = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            distinct *= size
    return distinct * t.element_size()


@dataclasses.dataclass(frozen=True)
class OpTraffic:
    """One dispatched op: ``kind`` (the aten overload packet's name, or ``scan:<op>``), ``stage``
    (the model part it ran in), bytes ``read`` / ``written``, ``cast`` (a dtype cast), ``flops``
    (GEMM / convolution FLOPs, 2 per multiply-add; 0 for other ops) and ``compute`` (the dtype
    class of those FLOPs: ``"bf16"``, ``"fp16"``, ``"tf32"``, ``"fp32"``; ``""`` without FLOPs)."""

    kind: str
    stage: str
    read: int
    written: int
    cast: bool
    flops: int = 0
    compute: str = ""

    @property
    def total(self) -> int:
        return self.read + self.written


def _is_scan_op(func: Any) -> bool:
    return func.namespace == "vmamba2d" and "selective_scan" in func._schema.name


def _bound_arguments(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    bound = dict(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs)
    return bound


def scan_op_traffic(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> Tuple[int, int]:
    """(read, written) bytes of one call of a scan custom op: what a fused kernel must move.

    The kernel reads each of its tensor inputs once -- the map u (batch, dim, H, W), the step
    sizes delta as given (the low-rank (batch, K, R, H, W) ones with ``delta_proj_weight``: the
    projection happens where they are read), B and C (batch, K or groups, N, ...), the small
    parameters A, D, delta_bias, delta_proj_weight, and in the backward dy and any saved carries --
    and writes each tensor output once (y in its dtype; the backward's gradients). Whatever the
    implementation does inside (copies, a full-rank delta, an fp32 y summed over routes) is not
    counted: that is the kernel's traffic, accounted by the kernel work, not the model's.
    """
    bound = _bound_arguments(func, args, kwargs)
    read = sum(tensor_bytes(bound[name]) for name in SCAN_READ_ARGUMENTS if isinstance(bound.get(name), Tensor))
    written = sum(tensor_bytes(t) for t in tree_flatten(out)[0] if isinstance(t, Tensor))
    return read, written


def _compute_class(dtype: torch.dtype, convolution: bool) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == torch.float16:
        return "fp16"
    return "tf32" if convolution else "fp32"


def _flops(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> int:
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(func.overloadpacket)
    return int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0


def _wants_channels_last(t: Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


class TrafficCounter(TorchDispatchMode):
    """Records an :class:`OpTraffic` for every op dispatched while active (see the module doc).

    Args:
        stage: a callable naming the model part running now (``"other"`` when None).
        cudnn_layouts: restride convolution outputs to channels-last when the input or weight is
            channels-last, as cuDNN writes them (for fake CUDA tensors, which lack cuDNN).
        scan_traffic: ``"fused"`` (the scan ops by :func:`scan_op_traffic`) or ``"cuda"`` (the
            four-route forward by the passes of its CUDA path, :mod:`vmamba2d.analysis.scan_passes`;
            the other scan ops as fused).
    """

    def __init__(self, stage: Optional[Callable[[], str]] = None, cudnn_layouts: bool = False,
                 scan_traffic: str = "fused") -> None:
        super().__init__()
        if scan_traffic not in SCAN_TRAFFIC:
            raise ValueError(f"scan_traffic must be one of {SCAN_TRAFFIC}, got {scan_traffic!r}")
        self.records: List[OpTraffic] = []
        self._stage = stage or (lambda: "other")
        self._cudnn_layouts = cudnn_layouts
        self._scan_traffic = scan_traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if self._cudnn_layouts and packet in _CONVOLUTIONS and isinstance(out, Tensor):
            if (_wants_channels_last(args[0]) or _wants_channels_last(args[1])) and not _wants_channels_last(out):
                out = out.contiguous(memory_format=torch.channels_last)  # below this mode: not counted
        if packet in _FREE_OPS or func.is_view or torch.Tag.inplace_view in func.tags:
            return out
        if not any(isinstance(t, Tensor) for t in tree_flatten(out)[0]):
            return out  # metadata queries (prim.device, promote_types, sym sizes)
        if _is_scan_op(func):
            name = func._schema.name.split("::")[-1]
            if self._scan_traffic == "cuda" and name == CROSS_FORWARD_OP:
                for step in cuda_cross_forward_passes(**_bound_arguments(func, args, kwargs)):
                    self.records.append(OpTraffic(f"scan:{name}:{step.name}", self._stage(), step.read, step.written,
                                                  False))
                return out
            read, written = scan_op_traffic(func, args, kwargs, out)
            self.records.append(OpTraffic(f"scan:{name}", self._stage(), read, written, False))
            return out
        for index in _CONTIGUOUS_INPUTS.get(packet, ()):
            if not args[index].is_contiguous():
                size = args[index].numel() * args[index].element_size()
                self.records.append(OpTraffic(f"{packet.__name__}:contiguous", self._stage(), tensor_bytes(args[index]),
                                              size, False))
        read, written = self._argument_traffic(func, args, kwargs, out)
        flops = _flops(func, args, kwargs, out) if packet in _GEMMS else 0
        compute = _compute_class(args[0].dtype, packet in _CONVOLUTIONS) if flops else ""
        self.records.append(OpTraffic(packet.__name__, self._stage(), read, written, _is_cast(func, args, kwargs, out),
                                      flops, compute))
        return out

    @staticmethod
    def _argument_traffic(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> Tuple[int, int]:
        schema = func._schema
        read = written = 0
        for index, argument in enumerate(schema.arguments):
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            tensors = [t for t in tree_flatten(value)[0] if isinstance(t, Tensor)]
            size = sum(tensor_bytes(t) for t in tensors)
            mutated = argument.alias_info is not None and argument.alias_info.is_write
            if not mutated:
                read += size
            elif argument.kwarg_only or func.overloadpacket in _WRITE_ONLY_SELF:
                written += size
            else:
                read += size
                written += size
        returns = out if isinstance(out, (tuple, list)) else (out,)
        for ret, value in zip(schema.returns, returns):
            if ret.alias_info is None and isinstance(value, Tensor):
                written += tensor_bytes(value)
        return read, written


def _is_cast(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> bool:
    if func.overloadpacket is aten._to_copy:
        return isinstance(out, Tensor) and out.dtype != args[0].dtype
    if func.overloadpacket is aten.copy_:
        return args[0].dtype != args[1].dtype
    return False


@dataclasses.dataclass
class TrafficAccount:
    """A traced forward: its op records and the batch they are for."""

    records: List[OpTraffic]
    batch: int

    @property
    def total(self) -> int:
        return sum(r.total for r in self.records)

    @property
    def per_image(self) -> float:
        return self.total / self.batch

    @property
    def cast_bytes(self) -> int:
        return sum(r.total for r in self.records if r.cast)

    @property
    def cast_share(self) -> float:
        return self.cast_bytes / self.total if self.total else 0.0

    def by(self, key: str) -> Dict[str, Dict[str, int]]:
        """Totals per ``"kind"`` or ``"stage"``: {name: {"ops", "read", "written", "total", "flops"}},
        largest total first."""
        groups: Dict[str, Dict[str, int]] = defaultdict(lambda: dict(ops=0, read=0, written=0, total=0, flops=0))
        for r in self.records:
            g = groups[getattr(r, key)]
            g["ops"] += 1
            g["read"] += r.read
            g["written"] += r.written
            g["total"] += r.total
            g["flops"] += r.flops
        return dict(sorted(groups.items(), key=lambda item: -item[1]["total"]))


def roofline_seconds(account: TrafficAccount, bandwidth: float = H200_COPY_BYTES_PER_S,
                     peak_flops: Optional[Dict[str, float]] = None) -> float:
    """Estimated seconds of the traced forward: per op the larger of bytes / ``bandwidth`` (bytes/s,
    read + write) and GEMM FLOPs / the peak of its compute class (``peak_flops``, FLOP/s; default
    :data:`H200_PEAK_FLOPS`), summed over ops."""
    peaks = H200_PEAK_FLOPS if peak_flops is None else peak_flops
    return sum(max(r.total / bandwidth, r.flops / peaks[r.compute] if r.flops else 0.0) for r in account.records)


def stage_labels(model: nn.Module) -> Dict[nn.Module, str]:
    """The model parts the account reports: each top-level child by name, and each child of a
    top-level ``stages`` / ``layers`` container as ``stages.i``."""
    labels: Dict[nn.Module, str] = {}
    for name, child in model.named_children():
        if name in ("stages", "layers") and len(list(child.children())) > 1:
            for index, stage in enumerate(child.children()):
                labels[stage] = f"{name}.{index}"
        else:
            labels[child] = name
    return labels


@contextlib.contextmanager
def stage_tracking(model: nn.Module) -> Iterator[Callable[[], str]]:
    """Hooks that keep the name of the innermost reported part running; yields a callable that
    returns it (``"other"`` outside them)."""
    stack: List[str] = []

    def enter(label: str) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any) -> None:
            stack.append(label)
        return hook

    def leave(_module: nn.Module, _args: Any, _output: Any) -> None:
        stack.pop()

    handles = []
    for module, label in stage_labels(model).items():
        handles.append(module.register_forward_pre_hook(enter(label)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield lambda: stack[-1] if stack else "other"
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def cuda_autocast(dtype: Optional[torch.dtype]) -> Iterator[None]:
    """CUDA's autocast policy for fake CUDA tensors (``torch.autocast`` turns itself off without a
    GPU, but the policy's dispatch entries work on fake tensors); no-op for ``dtype=None``."""
    if dtype is None:
        yield
        return
    enabled, previous = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", enabled)
        torch.set_autocast_dtype("cuda", previous)


@contextlib.contextmanager
def compiled_scan_on_fake_cuda() -> Iterator[None]:
    """Let the scan op's backend choice take the ``cuda`` backend (the compiled four-route op) for
    fake CUDA tensors: it would otherwise ask the driver whether the CUDA kernel runs (no GPU
    here) and pick another backend. Nothing runs: fake tensors take the op's fake kernel."""
    from vmamba2d.ops import cross_selective_scan_2d

    namespace = cross_selective_scan_2d.__globals__
    original = namespace["resolve_backend"]

    def resolve_for_account(backend: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
        if device.type == "cuda" and torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
            return "cuda"
        return original(backend, device, dtype)

    namespace["resolve_backend"] = resolve_for_account
    try:
        yield
    finally:
        namespace["resolve_backend"] = original


def _mode_dtypes(mode: str) -> Tuple[torch.dtype, Optional[torch.dtype]]:
    """(weights and inputs dtype, autocast dtype or None) of an account mode."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode.startswith("autocast-"):
        return torch.float32, torch.bfloat16 if mode.endswith("bf16") else torch.float16
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[mode], None


def _fake_state(model: nn.Module, fake_mode: Any, device: str, dtype: torch.dtype) -> Dict[str, Tensor]:
    """Every parameter and buffer of model as a fake tensor on ``device`` (floating ones in
    ``dtype``), by name, for :func:`torch.func.functional_call`."""
    state = {}
    for name, value in list(model.named_parameters()) + list(model.named_buffers()):
        fake = fake_mode.from_tensor(value)
        state[name] = fake.to(device=device, dtype=dtype if fake.is_floating_point() else fake.dtype)
    return state


def account_model(model: nn.Module, mode: str = "fp32", img_size: int = 224, batch: int = 1,
                  in_chans: int = 3, scan_traffic: str = "fused") -> TrafficAccount:
    """Trace one inference forward of ``model`` as on a CUDA device and account its bytes.

    Args:
        model: a model taking (batch, in_chans, img_size, img_size) images. It runs on fake CUDA
            copies of its parameters and buffers (:func:`torch.func.functional_call`) in eval mode;
            the model itself is left as it was.
        mode: ``"fp32"``, ``"bf16"`` / ``"fp16"`` (weights and inputs in that dtype) or
            ``"autocast-bf16"`` / ``"autocast-fp16"`` (fp32 weights and inputs, CUDA autocast).
        img_size, batch: input size and batch.
        scan_traffic: how the scan ops count (:class:`TrafficCounter`): ``"fused"`` or ``"cuda"``.
    Returns:
        the :class:`TrafficAccount` of the forward (no autograd).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype, autocast_dtype = _mode_dtypes(mode)
    if batch < 1 or img_size < 1:
        raise ValueError(f"batch and img_size must be >= 1, got batch={batch}, img_size={img_size}")
    fake_mode = FakeTensorMode()
    with fake_mode:
        state = _fake_state(model, fake_mode, "cuda", dtype)
        images = torch.empty(batch, in_chans, img_size, img_size, device="cuda", dtype=dtype)
    training = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with stage_tracking(model) as stage, compiled_scan_on_fake_cuda(), torch.no_grad():
            counter = TrafficCounter(stage, cudnn_layouts=True, scan_traffic=scan_traffic)
            with fake_mode, counter, cuda_autocast(autocast_dtype):
                torch.func.functional_call(model, state, (images,))
    finally:
        for module, was_training in training:
            module.training = was_training
    return TrafficAccount(counter.records, batch)


def account_timm_model(name: str, mode: str = "fp32", img_size: int = 224, batch: int = 1,
                       scan_traffic: str = "fused", **model_kwargs: Any) -> TrafficAccount:
    """:func:`account_model` of a fresh ``timm.create_model(name, **model_kwargs)`` (vmamba2d's
    models registered)."""
    import timm

    import vmamba2d  # noqa: F401  (registers the vmamba models)

    return account_model(timm.create_model(name, **model_kwargs), mode, img_size, batch, scan_traffic=scan_traffic)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def format_account(account: TrafficAccount, title: str, bandwidth: float = H200_COPY_BYTES_PER_S,
                   peak_flops: Optional[Dict[str, float]] = None, top: int = 20) -> str:
    """The account as markdown: totals, cast share, the roofline estimate, per stage and per op
    kind (the ``top`` largest kinds) in MiB per image."""
    seconds = roofline_seconds(account, bandwidth, peak_flops)
    per = account.batch
    lines = [
        f"## {title}",
        "",
        f"- total: {_mib(account.per_image)} MiB per image (batch {account.batch}, {len(account.records)} ops)",
        f"- dtype casts: {_mib(account.cast_bytes / per)} MiB per image, {100 * account.cast_share:.2f}% of the total",
        f"- roofline estimate (not a measurement): {1e3 * seconds:.3f} ms a batch, {per / seconds:,.0f} img/s "
        f"at {bandwidth / 1e12:.2f} TB/s and the GEMM peaks {_peaks(peak_flops)}",
        "",
        "| stage | ops | read MiB/img | written MiB/img | total MiB/img | share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, g in account.by("stage").items():
        lines.append(f"| {name} | {g['ops']} | {_mib(g['read'] / per)} | {_mib(g['written'] / per)} | "
                     f"{_mib(g['total'] / per)} | {100 * g['total'] / account.total:.1f}% |")
    lines += ["", "| op kind | ops | read MiB/img | written MiB/img | total MiB/img | share | GFLOP/img |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for name, g in list(account.by("kind").items())[:top]:
        lines.append(f"| {name} | {g['ops']} | {_mib(g['read'] / per)} | {_mib(g['written'] / per)} | "
                     f"{_mib(g['total'] / per)} | {100 * g['total'] / account.total:.1f}% | {g['flops'] / per / 1e9:.2f} |")
    return "\n".join(lines) + "\n"


def _peaks(peak_flops: Optional[Dict[str, float]]) -> str:
    peaks = H200_PEAK_FLOPS if peak_flops is None else peak_flops
    return ", ".join(f"{k} {v / 1e12:g}" for k, v in peaks.items()) + " TFLOP/s (estimates)"
