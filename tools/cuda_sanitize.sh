#!/usr/bin/env bash
# Run the CUDA 2D-scan kernels under compute-sanitizer (memcheck, racecheck, synccheck, initcheck)
# on small cases: packed small maps, a multi-tile map with partial edge tiles, 1xL / Lx1 maps,
# the atomic and the deterministic backward. Needs a GPU, the built vmamba2d._C_cuda and
# compute-sanitizer (CUDA toolkit). Exit status is non-zero if any tool reports an error.
#
#   tools/cuda_sanitize.sh            # all four tools
#   TOOLS="memcheck racecheck" tools/cuda_sanitize.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
TOOLS="${TOOLS:-memcheck racecheck synccheck initcheck}"

CASE=$(mktemp --suffix=.py)
trap 'rm -f "$CASE"' EXIT
cat > "$CASE" <<'PY'
import os
import torch
import vmamba2d._C_cuda as m

def run(batch, dim, groups, n, h, w, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    L = h * w
    r = lambda *s: torch.randn(*s, generator=g).cuda()
    u, delta = r(batch, dim, L).to(dtype), (0.5 * r(batch, dim, L)).to(dtype)
    A = -torch.rand(dim, n, generator=g).cuda() - 0.1
    B, C = r(batch, groups, n, L).to(dtype), r(batch, groups, n, L).to(dtype)
    D, bias = r(dim), r(dim)
    y = m.forward(u, delta, A, B, C, D, bias, True, h, w, False)
    grads = m.backward(u, delta, A, B, C, D, bias, True, h, w, torch.ones_like(y))
    torch.cuda.synchronize()
    assert torch.isfinite(y.float()).all() and all(torch.isfinite(t.float()).all() for t in grads)

for det in ("0", "1"):
    os.environ["VMAMBA2D_DETERMINISTIC"] = det
    run(5, 4, 2, 5, 7, 7)
    run(2, 4, 2, 3, 40, 70)
    run(1, 2, 1, 2, 1, 70)
    run(1, 2, 1, 2, 70, 1)
    run(2, 2, 1, 16, 33, 33, torch.bfloat16)
print("sanitize cases ran")
PY

status=0
for tool in $TOOLS; do
  echo "== compute-sanitizer --tool $tool"
  if ! "$SANITIZER" --tool "$tool" --error-exitcode 3 "$PYTHON" "$CASE"; then
    echo "!! $tool reported errors"
    status=1
  fi
done
exit $status
