"""fvcore FLOP counting of the 2D selective-scan custom op."""
from __future__ import annotations

import pytest
import torch

from vmamba2d.ops import selective_scan_2d
from vmamba2d.ops.flops import FVCORE_OP_HANDLES, scan_2d_flops

fvcore_nn = pytest.importorskip("fvcore.nn")


class TwoScans(torch.nn.Module):
    """Two scans with different shapes, one with D and one without: (batch, dim, H*W) -> same."""

    def __init__(self, dim: int, nstate: int, height: int, width: int) -> None:
        super().__init__()
        self.height, self.width = height, width
        self.A = torch.nn.Parameter(-torch.rand(dim, nstate) - 0.5)
        self.D = torch.nn.Parameter(torch.ones(dim))
        self.A_wide = torch.nn.Parameter(-torch.rand(dim, 2 * nstate) - 0.5)

    def forward(self, u: torch.Tensor, B: torch.Tensor, B_wide: torch.Tensor) -> torch.Tensor:
        grid = dict(height=self.height, width=self.width, backend="cpu")
        y = selective_scan_2d(u, u, self.A, B, B, self.D, None, True, **grid)
        return selective_scan_2d(y, u, self.A_wide, B_wide, B_wide, None, None, True, **grid)


# A map with a side of 1 is a 1D scan (9 flops per state and position), any other a 2D scan (15).
@pytest.mark.parametrize("height, width, per_state", [(4, 5, 15), (1, 20, 9), (20, 1, 9)])
def test_fvcore_counts_the_custom_op(height, width, per_state):
    batch, dim, groups, nstate = 2, 6, 2, 3
    length = height * width
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = TwoScans(dim, nstate, height, width).eval()
    inputs = (
        torch.randn(batch, dim, length, generator=gen),
        torch.randn(batch, groups, nstate, length, generator=gen),
        torch.randn(batch, groups, 2 * nstate, length, generator=gen),
    )
    analysis = fvcore_nn.FlopCountAnalysis(model, inputs).set_op_handle(**FVCORE_OP_HANDLES)
    analysis.unsupported_ops_warnings(False)
    with_d = per_state * batch * length * dim * nstate + batch * dim * length
    without_d = per_state * batch * length * dim * (2 * nstate)
    assert analysis.total() == with_d + without_d
    # fvcore names an operator by its unqualified op name.
    assert analysis.by_operator() == {"selective_scan_2d_fwd": with_d + without_d}
    assert "vmamba2d::selective_scan_2d_fwd" not in analysis.unsupported_ops()


def test_scan_2d_flops_formula():
    assert scan_2d_flops(batch=2, dim=384, length=56 * 56, nstate=1, with_d=True) == 16 * 2 * 384 * 3136
    assert scan_2d_flops(batch=1, dim=1, length=10, nstate=16, with_d=False) == 15 * 10 * 16



@pytest.mark.slow
def test_fvcore_counts_the_triton_op_in_the_interpreter():
    """The Triton op has its own name; run it through Triton's interpreter (set before triton is
    imported, hence a child process) and check fvcore counts it like the compiled op."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    pytest.importorskip("triton")
    script = textwrap.dedent("""
        import torch, fvcore.nn
        from vmamba2d.ops import selective_scan_2d
        from vmamba2d.ops.flops import FVCORE_OP_HANDLES

        class Scan(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.A = torch.nn.Parameter(-torch.rand(4, 2) - 0.5)
                self.D = torch.nn.Parameter(torch.ones(4))
            def forward(self, u, B):
                return selective_scan_2d(u, u, self.A, B, B, self.D, None, True,
                                         height=3, width=5, backend="triton")

        u, B = torch.randn(1, 4, 15), torch.randn(1, 2, 2, 15)
        analysis = fvcore.nn.FlopCountAnalysis(Scan().eval(), (u, B)).set_op_handle(**FVCORE_OP_HANDLES)
        analysis.unsupported_ops_warnings(False)
        print(analysis.total(), sorted(analysis.by_operator()))
    """)
    repo = Path(__file__).resolve().parents[2]
    env = {**__import__("os").environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(repo)}
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=repo,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = scan_2d_flops(batch=1, dim=4, length=15, nstate=2, with_d=True)
    assert result.stdout.split()[:1] == [str(expected)], result.stdout
    assert "selective_scan_2d_triton_fwd" in result.stdout
