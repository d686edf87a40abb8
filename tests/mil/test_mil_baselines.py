"""The paper's MIL baselines (vmamba2d.mil.models.baselines): sizes at the official defaults,
outputs, survival heads, one training step, order (in)variance, the loss terms, bad input, and
the layers (Nyström attention, S4D, SRMamba reordering, DSMIL's bag stream) against independent
references."""
import math

import pytest
import torch
import torch.nn.functional as F

from vmamba2d.mil import MODELS, SlideRecord, build_model
from vmamba2d.mil.engine import resolve_loss_weights, train_one_epoch, training_loss
from vmamba2d.mil.models.baselines import CLAMSB, DSMIL, SRMambaMixer, stride_reorder, stride_restore
from vmamba2d.mil.models.mamba import MambaMixer
from vmamba2d.mil.models.nystrom import NystromAttention, iterative_pinv
from vmamba2d.mil.models.s4d import S4D


def linear(n_in, n_out, bias=True):
    return n_in * n_out + (n_out if bias else 0)


# Parameter counts at in_dim 1024 and 3 classes, derived from the architectures of the sources.
F_IN, C = 1024, 3
MAMBA_INNER, DT_RANK, N_STATE = 256, 8, 16  # expand 2 x 128, ceil(128 / 16), d_state 16
SR_BRANCH = ((MAMBA_INNER * 4 + MAMBA_INNER) + linear(MAMBA_INNER, DT_RANK + 2 * N_STATE, bias=False)
             + linear(DT_RANK, MAMBA_INNER) + MAMBA_INNER * N_STATE + MAMBA_INNER)  # conv, x/dt proj, A_log, D
NYSTROM_LAYER = 2 * 512 + linear(512, 3 * 512, bias=False) + linear(512, 512) + 8 * 33  # norm, qkv, out, res conv
PARAMETER_COUNTS = {
    # 2DMamba repository models/ABMIL.py, DAttention(act='relu'): feature 1024 -> 512, attention
    # 512 -> 128 -> 1, classifier 512 -> C.
    "abmil": (linear(F_IN, 512) + linear(512, 128) + linear(128, 1) + linear(512, C), 592_132),
    # CLAM models/model_clam.py, CLAM_SB(size "small" = [1024, 512, 256], gate=True): fc, gated
    # attention a / b (512 -> 256) and c (256 -> 1), bag classifier, one 512 -> 2 instance
    # classifier per class.
    "clam_sb": (linear(F_IN, 512) + 2 * linear(512, 256) + linear(256, 1) + linear(512, C) + C * linear(512, 2),
                792_330),
    # DSMIL dsmil.py (FCLayer instance classifier, BClassifier(nonlinear=True, passing_v=False)):
    # instance classifier 1024 -> C, queries 1024 -> 128 -> 128, Conv1d(C, C, kernel 1024).
    "dsmil": (linear(F_IN, C) + linear(F_IN, 128) + linear(128, 128) + (C * C * F_IN + C), 160_006),
    # TransMIL as the MambaMIL / 2DMamba trainers build it: fc 1024 -> 512, class token, two
    # TransLayers (LayerNorm + Nyström attention, 8 heads x 64, residual conv (33, 1) per head),
    # PPEG (depthwise 7x7, 5x5, 3x3 with bias), LayerNorm, classifier.
    "transmil": (linear(F_IN, 512) + 512 + 2 * NYSTROM_LAYER + sum(512 * k * k + 512 for k in (7, 5, 3))
                 + 2 * 512 + linear(512, C), 2_672_659),
    # S4MIL (models/S4MIL.py, S4Model): fc 1024 -> 512, LayerNorm, S4D(512, d_state 32): D, log_dt,
    # C (16 complex = 32 reals), log_A_real (16), A_imag (16) per channel, Conv1d(512, 1024, 1) + GLU.
    "s4mil": (linear(F_IN, 512) + 2 * 512 + 512 * (1 + 1 + 32 + 16 + 16) + linear(512, 1024) + linear(512, C),
              1_086_467),
    # MambaMIL as the 2DMamba repository configures it (docs/mil.md#baselines): fc 1024 -> 128,
    # LayerNorm + SRMamba (in_proj 128 -> 512, main and reordered branch, out_proj 256 -> 128),
    # LayerNorm, attention 128 -> 64 -> 1, classifier.
    "mambamil_sr": (linear(F_IN, 128) + 2 * 128 + linear(128, 2 * MAMBA_INNER, bias=False) + 2 * SR_BRANCH
                    + linear(MAMBA_INNER, 128, bias=False) + 2 * 128 + linear(128, 64) + linear(64, 1)
                    + linear(128, C), 275_076),
}
BASELINES = sorted(PARAMETER_COUNTS)
# Small versions for the behavioural tests.
SMALL = {
    "abmil": dict(dim=8, attn_hidden=6),
    "clam_sb": dict(dim=8, attn_hidden=6, k_sample=2),
    "dsmil": dict(query_dim=6),
    "transmil": dict(dim=8, heads=2, landmarks=4, residual_kernel=3),
    "s4mil": dict(dim=8, d_state=4),
    "mambamil_sr": dict(dim=8, d_state=3, attn_hidden=6, rate=3),
}


def _slide(height, width, in_dim=5, *, holes=(), seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    cells = [(c, r) for r in range(height) for c in range(width) if (r, c) not in set(holes)]
    coords = torch.tensor(cells, dtype=torch.long)[torch.randperm(len(cells), generator=gen)]
    return torch.randn(len(cells), in_dim, generator=gen, dtype=dtype), coords


def _model(name, seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(in_dim=5, num_classes=3, **SMALL[name])
    options.update(kwargs)
    return build_model(name, **options).double().eval()


@pytest.mark.parametrize("name", BASELINES)
def test_parameter_count_at_the_official_defaults(name):
    derived, stated = PARAMETER_COUNTS[name]
    assert derived == stated
    model = build_model(name, in_dim=1024, num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == stated


def test_abmil_keeps_the_previous_variant():
    model = build_model("abmil", in_dim=1024, num_classes=3, dim=128, act="gelu", init="xavier")
    assert sum(p.numel() for p in model.parameters()) == 148_228
    assert isinstance(model.proj[1], torch.nn.GELU) and torch.all(model.classifier.bias == 0)
    official = build_model("abmil", in_dim=1024, num_classes=3)
    assert isinstance(official.proj[1], torch.nn.ReLU) and official.classifier.bias.abs().sum() > 0


@pytest.mark.parametrize("name", BASELINES)
def test_outputs_and_attention_maps(name):
    model = _model(name)
    features, coords = _slide(3, 4, holes=[(0, 0), (2, 1)])
    out = model(features, coords)
    assert out["logits"].shape == out["probabilities"].shape == (1, 3)
    torch.testing.assert_close(out["probabilities"], torch.softmax(out["logits"], dim=1))
    assert ("attention" in out) == model.has_attention == (name not in ("transmil", "s4mil"))
    if model.has_attention:
        attention = out["attention"]
        assert attention.shape == (3, 4) and attention[0, 0] == 0 and attention[2, 1] == 0
        torch.testing.assert_close(attention.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert torch.all(attention[attention != 0] > 0)


@pytest.mark.parametrize("name", BASELINES)
def test_survival_head(name):
    model = _model(name, num_classes=4, survival=True)
    out = model(*_slide(3, 3))
    assert out["logits"].shape == out["hazards"].shape == out["survival"].shape == (1, 4)
    hazards = [1 / (1 + math.exp(-v)) for v in out["logits"][0].tolist()]
    survival = [math.prod(1 - h for h in hazards[: k + 1]) for k in range(4)]
    torch.testing.assert_close(out["survival"][0], torch.tensor(survival, dtype=torch.float64))
    torch.testing.assert_close(out["risk"], torch.tensor([-sum(survival)], dtype=torch.float64))
    assert "probabilities" not in out


def _records(count, in_dim=5, task="classification"):
    records = []
    for index in range(count):
        features, coords = _slide(3, 4, in_dim, holes=[(1, 1)], seed=index, dtype=torch.float32)
        records.append(SlideRecord(f"s{index}", features, coords, (3, 4), (0, 0), (512, 512), label=index % 2,
                                   case_id=f"c{index}", time=10.0 + index, censorship=index % 2))
    return records


@pytest.mark.parametrize("task", ["classification", "survival"])
@pytest.mark.parametrize("name", BASELINES)
def test_one_training_step_changes_the_weights(name, task):
    torch.manual_seed(0)
    model = build_model(name, in_dim=5, num_classes=3, survival=task == "survival", **SMALL[name])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = train_one_epoch(model=model, dataset=_records(2), order=[0, 1], optimizer=optimizer,
                            scaler=torch.amp.GradScaler("cpu", enabled=False), task=task, alpha=0.0,
                            device=torch.device("cpu"), amp="none", workers=0, seed=0, epoch=0, progress=False)
    assert math.isfinite(stats["train_loss"])
    assert set(k for k in stats if k.startswith("train_loss_")) == (
        {f"train_loss_{t}" for t in model.loss_weights} if len(model.loss_weights) > 1 else set())
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert "classifier.weight" in changed or "bag_classifier.weight" in changed


@pytest.mark.parametrize("name", BASELINES)
def test_order_and_position_claims(name):
    # Bag models ignore the row order and the grid positions; sequence models (raster order, the
    # default) ignore the row order but not the positions, and with order="file" depend on the rows.
    model = _model(name)
    features, coords = _slide(4, 5, holes=[(0, 0), (3, 4)])
    logits = model(features, coords)["logits"]
    perm = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(features[perm], coords[perm])["logits"], logits, rtol=0, atol=1e-12)
    moved = coords[torch.randperm(coords.shape[0], generator=torch.Generator().manual_seed(2))]
    moved_logits = model(features, moved)["logits"]
    if model.permutation_invariant:
        assert name in ("abmil", "clam_sb", "dsmil")
        torch.testing.assert_close(moved_logits, logits, rtol=0, atol=1e-12)
    else:
        assert not torch.allclose(moved_logits, logits)
        file_order = _model(name, order="file")
        assert not torch.allclose(file_order(features[perm], coords[perm])["logits"],
                                  file_order(features, coords)["logits"])


@pytest.mark.parametrize("name, kwargs, match", [
    ("abmil", dict(act="tanh"), "act"), ("abmil", dict(init="official"), "init"),
    ("clam_sb", dict(k_sample=0), "k_sample"), ("clam_sb", dict(dropout=1.0), "dropout"),
    ("dsmil", dict(query_dim=0), "query_dim"), ("dsmil", dict(dropout_v=-0.1), "dropout_v"),
    ("transmil", dict(dim=10, heads=4), "multiple of heads"), ("transmil", dict(order="random"), "order"),
    ("transmil", dict(residual_kernel=4), "residual_kernel"), ("s4mil", dict(d_state=3), "even"),
    ("mambamil_sr", dict(rate=0), "rate"), ("mambamil_sr", dict(init="torch"), "init"),
])
def test_bad_options_are_named(name, kwargs, match):
    options = dict(in_dim=5, num_classes=2, **SMALL[name])
    options.update(kwargs)
    with pytest.raises(ValueError, match=match):
        build_model(name, **options)


@pytest.mark.parametrize("name", BASELINES)
def test_bad_slides_are_named(name):
    model = _model(name)
    with pytest.raises(ValueError, match=r"in_dim=5"):
        model(torch.randn(3, 6, dtype=torch.float64), torch.tensor([[0, 0], [1, 0], [2, 0]]))
    with pytest.raises(ValueError, match="duplicate"):
        model(torch.randn(2, 5, dtype=torch.float64), torch.tensor([[1, 0], [1, 0]]))
    with pytest.raises(TypeError, match="integer"):
        model(torch.randn(2, 5, dtype=torch.float64), torch.tensor([[0.0, 0.0], [1.0, 0.0]]))


def test_every_model_round_trips_through_its_config():
    for name in MODELS:
        model = build_model(name, in_dim=5, num_classes=2, **SMALL.get(name, {}))
        copy = build_model(**model.config)
        assert type(copy) is type(model) and copy.config == model.config


# --- loss terms -----------------------------------------------------------------------------------

def _cross_entropy(logits, target):
    return -(logits[target] - torch.logsumexp(logits, dim=0))


@pytest.mark.parametrize("subtyping", [False, True])
def test_clam_instance_loss_by_hand(subtyping):
    model = _model("clam_sb", subtyping=subtyping, k_sample=3)
    features, coords = _slide(3, 3, seed=5)
    out = model(features, coords)
    label = 1
    tokens, scores = out["instance_tokens"], out["instance_scores"]
    ranked = sorted(range(len(scores)), key=lambda i: -float(scores[i].detach()))
    top, bottom = ranked[:3], ranked[-3:]
    per_classifier = []  # CLAM: cross-entropy averaged over each classifier's patches
    for c in range(3):
        layer = model.instance_classifiers[c]
        if c == label:
            terms = [_cross_entropy(layer(tokens[i]), 1) for i in top] + [_cross_entropy(layer(tokens[i]), 0)
                                                                            for i in bottom]
        elif subtyping:
            terms = [_cross_entropy(layer(tokens[i]), 0) for i in top]
        else:
            continue
        per_classifier.append(torch.stack(terms).mean())
    loss = sum(per_classifier) / (3 if subtyping else 1)
    aux = model.auxiliary_losses(out, label, lambda logits: torch.zeros(()))
    torch.testing.assert_close(aux["instance"], loss)
    # the engine adds the terms with CLAM's weights 0.7 / 0.3
    record = SlideRecord("s", features, coords, (3, 3), (0, 0), (1, 1), label=label)
    total, terms = training_loss(model, out, record, "classification", 0.0, torch.device("cpu"), model.loss_weights)
    slide = F.cross_entropy(out["logits"], torch.tensor([label]))
    torch.testing.assert_close(total.double(), 0.7 * slide + 0.3 * loss, rtol=1e-6, atol=1e-6)  # the engine's task loss is fp32
    assert terms.keys() == {"slide", "instance"}


def test_clam_uses_all_patches_when_a_slide_has_fewer_than_k():
    model = _model("clam_sb", k_sample=8)
    out = model(*_slide(1, 3))
    assert torch.isfinite(model.auxiliary_losses(out, 0, None)["instance"])
    with pytest.raises(ValueError, match="label"):
        model.auxiliary_losses(out, 3, None)


def test_dsmil_bag_stream_against_a_per_class_loop():
    # the per-class loop of DSMIL's first public version: sort each class's instance scores,
    # attend by the query similarity to the top instance, classify the C bag vectors with Conv1d.
    model = _model("dsmil")
    features, coords = _slide(3, 4, seed=3)
    out = model(features, coords)
    order = torch.argsort(coords[:, 1] * 4 + coords[:, 0])
    feats = features[order]
    instance = feats @ model.instance_classifier.weight.t() + model.instance_classifier.bias
    torch.testing.assert_close(out["instance_logits"], instance)
    queries = model.query(feats)
    bags = []
    for c in range(3):
        top = sorted(range(len(feats)), key=lambda i: -float(instance[i, c].detach()))[0]
        attention = torch.softmax(queries @ model.query(feats[top]) / math.sqrt(6), dim=0)
        bags.append((attention[:, None] * feats).sum(0))
    weight, bias = model.bag_classifier.weight, model.bag_classifier.bias
    logits = torch.stack([sum((weight[c, d] * bags[d]).sum() for d in range(3)) + bias[c] for c in range(3)])
    torch.testing.assert_close(out["logits"][0], logits)
    record = SlideRecord("s", features, coords, (3, 4), (0, 0), (1, 1), label=2)
    total, terms = training_loss(model, out, record, "classification", 0.0, torch.device("cpu"), model.loss_weights)
    max_instance = F.cross_entropy(instance.max(0).values[None], torch.tensor([2]))
    expected = 0.5 * F.cross_entropy(out["logits"], torch.tensor([2])) + 0.5 * max_instance
    torch.testing.assert_close(total.double(), expected, rtol=1e-6, atol=1e-6)  # the engine's task loss is fp32


def test_loss_weight_overrides():
    model = _model("clam_sb")
    assert resolve_loss_weights(model, {"instance": 0.5}) == {"slide": 0.7, "instance": 0.5}
    with pytest.raises(ValueError, match=r"terms \['instance', 'slide'\]"):
        resolve_loss_weights(model, {"max_instance": 0.5})
    with pytest.raises(ValueError, match=">= 0"):
        resolve_loss_weights(model, {"slide": -1})
    assert resolve_loss_weights(_model("abmil"), None) == {"slide": 1.0}


# --- layers ---------------------------------------------------------------------------------------

def test_iterative_pinv_inverts_a_softmax_matrix():
    matrix = torch.softmax(torch.randn(2, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), -1)
    torch.testing.assert_close(iterative_pinv(matrix, 30), torch.linalg.inv(matrix))


def test_nystrom_with_one_landmark_per_token_is_softmax_attention():
    torch.manual_seed(0)
    layer = NystromAttention(8, heads=2, head_dim=4, landmarks=6, pinv_iterations=40, residual_kernel=0).double()
    x = torch.randn(6, 8, dtype=torch.float64)
    q, k, v = (t.view(6, 2, 4).transpose(0, 1) for t in (x @ layer.to_qkv.weight.t()).chunk(3, dim=-1))
    exact = torch.softmax(q @ k.transpose(1, 2) / 2.0, dim=-1) @ v
    expected = layer.to_out(exact.transpose(0, 1).reshape(6, 8))
    torch.testing.assert_close(layer(x), expected)


def test_nystrom_pads_in_front_and_adds_the_value_convolution():
    torch.manual_seed(0)
    layer = NystromAttention(4, heads=1, head_dim=4, landmarks=3, residual_kernel=3).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    assert layer(x).shape == (5, 4)
    # zero tokens in front change nothing as long as the padded length stays 6 (2 per landmark)
    torch.testing.assert_close(layer(torch.cat([torch.zeros(1, 4, dtype=torch.float64), x]))[1:], layer(x))


def test_s4d_matches_its_recurrence():
    torch.manual_seed(0)
    layer = S4D(3, d_state=4).double()
    u = torch.randn(7, 3, dtype=torch.float64)
    dt = torch.exp(layer.log_dt)
    A = -torch.exp(layer.log_A_real) + 1j * layer.A_imag
    C = torch.view_as_complex(layer.C)
    decay = torch.exp(A * dt[:, None])
    state = torch.zeros(3, 2, dtype=torch.complex128)
    ys = []
    for t in range(7):
        state = decay * state + (decay - 1) / A * u[t][:, None]
        ys.append(2 * (C * state).sum(-1).real + layer.D * u[t])
    y = F.gelu(torch.stack(ys))
    projected = y @ layer.output_linear.weight.t() + layer.output_linear.bias
    expected = projected[:, :3] * torch.sigmoid(projected[:, 3:])
    torch.testing.assert_close(layer(u), expected)


def test_stride_reorder_by_hand():
    x = torch.arange(5.0).view(1, 5)
    reordered = stride_reorder(x, 2)  # pad to 6: 0 1 2 3 4 p -> 0 2 4 1 3 p
    assert reordered.tolist() == [[0.0, 2.0, 4.0, 1.0, 3.0, 0.0]]
    assert stride_restore(reordered, 2, 5).tolist() == x.tolist()


def test_srmamba_is_the_mamba_branch_plus_the_reordered_branch():
    torch.manual_seed(0)
    dim, rate, length = 6, 4, 13
    mixer = SRMambaMixer(dim, rate=rate, d_state=3).double()
    main = MambaMixer(dim, d_state=3).double()
    second = MambaMixer(dim, d_state=3).double()
    shared = {k: v for k, v in mixer.state_dict().items() if k.startswith(("in_proj", "out_proj"))}
    main.load_state_dict({k: v for k, v in mixer.state_dict().items() if not k.endswith("_b") and "_b." not in k
                          and not k.startswith("A_b")})
    second.load_state_dict({**shared, "conv.weight": mixer.conv_b.weight, "conv.bias": mixer.conv_b.bias,
                            "x_proj.weight": mixer.x_proj_b.weight, "dt_proj.weight": mixer.dt_proj_b.weight,
                            "dt_proj.bias": mixer.dt_proj_b.bias, "A_log": mixer.A_b_log, "D": mixer.D_b})
    x = torch.randn(length, dim, dtype=torch.float64)
    stripes = math.ceil(length / rate)
    order = [k * rate + w for w in range(rate) for k in range(stripes)]
    padded = torch.cat([x, torch.zeros(stripes * rate - length, dim, dtype=torch.float64)])
    reordered = second(padded[order], 1, len(order))
    restored = torch.zeros_like(reordered)
    restored[order] = reordered
    expected = main(x, 1, length) + restored[:length]
    torch.testing.assert_close(mixer(x), expected)


def test_heatmap_refuses_models_without_attention():
    from vmamba2d.mil.heatmap import slide_attention

    features, coords = _slide(2, 2, dtype=torch.float32)
    record = SlideRecord("s", features, coords, (2, 2), (0, 0), (1, 1))
    model = build_model("s4mil", in_dim=5, num_classes=2, **SMALL["s4mil"])
    with pytest.raises(ValueError, match="s4mil has no per-instance attention"):
        slide_attention(model, record)
    attention, tissue, _ = slide_attention(build_model("clam_sb", in_dim=5, num_classes=2, **SMALL["clam_sb"]), record)
    assert attention.shape == tissue.shape == (2, 2)


def test_clam_and_dsmil_classes():
    assert build_model("clam_sb", in_dim=5, num_classes=2).__class__ is CLAMSB
    assert build_model("dsmil", in_dim=5, num_classes=2).__class__ is DSMIL
