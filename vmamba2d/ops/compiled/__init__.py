"""The compiled C++ / CUDA scan kernels (``vmamba2d._C_cpu`` or its JIT build, ``vmamba2d._C_cuda``)
as ``torch.library`` custom ops: :mod:`.extensions` locates the extension modules, :mod:`.ops`
holds the single-route ops, :mod:`.cross_ops` the four-route ops. Reached through
:func:`vmamba2d.ops.selective_scan_2d` / :func:`vmamba2d.ops.cross_selective_scan_2d`."""
