#!/usr/bin/env bash
# Run the GPU scan backends under compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on
# small cases, through the public op (selective_scan_2d, forward and autograd backward): packed
# small maps, a multi-tile map with partial edge tiles, 1xL / Lx1 maps, groups > 1, N = 16 in bf16.
# Each backend in $BACKENDS that is usable here runs (cuda: the nvcc-built vmamba2d._C_cuda with an
# image for this GPU, else the NVRTC path; triton: Triton importable); the others are reported as
# skipped. memcheck, racecheck and synccheck instrument the scan kernels only; initcheck every kernel,
# on three of the cases (INITCHECK_CASES). Needs a GPU and compute-sanitizer. Exit status: 0 clean, 1 a tool reported errors, 2 nothing could be checked,
# 4 racecheck's hazards all lie in Triton's own library code (none at a line of vmamba2d's sources:
# Triton's reductions store replicated partials to one shared-memory word, triton-lang/triton#7264),
# every other tool clean.
#
#   dev/gpu/cuda_sanitize.sh                          # all four tools, cuda and triton backends
#   TOOLS="memcheck racecheck" BACKENDS=cuda dev/gpu/cuda_sanitize.sh
#   KERNEL_FILTER= dev/gpu/cuda_sanitize.sh           # check every kernel, torch's too (slower)
#   INITCHECK_CASES="0 1 2 3 4 5" TOOLS=initcheck dev/gpu/cuda_sanitize.sh   # initcheck on every case
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
# kernels are not under test and would make every tool several times slower. Not for initcheck (below).
KERNEL_FILTER="${KERNEL_FILTER-kns=scan2d}"
# initcheck runs unfiltered: it knows a byte is initialized only from a write it saw, and under the
# filter it sees no write of torch's kernels -- not the op's own buffers that torch fills before a scan
# kernel reads them, nor inputs a torch kernel wrote. Both H200 runs reported only such reads under the
# filter ("Uninitialized __global__ memory read" of B in the v3 forward, at addresses inside B: drawn by
# torch.randn on 2026-11-29, copied from the host on 2026-11-28), and ran out of time printing them.
# Every kernel instrumented is slower, so initcheck takes fewer cases (indices into CASES below: packed
# small maps, partial edge tiles, N = 16 in bf16). A report that remains names a real read.
INITCHECK_CASES="${INITCHECK_CASES:-0 1 5}"

[ -x "$SANITIZER" ] || { echo "compute-sanitizer not found (set SANITIZER=...)"; exit 2; }
HELP="$("$SANITIZER" --help 2>&1 || true)"
# The kernel filter option is --kernel-name in current compute-sanitizer releases, --filter in
# older ones; without either, every kernel is checked.
FILTER_ARGS=()
if [ -n "$KERNEL_FILTER" ]; then
  if grep -q -- "--kernel-name " <<<"$HELP"; then
    FILTER_ARGS=(--kernel-name "$KERNEL_FILTER")
  elif grep -q -- "--filter " <<<"$HELP"; then
    FILTER_ARGS=(--filter "$KERNEL_FILTER")
  else
    echo "note: this compute-sanitizer has no kernel filter option; checking every kernel"
  fi
fi
# memcheck also reports every CUDA API call that returns an error. On 2026-11-29 all its 34 errors
# were cuGetProcAddress_v2 returning CUDA_ERROR_INVALID_VALUE inside cuda.bindings, which probes the
# driver's symbols when vmamba2d's launcher loads it (cuda_launch.Driver, cuInit): not a memory error
# and not a call of ours. The driver calls we make raise on any error (Driver._check) and torch checks
# its own, so a failing call ends the case script (a non-zero exit, reported below) either way; memory
# errors are still reported. Older releases without the option keep reporting API errors.
API_ERROR_ARGS=()
if grep -q -- "--report-api-errors" <<<"$HELP"; then
  API_ERROR_ARGS=(--report-api-errors no)
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
    # Drawn and cast to their dtypes on the host, then copied: every input byte reaches the GPU by a
    # copy, an API call each tool tracks whatever its kernel filter, and no kernel writes an input.
    g = torch.Generator().manual_seed(0)
    length = h * w
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    host = dict(
        u=rand(batch, dim, length).to(dtype), delta=(0.5 * rand(batch, dim, length)).to(dtype),
        A=-torch.rand(dim, n, generator=g) - 0.1,
        B=rand(batch, groups, n, length).to(dtype), C=rand(batch, groups, n, length).to(dtype),
        D=rand(dim), delta_bias=rand(dim),
    )
    leaves = {name: t.cuda().requires_grad_() for name, t in host.items()}
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
chosen = [CASES[int(i)] for i in os.environ.get("SANITIZE_CASES", "").split()] or CASES
ran = []
for backend in os.environ["SANITIZE_BACKENDS"].split():
    try:
        resolve_backend(backend, torch.device("cuda"), torch.float32)
    except (RuntimeError, ValueError) as err:
        print(f"backend {backend}: skipped ({err})")
        continue
    for case in chosen:
        run(backend, *case)
    ran.append(backend)
    print(f"backend {backend}: {len(chosen)} of {len(CASES)} cases ran (forward + backward)")
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
  args=()
  export SANITIZE_CASES=""  # every case
  case "$tool" in
    memcheck) args=("${FILTER_ARGS[@]}" "${API_ERROR_ARGS[@]}") ;;
    initcheck) SANITIZE_CASES="$INITCHECK_CASES" ;;  # unfiltered (see INITCHECK_CASES above)
    *) args=("${FILTER_ARGS[@]}") ;;
  esac
  echo "== compute-sanitizer --tool $tool${args[*]:+ ${args[*]}}${SANITIZE_CASES:+ (cases $SANITIZE_CASES)}"
  set +e
  "$SANITIZER" --tool "$tool" --error-exitcode 3 --print-limit 20 "${args[@]}" "$PYTHON" "$CASE" 2>&1 | tee "$LOG"
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
