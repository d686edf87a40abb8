"""The launch-knob tuner (vmamba2d.ops.tuning) on the CPU with a fake clock: candidates and timed
calls, the process and disk caches (round trip, unusable entries, a folder that cannot be written),
no timing under capture / compile tracing, the VMAMBA2D_TUNE pin, one choice on every DDP rank
(a fake world and a real 2-process gloo group), and that every setting the tuner may pick gives
bit-identical outputs (the RS host emulation at both prefetch depths; the warps-per-block grid
through the recording launcher)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from vmamba2d.ops import tuning
from vmamba2d.ops.compiled import rows_plan

PLAN = rows_plan.rows_plan(4, 4, 14, 0)  # V = 2: six candidates
CANDIDATES = rows_plan.tuning_candidates(PLAN)
KEY = {"gpu": "fake", "sms": 132, "dtype": "fp32", "height": 14, "width": 14, "nstate": 1, "routes": [0]}


class FakeGpu:
    """``run`` records launches; ``timer`` runs the callable and returns the next of that setting's
    costs (seconds, cycling), so a test decides what each candidate measures."""

    def __init__(self, costs=None):
        self.costs = costs or {}
        self.launches: list[dict] = []
        self.timed = 0
        self._seen: dict[tuple, int] = {}

    def run(self, knobs) -> None:
        self.launches.append(dict(knobs))

    def timer(self, fn) -> float:
        fn()
        self.timed += 1
        setting = tuple(sorted(self.launches[-1].items()))
        values = self.costs.get(setting, [1.0])
        count = self._seen.get(setting, 0)
        self._seen[setting] = count + 1
        return values[count % len(values)]


def cost(prefetch, warps):
    return tuple(sorted({"prefetch": prefetch, "warps": warps}.items()))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (tuning.TUNE_ENV, "VMAMBA2D_DEBUG_PLAN"):
        monkeypatch.delenv(name, raising=False)


def make(tmp_path, gpu, **kw):
    return tuning.Tuner(timer=gpu.timer, cache_root=tmp_path, ranks=kw.pop("ranks", lambda: 1),
                        skip_reason=kw.pop("skip_reason", lambda: None))


def test_rs_candidates_are_the_neutral_knobs_default_first():
    for width, dtype_bytes in ((56, 4), (28, 2), (14, 4), (7, 2), (100, 4)):
        plan = rows_plan.rows_plan(dtype_bytes, dtype_bytes, width, 0)
        candidates = rows_plan.tuning_candidates(plan)
        assert candidates[0] == {"prefetch": plan.prefetch, "warps": rows_plan.ROWS_THREADS // 32}
        assert 1 <= len(candidates) <= tuning.MAX_CANDIDATES
        assert len({tuple(c.items()) for c in candidates}) == len(candidates)
        assert {c["warps"] for c in candidates} == {4, 2, 1}
        assert {c["prefetch"] for c in candidates} == ({1, 2} if plan.vec <= 2 else {1})


def test_first_call_times_each_candidate_three_times(tmp_path):
    gpu = FakeGpu({cost(2, 1): [0.5], cost(1, 2): [0.7]})
    choice = make(tmp_path, gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    assert choice.source == "tuned" and dict(choice.knobs) == {"prefetch": 2, "warps": 1}
    assert gpu.timed == tuning.TIMED_CALLS * len(CANDIDATES) == 18
    assert len(gpu.launches) == (1 + tuning.TIMED_CALLS) * len(CANDIDATES)  # one untimed call each first
    assert [gpu.launches[i * 4] for i in range(6)] == CANDIDATES
    assert len(choice.medians) == 6 and min(choice.medians) == 0.5


def test_the_median_decides_and_ties_keep_the_earlier(tmp_path):
    gpu = FakeGpu({cost(1, 2): [9.0, 0.1, 9.0], cost(2, 4): [0.8, 0.8, 0.9], cost(1, 1): [0.8, 0.7, 0.9]})
    assert dict(make(tmp_path / "a", gpu).choose("k", KEY, CANDIDATES, gpu.run).knobs) == {"prefetch": 1, "warps": 1}
    gpu = FakeGpu()  # every candidate 1.0: the default stays
    assert make(tmp_path / "b", gpu).choose("k", KEY, CANDIDATES, gpu.run).knobs == CANDIDATES[0]


def test_second_call_is_a_process_cache_hit(tmp_path):
    gpu = FakeGpu({cost(1, 2): [0.5]})
    tuner = make(tmp_path, gpu)
    first = tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    launches = len(gpu.launches)
    second = tuner.choose("cuda-rs", dict(KEY), CANDIDATES, gpu.run)
    assert second.source == "process" and second.knobs == first.knobs and len(gpu.launches) == launches
    other = tuner.choose("cuda-rs", {**KEY, "width": 28}, CANDIDATES, gpu.run)  # another key: tuned again
    assert other.source == "tuned" and len(gpu.launches) == 2 * launches
    assert [c["source"] for c in tuner.chosen()] == ["tuned", "tuned"]


def test_disk_round_trip(tmp_path):
    gpu = FakeGpu({cost(2, 2): [0.25]})
    chosen = make(tmp_path, gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    files = list((tmp_path / "tuning" / "cuda-rs").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"  # no temporary file left
    entry = json.loads(files[0].read_text())
    assert entry["knobs"] == {"prefetch": 2, "warps": 2} and json.loads(entry["key"])["gpu"] == "fake"
    fresh = FakeGpu()
    again = make(tmp_path, fresh).choose("cuda-rs", KEY, CANDIDATES, fresh.run)  # a new process
    assert again.source == "disk" and again.knobs == chosen.knobs and fresh.launches == []


def _corrupt(tmp_path, text):
    gpu = FakeGpu({cost(1, 1): [0.1]})
    make(tmp_path, gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    (path,) = (tmp_path / "tuning" / "cuda-rs").iterdir()
    path.write_text(text(path.read_text()))
    return path


@pytest.mark.parametrize("damage", [
    lambda t: t[: len(t) // 2],  # torn
    lambda t: "not json",
    lambda t: t.replace('\\"width\\": 14', '\\"width\\": 15'),  # another key's entry
    lambda t: t.replace('"warps": 1', '"warps": 3'),  # a setting that is no candidate
], ids=["torn", "garbage", "other-key", "no-candidate"])
def test_unusable_entry_is_tuned_again_with_one_warning(tmp_path, damage):
    path = _corrupt(tmp_path, damage)
    gpu = FakeGpu({cost(1, 2): [0.1]})
    with pytest.warns(RuntimeWarning, match="tuning cache entry .* is unusable") as caught:
        choice = make(tmp_path, gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    assert len(caught) == 1 and len(str(caught[0].message).splitlines()) == 1
    assert choice.source == "tuned" and dict(choice.knobs) == {"prefetch": 1, "warps": 2}
    assert json.loads(path.read_text())["knobs"] == {"prefetch": 1, "warps": 2}  # rewritten


@pytest.mark.parametrize("how", ["read-only", "not-a-folder"])
def test_unwritable_folder_keeps_the_choice_in_the_process(tmp_path, how, request):
    root = tmp_path / "root"
    if how == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        folders = (root / "tuning" / "cuda-rs", root / "tuning", root)
        folders[0].mkdir(parents=True)
        for folder in folders:
            folder.chmod(0o555)
        request.addfinalizer(lambda: [folder.chmod(0o755) for folder in folders])
    else:
        root.write_text("a file where the cache folder should be")  # fails for root too
    gpu = FakeGpu({cost(2, 4): [0.1]})
    tuner = make(root, gpu)
    with pytest.warns(RuntimeWarning, match="cannot write the tuning cache") as caught:
        choice = tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
        tuner.choose("cuda-rs", {**KEY, "width": 28}, CANDIDATES, gpu.run)
    assert len(caught) == 1  # once per folder
    assert choice.source == "tuned" and dict(choice.knobs) == {"prefetch": 2, "warps": 4}
    assert tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).source == "process"


@pytest.mark.parametrize("why", ["CUDA-graph capture", "torch.compile tracing"])
def test_no_timing_under_capture_or_tracing(tmp_path, why):
    state = {"skip": why}
    gpu = FakeGpu({cost(2, 1): [0.1]})
    tuner = make(tmp_path, gpu, skip_reason=lambda: state["skip"])
    choice = tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    assert choice.knobs == CANDIDATES[0] and choice.source == f"skipped: {why}" and gpu.launches == []
    assert not (tmp_path / "tuning").exists()
    state["skip"] = None  # not stored: the next eager call tunes
    assert tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).source == "tuned"
    state["skip"] = why  # and a choice made before is used under capture
    assert dict(tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).knobs) == {"prefetch": 2, "warps": 1}


def test_tracing_reason_sees_capture_and_compile(monkeypatch):
    assert tuning.tracing_reason() is None
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tuning.tracing_reason() == "CUDA-graph capture"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert tuning.tracing_reason() == "torch.compile tracing"


def test_tracing_reason_inside_a_compiled_function():
    """Under real torch.compile tracing (eager backend, CPU) the probe says so; outside it does not."""
    torch._dynamo.reset()

    def probe(x):
        return x + (1.0 if tuning.tracing_reason() == "torch.compile tracing" else 0.0)

    assert torch.compile(probe, backend="eager")(torch.zeros(2)).tolist() == [1.0, 1.0]
    assert probe(torch.zeros(2)).tolist() == [0.0, 0.0]


def test_env_pin(tmp_path, monkeypatch):
    gpu = FakeGpu({cost(2, 1): [0.1]})
    tuner = make(tmp_path, gpu)
    monkeypatch.setenv(tuning.TUNE_ENV, "off")
    assert tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).knobs == CANDIDATES[0]
    monkeypatch.setenv(tuning.TUNE_ENV, "warps=2")
    assert dict(tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).knobs) == {"prefetch": 1, "warps": 2}
    monkeypatch.setenv(tuning.TUNE_ENV, " prefetch=2, warps=1 ")
    pinned = tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    assert pinned.source == "pinned" and dict(pinned.knobs) == {"prefetch": 2, "warps": 1}
    monkeypatch.setenv(tuning.TUNE_ENV, "block_m=16,warps=1")  # a knob this kernel lacks is ignored
    assert dict(tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).knobs) == {"prefetch": 1, "warps": 1}
    assert gpu.launches == [] and not (tmp_path / "tuning").exists()
    monkeypatch.setenv(tuning.TUNE_ENV, "warps=3")
    with pytest.raises(ValueError, match="VMAMBA2D_TUNE: warps=3 is not a bit-neutral setting of cuda-rs"):
        tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    for bad in ("fast", "threads=2", "warps=0", "warps=two", "warps=1,warps=2"):
        monkeypatch.setenv(tuning.TUNE_ENV, bad)
        with pytest.raises(ValueError, match="VMAMBA2D_TUNE: expected auto, off or knob=value pairs"):
            tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    monkeypatch.setenv(tuning.TUNE_ENV, "auto")
    assert tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run).source == "tuned"


def test_every_rank_runs_the_default_under_ddp(tmp_path):
    gpu = FakeGpu({cost(2, 2): [0.1]})
    make(tmp_path, gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run)  # a tuned entry on this node's disk
    for rank_clock in ({cost(1, 2): [0.1]}, {cost(2, 1): [0.1]}):
        ranked = FakeGpu(rank_clock)
        choice = make(tmp_path, ranked, ranks=lambda: 2).choose("cuda-rs", KEY, CANDIDATES, ranked.run)
        assert choice.knobs == CANDIDATES[0] and choice.source == "distributed" and ranked.launches == []


def _gloo_rank(rank: int, world: int, folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        gpu = FakeGpu({cost(2, 1 + rank): [0.1]})  # each rank's clock favours another setting
        tuner = tuning.Tuner(timer=gpu.timer, cache_root=Path(folder) / f"cache{rank}")
        choice = tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
        Path(folder, f"rank{rank}.json").write_text(json.dumps([dict(choice.knobs), choice.source, len(gpu.launches)]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gloo_ranks_agree(tmp_path):
    """Two real processes in a gloo group, each with a clock that would pick another setting alone."""
    import torch.multiprocessing as mp

    # gloo's TCP mesh set-up on a loaded 2-core machine has dropped a connection once in CI ("Gloo
    # connectFullMesh failed ... Connection closed by peer", before any tuning ran): one more try in
    # a fresh rendezvous folder; a wrong agreement fails on the first try.
    for attempt in range(2):
        folder = tmp_path / f"attempt{attempt}"
        folder.mkdir()
        try:
            mp.spawn(_gloo_rank, args=(2, str(folder)), nprocs=2, join=True)
            break
        except mp.ProcessRaisedException as err:
            if attempt or "connectFullMesh" not in str(err):
                raise
    results = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1] == [CANDIDATES[0], "distributed", 0]
    alone = []
    for rank in range(2):
        gpu = FakeGpu({cost(2, 1 + rank): [0.1]})
        alone.append(dict(make(tmp_path / f"alone{rank}", gpu).choose("cuda-rs", KEY, CANDIDATES, gpu.run).knobs))
    assert alone[0] != alone[1]


def test_candidate_lists_are_checked(tmp_path):
    gpu = FakeGpu()
    tuner = make(tmp_path, gpu)
    with pytest.raises(ValueError, match="candidates: expected 1 to 6 distinct settings"):
        tuner.choose("k", KEY, [{"warps": w} for w in range(1, 8)], gpu.run)
    with pytest.raises(ValueError, match="distinct"):
        tuner.choose("k", KEY, [{"warps": 1}, {"warps": 1}], gpu.run)


def test_debug_env_prints_each_choice_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VMAMBA2D_DEBUG_PLAN", "1")
    gpu = FakeGpu({cost(1, 1): [0.002]})
    tuner = make(tmp_path, gpu)
    for _ in range(3):
        tuner.choose("cuda-rs", KEY, CANDIDATES, gpu.run)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("vmamba2d tuning: {") and "-> {'prefetch': 1, 'warps': 1} (tuned, medians [" in line


def test_backend_info_shows_the_tuner(monkeypatch, tmp_path):
    from vmamba2d.ops import backend_info

    monkeypatch.setenv("VMAMBA2D_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(tuning.TUNE_ENV, "off")
    info = backend_info()
    assert info["scan_tuning"]["setting"] == "off" and info["scan_tuning"]["cache"] == str(tmp_path / "tuning")
    assert "L <= 64: PL" in info["scan_plan"]["rule"]


# Every setting the tuner may pick computes the same bits.

def _emulation_inputs(batch, dim, height, width, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    L = height * width
    u, delta = (torch.randn(batch, dim, L, generator=g).to(dtype) for _ in range(2))
    B, C = (torch.randn(batch, 1, 1, L, generator=g).to(dtype) for _ in range(2))
    return dict(u=u, delta=delta, A=-torch.rand(dim, 1, generator=g) - 0.1, B=B, C=C, D=torch.randn(dim, generator=g),
                delta_bias=torch.randn(dim, generator=g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("height,width", [(7, 7), (14, 14), (5, 13), (3, 28)])
def test_prefetch_candidates_are_bit_identical_on_the_emulation(dtype, height, width):
    """The RS host emulation runs P = 1 on even schedule orders and P = 2 on odd ones (the kernel
    body the GPU compiles): every prefetch depth among a plan's candidates gives the same bits."""
    from support.cuda_emulation_build import rows_emulation

    emulation = rows_emulation()
    size = torch.empty((), dtype=dtype).element_size()
    plan = rows_plan.rows_plan(size, size, width, 0)
    depths = sorted({c["prefetch"] for c in rows_plan.tuning_candidates(plan)})
    x = _emulation_inputs(3, 5, height, width, dtype, seed=height * 100 + width)
    outputs = []
    for depth in depths:
        for order in (depth - 1, depth + 1):  # in order / shuffled warps and lanes, at this depth
            outputs.append(emulation.rows_forward(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["delta_bias"],
                                                  True, height, width, 0, False, order, plan.vec, plan.load))
    assert len(depths) == (2 if plan.vec <= 2 else 1)
    assert all(torch.equal(outputs[0].view(torch.int16 if size == 2 else torch.int32),
                           y.view(torch.int16 if size == 2 else torch.int32)) for y in outputs[1:])
    assert not outputs[0].isnan().any()


def test_launch_runs_the_tuned_setting_and_covers_every_map(tmp_path):
    """Through the NVRTC launcher and a recording driver: each candidate's launch has 32 x warps
    threads, a grid covering every warp item once, and the spec compiled with its prefetch depth;
    the call's own launch is the tuner's pick."""
    from vmamba2d.ops.compiled import cuda_launch, kernel_cache, nvrtc, rows_launch

    try:
        toolchain = nvrtc.find_toolchain()
    except nvrtc.NvrtcUnavailable as err:
        pytest.skip(f"no NVRTC toolchain: {err}")
    from support.nvrtc_recording import RecordingDriver

    batch, dim, side = 3, 10, 14
    x = _emulation_inputs(batch, dim, side, side, torch.float32, seed=1)
    B, C = (x[k].view(batch, 1, 1, side * side) for k in ("B", "C"))
    design, plan, _ = rows_launch.forward_design(x["u"], x["delta"], x["A"], B, C, x["D"], x["delta_bias"], side,
                                                 False, False)
    assert design == "rs" and plan.vec == 2
    target = nvrtc.target_for(90, toolchain.archs)
    for c in rows_plan.tuning_candidates(plan):  # fake images for each candidate's spec
        spec = rows_launch.plan_spec(dataclasses.replace(plan, prefetch=c["prefetch"]), torch.float32)
        key = nvrtc.cache_key(toolchain, spec, target)
        kernel = nvrtc.CompiledKernel(spec.name, 90, target, b"image", f"sym_{spec.file_stem}")
        kernel_cache.write_entry(kernel_cache.entry_path(tmp_path / "k", key), kernel_cache.encode_entry(key, kernel))
    driver = RecordingDriver()
    launcher = cuda_launch.KernelLauncher(driver, tmp_path / "k", toolchain, current_device=lambda: 0,
                                          stream_of=lambda d: 7, device_arch=lambda d: 90)
    def timer(fn):
        fn()
        launch = driver.of("launch")[-1]
        return {32: 0.3, 64: 0.2, 128: 0.4}[launch[3]] * (1 if "p2" in launch[1][2] else 2)

    tuner = tuning.Tuner(timer=timer, cache_root=tmp_path / "t", ranks=lambda: 1, skip_reason=lambda: None)
    rows_launch.launch_rows_forward(launcher, x["u"], x["delta"], x["A"], B, C, x["D"], x["delta_bias"], True, side,
                                    side, False, plan, tuner=tuner)
    launches = driver.of("launch")
    assert len(launches) == 6 * 4 + 1
    items = -(-batch * dim // plan.maps_per_warp)
    for launch in launches:
        warps = launch[3] // 32
        assert launch[3] in (32, 64, 128) and launch[2][0] * warps >= items > (launch[2][0] - 1) * warps
    assert launches[-1][3] == 64 and "p2" in launches[-1][1][2]  # prefetch 2, 2 warps per block: the fastest
    specs = {rows_launch.plan_spec(dataclasses.replace(plan, prefetch=p), torch.float32) for p in (1, 2)}
    assert {launch[1][2] for launch in launches} == {f"sym_{spec.file_stem}" for spec in specs}


TRITON_CANDIDATES_SCRIPT = r"""
import json, os, sys
import torch
from vmamba2d.ops import tuning
from vmamba2d.ops.triton import rows_plan

g = torch.Generator().manual_seed(3)
maps, chans, height, width = 2, 6, 5, 9
configs = rows_plan.tuning_configs(rows_plan.block_width(width))
bit_equal, launches = [], []
for dtype in (torch.float32, torch.bfloat16):
    u = torch.randn(maps, chans, height, width, generator=g).to(dtype)
    delta = torch.randn(maps, 1, chans, height, width, generator=g).to(dtype)
    B, C = (torch.randn(maps, 1, 1, height, width, generator=g).to(dtype) for _ in range(2))
    A, D, bias = -torch.rand(chans, 1, generator=g), torch.randn(chans, generator=g), torch.randn(chans, generator=g)
    args = (u, delta, A, B, C, D, bias, True, False, 1)
    ys = []
    for block_m, warps in configs:  # each candidate, pinned
        os.environ[tuning.TUNE_ENV] = f"block_m={block_m},warps={warps}"
        ys.append(rows_plan.launch_rows_forward(*args, tuner=tuning.Tuner(cache_root=sys.argv[1])))
    as_int = torch.int32 if dtype == torch.float32 else torch.int16
    bit_equal.append(all(torch.equal(ys[0].view(as_int), y.view(as_int)) for y in ys[1:]))
del os.environ[tuning.TUNE_ENV]
def timer(fn):  # the last candidate is the fastest
    fn()
    return 0.1 if launches[-1] == configs[-1] else 1.0
tuner = tuning.Tuner(timer=timer, cache_root=sys.argv[1], ranks=lambda: 1, skip_reason=lambda: None)
original = tuner.choose
def recording_choose(kernel, key, candidates, run):
    def recording(knobs):
        launches.append((knobs["block_m"], knobs["warps"]))
        run(knobs)
    return original(kernel, key, candidates, recording)
tuner.choose = recording_choose
rows_plan.launch_rows_forward(*args, tuner=tuner)
(chosen,) = tuner.chosen()
print(json.dumps({"bit_equal": bit_equal, "configs": len(configs), "launches": len(launches),
                  "chosen": [chosen["knobs"]["block_m"], chosen["knobs"]["warps"]], "last": list(configs[-1])}))
"""


@pytest.mark.slow
def test_triton_candidates_are_bit_identical_in_the_interpreter(tmp_path):
    """Triton's interpreter runs the Triton RS kernel once per (BLOCK_M, num_warps) candidate (pinned by
    VMAMBA2D_TUNE): the same bits in fp32 and bf16; and a tuning through launch_rows_forward with a
    fake clock times each candidate and launches the pick. (The interpreter does not
    model warps: it holds the channel tiling neutral; tests/ops/triton/test_scan_triton_rows.py compares the
    compiled row layouts of the candidates.)"""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop(tuning.TUNE_ENV, None)
    result = subprocess.run([sys.executable, "-c", TRITON_CANDIDATES_SCRIPT, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["bit_equal"] == [True, True] and report["configs"] == 4
    assert report["launches"] == 4 * (1 + tuning.TIMED_CALLS) and report["chosen"] == report["last"]
