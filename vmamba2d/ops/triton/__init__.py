"""The Triton scan kernels as ``torch.library`` custom ops: :mod:`.kernels` (the ``@triton.jit``
kernels, imported with triton on the first launch), :mod:`.launch` (availability, tiling,
launches), :mod:`.ops` (single-route ops), :mod:`.cross_ops` (four-route ops) and :mod:`.static`
(register / spill figures compiled without a GPU). Importing this package does not import triton;
reached through :func:`vmamba2d.ops.selective_scan_2d` / :func:`vmamba2d.ops.cross_selective_scan_2d`."""
