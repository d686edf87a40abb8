# The README's two commands: `make demo` and `make test`. Each creates/updates the virtual
# environment in $(VENV), installs vmamba2d with its extensions and extras, then runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.vmamba2d-installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist, one test file per process at a time); 0 runs the suite in this process.
PYTEST_WORKERS ?= 2
export MAX_JOBS ?= 2

.PHONY: setup demo test test-fast bench ptxas-check sass-report gpu-check gpu-profile cuda-baseline gpu-compare mamba-anchor gpu-anchor gpu-nvrtc gpu-mixed gpu-rs-backward test-gpu-tools clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Torch first (pinned by constraints.txt), then the package built against it without build
# isolation, so pip never swaps the torch build or downloads a second one for the build.
$(STAMP): $(PY) setup.py pyproject.toml constraints.txt $(wildcard csrc/*/*)
	$(PIP) install -c constraints.txt torch torchvision "setuptools>=64" wheel ninja
	$(PIP) install -c constraints.txt --no-build-isolation -e ".[dev,seg,det,mil,onnx,slides]"
	$(PY) -c "import vmamba2d.ops as o; print('vmamba2d backends:', o.backend_info())"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/vmamba2d-demo

test: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop: every test not marked slow (each slow one takes over ~5 s on 2 cores, pytest.ini).
test-fast: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

# Writes to out/ so a run never overwrites the committed, annotated tables in benchmarks/.
bench: setup
	$(PY) benchmarks/bench_scan.py --threads 1 --out out/bench_scan_cpu.md
	$(PY) benchmarks/bench_model.py --batch-sizes 1 16 --train-batch-sizes 1 --out out/bench_model_cpu.md

# Registers / spills / stack / static shared memory of every CUDA kernel instantiation for every
# default arch nvcc supports, checked against the budgets in dev/gpu/ptxas_report.py (needs nvcc;
# no rebuild: uses the venv's python for torch's include dirs when the venv exists).
ptxas-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) dev/gpu/ptxas_report.py --jobs $(MAX_JOBS) --out out/ptxas.md

# Static report of the CUDA kernels for T4 / A100 / RTX 3090 / H100 (no GPU): registers, spills, resident warps
# per SM, SASS instructions of the tile loop per cell, load batching, and the launch planner's waves
# on the model and Table-3 shapes, against the GPU kernels' static targets (dev/gpu/sass_report.py;
# needs nvcc and the built extension, whose planner sizes the blocks).
sass-report: setup
	$(PY) dev/gpu/sass_report.py --jobs $(MAX_JOBS) --out out/sass_report.md

# For a GPU machine: no venv, no network. On that machine's python3 / torch, on the NVRTC path a pip
# install runs: compiles the kernels ahead, runs the v4 benchmark, the CUDA tests, the other benchmarks
# and compute-sanitizer within one 10-minute budget and writes one report to benchmarks/ (see
# dev/gpu/gpu_check.py; GPU_CHECK_ARGS passes options, e.g. --nvcc-build for the nvcc build gpu-nvrtc needs).
GPU_CHECK_ARGS ?=
gpu-check:
	$(PYTHON) dev/gpu/gpu_check.py $(GPU_CHECK_ARGS)

# For a GPU machine, first on a fresh one if need be (no nvcc build; the NVRTC host driver and the
# kernels compile in the run): Nsight Compute counters of the kernels the model runs on the NVRTC path --
# the four-route op at 56x56 bf16 / fp32 and 14x14 bf16, forward and backward, and the four-route
# kernel's top SASS stall sites -- in one report within a 420 s budget (dev/gpu/gpu_profile.py).
# On the lease: make gpu-profile GPU_PROFILE_ARGS="--out $OUT/gpu-profile.md --csv-dir $OUT/ncu"
GPU_PROFILE_ARGS ?= --out benchmarks/gpu-profile.md
gpu-profile:
	PYTHONUNBUFFERED=1 $(PYTHON) dev/gpu/gpu_profile.py $(GPU_PROFILE_ARGS)

# The v3-vs-v2 timing: `make cuda-baseline` here (needs git; CUDA_BASELINE_COMMIT overrides the
# kernel version, default in dev/gpu/cuda_baseline.py) exports the earlier kernel to build/cuda-baseline;
# on the GPU machine (with that folder carried along) `make gpu-check` builds it beside this
# checkout's kernel and times both in its report; `make gpu-compare` does only that.
CUDA_BASELINE_COMMIT ?=
cuda-baseline:
	$(PYTHON) dev/gpu/cuda_baseline.py export $(if $(CUDA_BASELINE_COMMIT),--commit $(CUDA_BASELINE_COMMIT))

gpu-compare:
	$(PYTHON) dev/gpu/gpu_check.py --compare-baseline build/cuda-baseline $(GPU_CHECK_ARGS)

# Issue 39's anchor, mamba_ssm's 1D selective scan: `make mamba-anchor` here (needs the network and
# torch for pip's metadata step) puts the pinned sdist's selective-scan sources in build/mamba-anchor;
# on the GPU machine, with that folder carried along, `make gpu-anchor` builds it forward-only beside
# this checkout's kernel and times both (dev/gpu/bench_anchor.py) in one 10-minute run, report
# benchmarks/gpu-anchor-<date>-<gpu>-<commit>.md.
mamba-anchor:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) dev/gpu/mamba_anchor.py fetch

gpu-anchor:
	$(PYTHON) dev/gpu/gpu_check.py --anchor build/mamba-anchor $(GPU_CHECK_ARGS)

# After `make gpu-check GPU_CHECK_ARGS=--nvcc-build` (which builds _C_cuda in place), on the same
# machine: the kernels compiled at first use by NVRTC -- first-use and warm-start seconds, outputs
# bitwise against the nvcc build's, vmamba2d_tiny batch-1 latency with each (dev/gpu/nvrtc_check.py;
# gpu-check's 10-minute budget is full).
gpu-nvrtc:
	$(PYTHON) dev/gpu/nvrtc_check.py

# Issue 41's measurement, for a GPU session with time after gpu-check (about 8 minutes: 18 worker
# processes, torch.compile in half of them): vmamba2d_tiny / vmamba_tiny / convnext_tiny at batch 128,
# fp32, bf16 and fp16 autocast, eager and torch.compile, inference and training, on the NVRTC kernels
# a pip install runs, each row beside the byte account's estimate, with the GPU time of one inference call and
# one training step by kernel kind (benchmarks/gpu_time.py: how much of a step the GPU is busy, and on what).
gpu-mixed:
	VMAMBA2D_CUDA_KERNELS=nvrtc $(PYTHON) benchmarks/bench_model.py --device cuda --models vmamba2d_tiny vmamba_tiny \
		convnext_tiny --precisions fp32 bf16 amp --compile both --account --profile --batch-sizes 128 --iters 5 --warmup 2 \
		--out benchmarks/gpu-mixed.md

# The four-route op's RS backward (opt-in, VMAMBA2D_SCAN_BACKWARD=auto) against its v3 backward on a GPU:
# the op-level check (gradients, times per SS2D map), then vmamba2d_tiny's training step with it. About 5
# minutes; GPU_OUT is where the two reports go (the device tool's $$OUT to get them back).
GPU_OUT ?= benchmarks
gpu-rs-backward:
	VMAMBA2D_CUDA_KERNELS=nvrtc $(PYTHON) dev/gpu/check_rows_backward.py --cross --out $(GPU_OUT)/rs-cross-backward.md
	VMAMBA2D_CUDA_KERNELS=nvrtc VMAMBA2D_SCAN_BACKWARD=auto $(PYTHON) benchmarks/bench_model.py --device cuda \
		--models vmamba2d_tiny --precisions fp32 bf16 --profile --batch-sizes 128 --iters 5 --warmup 2 \
		--out $(GPU_OUT)/rs-backward-model.md

# The GPU instruments' own tests (dev/gpu/tests: their parsers, report arithmetic and gpu-check's plan,
# run on the CPU), kept out of `make test`; the checks that guard the kernels (host emulation,
# ptxas / NVRTC budgets, static targets) are in tests/ and run there.
test-gpu-tools: setup
	$(PY) -m pytest dev/gpu/tests $(PYTEST_ARGS)

clean:
	rm -rf build *.egg-info vmamba2d/*.so $(STAMP)
