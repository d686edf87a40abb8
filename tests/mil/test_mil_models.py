"""MIL models (vmamba2d.mil.models): sizes, the block against a naive loop, permutation invariance,
1D / 2D equality on line grids, causality on the grid, the pad mask and bad inputs."""
import math

import pytest
import torch
import torch.nn.functional as F

from vmamba2d.mil import ABMIL, MambaMIL, MambaMIL2D, build_model, model_from_checkpoint

SMALL = dict(dim=8, d_state=3, attn_hidden=6)


def _slide(height, width, in_dim, *, holes=(), seed=0, dtype=torch.float64):
    """A slide filling a height x width grid except the (row, col) ``holes``; rows shuffled."""
    gen = torch.Generator().manual_seed(seed)
    cells = [(c, r) for r in range(height) for c in range(width) if (r, c) not in set(holes)]
    coords = torch.tensor(cells, dtype=torch.long)[torch.randperm(len(cells), generator=gen)]
    features = torch.randn(len(cells), in_dim, generator=gen, dtype=dtype)
    return features, coords


def _model(cls, seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(in_dim=5, num_classes=3, **SMALL)
    options.update(kwargs)
    return cls(**options).double().eval()


def test_official_parameter_count():
    # docs/mil.md (model): 265,220 parameters for in_dim 1024, 3 classes, D=128, N=16, U=1.
    model = MambaMIL2D(in_dim=1024, num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == 265_220


def test_survival_head_outputs():
    model = _model(MambaMIL2D, num_classes=4, survival=True)
    features, coords = _slide(3, 4, 5)
    out = model(features, coords)
    assert model.classifier.out_features == 4
    assert out["hazards"].shape == out["survival"].shape == (1, 4)
    hazards = 1 / (1 + torch.exp(-out["logits"][0]))
    expected_surv = torch.tensor([math.prod(1 - h for h in hazards[: k + 1].tolist()) for k in range(4)],
                                 dtype=torch.float64)
    torch.testing.assert_close(out["survival"][0], expected_surv)
    torch.testing.assert_close(out["risk"], -expected_surv.sum().reshape(1))
    assert "probabilities" not in out


def _naive_block(block, x, height, width):
    """The MambaMIL2D block with explicit loops: RMSNorm, in_proj, causal conv, x/dt proj, H then V scan."""
    mixer = block.mixer
    xn = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * block.norm.weight
    u, z = (xn @ mixer.in_proj.weight.t()).chunk(2, dim=-1)  # (L, E)
    length, inner = u.shape
    kernel = mixer.conv.weight[:, 0, :]  # (E, K)
    taps = kernel.shape[1]
    conv = torch.zeros_like(u)
    for p in range(length):
        conv[p] = mixer.conv.bias
        for k in range(taps):
            source = p - (taps - 1) + k
            if source >= 0:
                conv[p] = conv[p] + kernel[:, k] * u[source]
    u = F.silu(conv)
    proj = u @ mixer.x_proj.weight.t()
    rank, nstate = mixer.dt_rank, mixer.d_state
    dt, B, C = proj[:, :rank], proj[:, rank:rank + nstate], proj[:, rank + nstate:]
    delta = F.softplus(dt @ mixer.dt_proj.weight.t() + mixer.dt_proj.bias)  # (L, E)
    A = -torch.exp(mixer.A_log)  # (E, N)
    horizontal = {}
    state = {}
    y = torch.zeros(length, inner, dtype=x.dtype)
    for i in range(height):
        for j in range(width):
            p = i * width + j
            abar = torch.exp(delta[p][:, None] * A)
            xbar = (delta[p] * u[p])[:, None] * B[p][None, :]
            left = horizontal.get((i, j - 1), torch.zeros_like(abar))
            horizontal[(i, j)] = abar * left + xbar
            up = state.get((i - 1, j), torch.zeros_like(abar))
            state[(i, j)] = abar * up + horizontal[(i, j)]
            y[p] = state[(i, j)] @ C[p] + mixer.D * u[p]
    return x + (y * F.silu(z)) @ mixer.out_proj.weight.t()


@pytest.mark.parametrize("init", ["official", "mamba"])
def test_block_matches_naive_loop(init):
    model = _model(MambaMIL2D, init=init)
    height, width = 3, 4
    x = torch.randn(height * width, SMALL["dim"], dtype=torch.float64)
    expected = _naive_block(model.blocks[0], x, height, width)
    torch.testing.assert_close(model.blocks[0](x, height, width), expected)


def test_init_options():
    official = MambaMIL2D(in_dim=16, num_classes=2)
    assert torch.all(official.blocks[0].mixer.dt_proj.bias == 0)
    assert torch.all(official.proj[0].bias == 0) and torch.all(official.classifier.bias == 0)
    mamba = MambaMIL2D(in_dim=16, num_classes=2, init="mamba")
    dt = F.softplus(mamba.blocks[0].mixer.dt_proj.bias)
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 0.1 * 1.001
    pad = official.pad_token
    assert pad.requires_grad and pad.min() >= 0 and pad.max() < 1


@pytest.mark.parametrize("cls, kwargs", [
    (MambaMIL2D, dict(conv="1d")), (MambaMIL2D, dict(conv="2d", mask_pad=False)),
    (MambaMIL, {}), (ABMIL, {}),
])
def test_permutation_invariance(cls, kwargs):
    if cls is ABMIL:
        kwargs = dict(dim=8, attn_hidden=6)
        torch.manual_seed(0)
        model = ABMIL(in_dim=5, num_classes=3, **kwargs).double().eval()
    else:
        model = _model(cls, **kwargs)
    features, coords = _slide(4, 5, 5, holes=[(0, 0), (2, 3), (3, 1)])
    perm = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(1))
    first, second = model(features, coords), model(features[perm], coords[perm])
    torch.testing.assert_close(first["logits"], second["logits"], rtol=0, atol=1e-12)
    torch.testing.assert_close(first["attention"], second["attention"], rtol=0, atol=1e-12)


def test_file_order_1d_depends_on_row_order():
    model = _model(MambaMIL, order="file")
    features, coords = _slide(3, 4, 5)
    perm = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(model(features, coords)["logits"], model(features[perm], coords[perm])["logits"])


@pytest.mark.parametrize("height, width", [(1, 7), (6, 1)])
@pytest.mark.parametrize("num_blocks", [1, 2])
def test_line_grids_equal_the_1d_model(height, width, num_blocks):
    two_d = _model(MambaMIL2D, num_blocks=num_blocks, init="mamba")
    one_d = _model(MambaMIL, num_blocks=num_blocks, seed=1)
    one_d.load_state_dict({k: v for k, v in two_d.state_dict().items() if k != "pad_token"})
    features, coords = _slide(height, width, 5)
    a, b = two_d(features, coords), one_d(features, coords)
    torch.testing.assert_close(a["logits"], b["logits"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a["attention"], b["attention"], rtol=1e-10, atol=1e-12)
    assert a["attention"].shape == (height, width)


@pytest.mark.parametrize("mask_pad", [True, False])
def test_raster_scan_equals_the_2d_model_on_the_flattened_canvas(mask_pad):
    # scan="raster" runs the blocks on the row-major canvas as one 1 x H*W line, pads included: the
    # same as the 2D model on a 1 x H*W grid holding the same cells (coords (x, y) -> (y * W + x, 0)).
    height, width = 4, 6
    raster = _model(MambaMIL2D, scan="raster", mask_pad=mask_pad, init="mamba")
    line = _model(MambaMIL2D, seed=1, mask_pad=mask_pad, init="mamba")
    line.load_state_dict(raster.state_dict())
    features, coords = _slide(height, width, 5, holes=[(0, 0), (2, 3), (3, 5)], seed=4)
    flat = torch.stack([coords[:, 1] * width + coords[:, 0], torch.zeros_like(coords[:, 0])], dim=1)
    a = raster(features, coords, grid_size=(height, width))
    b = line(features, flat, grid_size=(1, height * width))
    torch.testing.assert_close(a["logits"], b["logits"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a["attention"].flatten(), b["attention"].flatten(), rtol=1e-10, atol=1e-12)
    assert a["attention"].shape == (height, width)
    # ... and it is not the 2D scan.
    two_d = _model(MambaMIL2D, seed=2, mask_pad=mask_pad, init="mamba")
    two_d.load_state_dict(raster.state_dict())
    assert not torch.allclose(two_d(features, coords, grid_size=(height, width))["logits"], a["logits"])


def _reach(height, width, conv, num_blocks, taps=4):
    """reach[t, s]: cell s can influence cell t's block output (independent boolean model)."""
    cells = [(i, j) for i in range(height) for j in range(width)]
    length = len(cells)
    scan = torch.tensor([[si <= ti and sj <= tj for (si, sj) in cells] for (ti, tj) in cells])
    if conv == "1d":
        mix = torch.tensor([[0 <= t - s <= taps - 1 for s in range(length)] for t in range(length)])
    else:
        mix = torch.tensor([[abs(si - ti) <= 1 and abs(sj - tj) <= 1 for (si, sj) in cells] for (ti, tj) in cells])
    block = torch.eye(length, dtype=torch.bool) | ((scan.int() @ mix.int()) > 0)
    total = torch.eye(length, dtype=torch.bool)
    for _ in range(num_blocks):
        total = (block.int() @ total.int()) > 0
    return total


@pytest.mark.parametrize("conv, num_blocks", [("1d", 1), ("1d", 2), ("2d", 1)])
def test_causality_on_the_grid(conv, num_blocks):
    height, width = 4, 5
    model = _model(MambaMIL2D, conv=conv, num_blocks=num_blocks, init="mamba")
    features, coords = _slide(height, width, 5)
    features.requires_grad_(True)
    cell_of_row = coords[:, 1] * width + coords[:, 0]
    reach = _reach(height, width, conv, num_blocks)
    weights = torch.randn(SMALL["dim"], dtype=torch.float64)
    tokens, _, _ = model.encode(features, coords)
    scores = model(features, coords)["attention_scores"].flatten()
    for target in range(height * width):
        for value in (tokens[target] @ weights, scores[target]):
            (grad,) = torch.autograd.grad(value, features, retain_graph=True)
            influence = torch.zeros(height * width, dtype=torch.float64)
            influence[cell_of_row] = grad.abs().sum(dim=1)
            assert torch.all(influence[~reach[target]] == 0), f"cell {target} sees cells outside its causal set"
            assert torch.all(influence[reach[target]] > 0), f"cell {target} misses cells of its causal set"
        if conv == "1d":  # nothing later in raster order (below, or right in the same row)
            assert torch.all(influence[target + 1:] == 0)


def test_pad_mask():
    features, coords = _slide(3, 4, 5, holes=[(0, 0), (1, 2), (2, 3)])
    holes = torch.zeros(3, 4, dtype=torch.bool)
    holes[0, 0] = holes[1, 2] = holes[2, 3] = True
    masked = _model(MambaMIL2D, mask_pad=True)
    unmasked = _model(MambaMIL2D, mask_pad=False)
    out = masked(features, coords)
    assert torch.all(out["attention"][holes] == 0)
    torch.testing.assert_close(out["attention"].sum(), torch.tensor(1.0, dtype=torch.float64))
    assert torch.all(unmasked(features, coords)["attention"][holes] > 0)
    # Pad rows appended below all tissue: with the mask the logits do not change (the scan is
    # causal, so tissue tokens are unchanged, and pads get no attention); without it they do.
    taller = (3 + 4, 4)
    torch.testing.assert_close(masked(features, coords, grid_size=taller)["logits"], out["logits"], rtol=0, atol=1e-12)
    base = unmasked(features, coords)["logits"]
    assert (unmasked(features, coords, grid_size=taller)["logits"] - base).abs().max() > 1e-6
    assert masked(features, coords, grid_size=taller)["attention"].shape == taller


@pytest.mark.parametrize("mask_pad", [False, True])
def test_pad_token_gradient(mask_pad):
    model = _model(MambaMIL2D, mask_pad=mask_pad)
    features, coords = _slide(3, 4, 5, holes=[(0, 1), (1, 3)])
    model(features, coords)["logits"].sum().backward()
    assert model.pad_token.grad is not None and model.pad_token.grad.abs().sum() > 0


def test_zero_pad_token_is_fixed():
    model = _model(MambaMIL2D, pad_token="zero")
    assert "pad_token" not in dict(model.named_parameters())
    assert torch.all(model.pad_token == 0)


def test_scan_backends_agree():
    features, coords = _slide(5, 6, 5, holes=[(1, 1)], dtype=torch.float32)
    torch_model = _model(MambaMIL2D, scan_backend="torch").float()
    cpu_model = _model(MambaMIL2D, scan_backend="cpu").float()
    torch.testing.assert_close(torch_model(features, coords)["logits"], cpu_model(features, coords)["logits"],
                               rtol=1e-4, atol=1e-5)


def test_config_and_checkpoint_round_trip(tmp_path):
    model = _model(MambaMIL2D, conv="2d", num_blocks=2, survival=True)
    rebuilt = build_model(**model.config)
    assert rebuilt.config == model.config
    for other in (MambaMIL(in_dim=5, num_classes=2, order="file", dim=8), ABMIL(in_dim=5, num_classes=2, dim=8)):
        copy = build_model(**other.config)
        assert type(copy) is type(other) and copy.config == other.config
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_config": model.config}, path)
    loaded = model_from_checkpoint(path).double().eval()
    features, coords = _slide(3, 3, 5)
    torch.testing.assert_close(loaded(features, coords)["risk"], model(features, coords)["risk"])
    with pytest.raises(ValueError, match="model name"):
        build_model("transmil2d", in_dim=5, num_classes=2)
    torch.save({"model": model.state_dict()}, path)
    with pytest.raises(ValueError, match="model_config"):
        model_from_checkpoint(path)


@pytest.mark.parametrize("features, coords, grid_size, error, match", [
    (torch.randn(4, 6), torch.zeros(4, 2, dtype=torch.long), None, ValueError, r"in_dim=5"),
    (torch.randn(0, 5), torch.zeros(0, 2, dtype=torch.long), None, ValueError, "empty"),
    (torch.randn(3, 5), torch.tensor([[0, 0], [1, 0], [2, 0]], dtype=torch.float32), None, TypeError, "integer"),
    (torch.randn(3, 5), torch.tensor([[0, 0], [1, 0]]), None, ValueError, r"\(3, 2\)"),
    (torch.randn(2, 5), torch.tensor([[0, 0], [-1, 0]]), None, ValueError, "non-negative"),
    (torch.randn(2, 5), torch.tensor([[1, 0], [1, 0]]), None, ValueError, "duplicate"),
    (torch.randn(2, 5), torch.tensor([[0, 0], [3, 1]]), (2, 3), ValueError, "grid_size"),
    (torch.randint(0, 3, (2, 5)), torch.tensor([[0, 0], [1, 0]]), None, TypeError, "floating-point"),
])
@pytest.mark.parametrize("cls", [MambaMIL2D, MambaMIL, ABMIL])
def test_bad_inputs(cls, features, coords, grid_size, error, match):
    model = cls(in_dim=5, num_classes=2, dim=8, attn_hidden=4, **({} if cls is ABMIL else {"d_state": 2}))
    with pytest.raises(error, match=match):
        model(features, coords, grid_size=grid_size)


@pytest.mark.parametrize("kwargs, match", [
    (dict(conv="3d"), "conv"), (dict(pad_token="random"), "pad_token"), (dict(init="xavier"), "init"),
    (dict(num_blocks=0), "num_blocks"), (dict(dropout=1.0), "dropout"), (dict(in_dim=0), "in_dim"),
    (dict(scan="1d"), "scan"), (dict(scan="raster", conv="2d"), "conv='1d'"),
])
def test_bad_options(kwargs, match):
    options = dict(in_dim=5, num_classes=2, dim=8)
    options.update(kwargs)
    with pytest.raises(ValueError, match=match):
        MambaMIL2D(**options)


def test_bench_mil_runs(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_mil

    out = tmp_path / "bench.md"
    bench_mil.main(["--sizes", "3", "5", "--repeats", "1", "--warmup", "0", "--in-dim", "8", "--dim", "8",
                    "--d-state", "2", "--malloc", "default", "--out", str(out)])  # this process's malloc stays
    assert "- CPU malloc: the C library defaults" in out.read_text()
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 3x3") or line.startswith("| 5x5")]
    assert len(rows) == 4 and sum("2DMambaMIL" in r for r in rows) == 2 and sum("MambaMIL (1D" in r for r in rows) == 2
    first = [cell.strip() for cell in rows[0].split("|")[1:-1]]
    assert float(first[2].replace(",", "")) > 0 and first[-1].endswith("x)") and first[-2].endswith("x)")
    # a baseline runs at its own default sizes (DSMIL: no width option), without a 2D / 1D ratio
    bench_mil.main(["--sizes", "3", "--repeats", "1", "--warmup", "0", "--in-dim", "8", "--models", "dsmil",
                    "--no-memory", "--malloc", "default", "--out", str(out)])
    (row,) = [line for line in out.read_text().splitlines() if line.startswith("| 3x3")]
    assert "| DSMIL |" in row and row.endswith("|  |  |")
