#!/usr/bin/env bash
# Run the GPU scan backends under compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on
# small cases, through the public op (selective_scan_2d, forward and autograd backward): packed
# small maps, a multi-tile map with partial edge tiles, 1xL / Lx1 maps, groups > 1, N = 16 in bf16.
# Each backend in $BACKENDS that is usable here runs (cuda: the built vmamba2d._C_cuda with an
# image for this GPU; triton: Triton importable); the others are reported as skipped. Needs a GPU
# and compute-sanitizer. Exit status: 0 clean, 1 a tool reported errors, 2 nothing could be checked,
# 4 racecheck's hazards all lie in Triton's own library code (none at a line of vmamba2d's sources:
# Triton's reductions store replicated partials to one shared-memory word, triton-lang/triton#7264),
# every other tool clean.
#
#   dev/gpu/cuda_sanitize.sh                          # all four tools, cuda and triton backends
#   TOOLS="memcheck racecheck" BACKENDS=cuda dev/gpu/cuda_sanitize.sh
#   KERNEL_FILTER= dev/gpu/cuda_sanitize.sh           # check every kernel, torch's too (slower)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  PYTHON="$ROOT/.venv/bin/python"
  [ -x "$PYTHON" ] || PYTHON=python3
fi
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
TOOLS="${TOOLS:-memcheck racecheck synccheck initcheck}"
export SANITIZE_BACKENDS="${BACKENDS:-cuda triton}"
# Instrument only the scan kernels (CUDA: scan2d_*_kernel, Triton: scan2d_*_kernel): torch's own
# kernels are not under test and would make every tool several times slower.
KERNEL_FILTER="${KERNEL_FILTER-kns=scan2d}"

[ -x "$SANITIZER" ] || { echo "compute-sanitizer not found (set SANITIZER=...)"; exit 2; }
# The kernel filter option is --kernel-name in current compute-sanitizer releases, --filter in
# older ones; without either, every kernel is checked.
FILTER_ARGS=()
if [ -n "$KERNEL_FILTER" ]; then
  HELP="$("$SANITIZER" --help 2>&1 || true)"
  if grep -q -- "--kernel-name " <<<"$HELP"; then
    FILTER_ARGS=(--kernel-name "$KERNEL_FILTER")
  elif grep -q -- "--filter " <<<"$HELP"; then
    FILTER_ARGS=(--filter "$KERNEL_FILTER")
  else
    echo "note: this compute-sanitizer has no kernel filter option; checking every kernel"
  fi
fi
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

CASE=$(mktemp --suffix=.py)
LOG=$(mktemp)
trap 'rm -f "$CASE" "$LOG"' EXIT
cat > "$CASE" <<'PY'
import os
import sys

import torch

from vmamba2d.ops import resolve_backend, selective_scan_2d

# (batch, dim, groups, N, height, width, dtype)
CASES = [
    (5, 4, 2, 5, 7, 7, torch.float32),      # several small maps per tile
    (2, 4, 2, 3, 40, 70, torch.float32),    # several tiles, partial edge tiles
    (1, 2, 1, 2, 1, 70, torch.float32),     # 1 x L
    (1, 2, 1, 2, 70, 1, torch.float32),     # L x 1
    (3, 6, 3, 1, 33, 65, torch.float32),    # N = 1, odd batch, 3 groups
    (2, 2, 1, 16, 33, 33, torch.bfloat16),  # N = 16, half precision
]


def run(backend, batch, dim, groups, n, h, w, dtype):
    # Drawn on the GPU: every input byte is written by a kernel, so an initcheck report cannot come
    # from how the sanitizer tracks host-to-device copies (the first run's reports were on loads of
    # B, which was copied from the host; their cause is not established).
    g = torch.Generator(device="cuda").manual_seed(0)
    length = h * w
    rand = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    leaves = dict(
        u=rand(batch, dim, length).to(dtype), delta=(0.5 * rand(batch, dim, length)).to(dtype),
        A=-torch.rand(dim, n, generator=g, device="cuda") - 0.1,
        B=rand(batch, groups, n, length).to(dtype), C=rand(batch, groups, n, length).to(dtype),
        D=rand(dim), delta_bias=rand(dim),
    )
    for t in leaves.values():
        t.requires_grad_()
    # Buffer address ranges, so that an address in a report names its tensor.
    spans = " ".join(f"{name}=[{t.data_ptr():#x},{t.data_ptr() + t.numel() * t.element_size():#x})"
                     for name, t in leaves.items())
    print(f"case {backend} {(batch, dim, groups, n, h, w, str(dtype))}: {spans}", flush=True)
    y = selective_scan_2d(**leaves, delta_softplus=True, height=h, width=w, backend=backend)
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    assert torch.isfinite(y.float()).all(), (backend, h, w)
    assert all(torch.isfinite(t.grad.float()).all() for t in leaves.values()), (backend, h, w)


if not torch.cuda.is_available():
    print("no GPU visible to torch: nothing was checked")
    sys.exit(2)
ran = []
for backend in os.environ["SANITIZE_BACKENDS"].split():
    try:
        resolve_backend(backend, torch.device("cuda"), torch.float32)
    except (RuntimeError, ValueError) as err:
        print(f"backend {backend}: skipped ({err})")
        continue
    for case in CASES:
        run(backend, *case)
    ran.append(backend)
    print(f"backend {backend}: {len(CASES)} cases ran (forward + backward)")
if not ran:
    print("no GPU backend could run: nothing was checked")
    sys.exit(2)
PY

# Whether every hazard racecheck located in $LOG lies in a file that is not one of vmamba2d's
# sources (Triton's library); false when it located none.
hazards_only_outside_our_sources() {
  local files
  files=$(grep -E "Race reported|hazard detected" -A2 "$1" | grep -oE " in [^ ]+:[0-9]+" | sed -E 's/^ in //; s/:[0-9]+$//' | sort -u)
  [ -n "$files" ] || return 1
  local file
  for file in $files; do
    if [ -n "$(find "$ROOT/vmamba2d" "$ROOT/csrc" -name "$(basename "$file")" -print -quit)" ]; then
      return 1
    fi
  done
  echo "   hazard locations: $(echo $files)"
}

status=0
for tool in $TOOLS; do
  echo "== compute-sanitizer --tool $tool ${FILTER_ARGS[*]}"
  set +e
  "$SANITIZER" --tool "$tool" --error-exitcode 3 --print-limit 20 "${FILTER_ARGS[@]}" "$PYTHON" "$CASE" 2>&1 | tee "$LOG"
  code=${PIPESTATUS[0]}
  set -e
  if [ "$code" -eq 2 ]; then
    exit 2
  elif [ "$code" -ne 0 ] && [ "$tool" = racecheck ] && hazards_only_outside_our_sources "$LOG"; then
    echo "!! racecheck: hazards only in Triton's own code, none in vmamba2d's kernels (triton-lang/triton#7264)"
    [ "$status" -eq 1 ] || status=4
  elif [ "$code" -ne 0 ]; then
    echo "!! $tool reported errors (exit $code)"
    status=1
  fi
done
exit $status
