"""DTFD-MIL (vmamba2d.mil.models.baselines.DTFDMIL): size at the code's defaults, outputs, the two tiers and the three
distillations against a per-pseudo-bag loop written from the paper, pseudo-bag splits, the loss
terms, order claims, one training step and bad options."""
import math

import pytest
import torch
import torch.nn.functional as F

from vmamba2d.mil import SlideRecord, build_model
from vmamba2d.mil.models import DTFDMIL
from vmamba2d.mil.engine import train_one_epoch, training_loss


def linear(n_in, n_out, bias=True):
    return n_in * n_out + (n_out if bias else 0)


def _slide(height, width, in_dim=5, *, holes=(), seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    cells = [(c, r) for r in range(height) for c in range(width) if (r, c) not in set(holes)]
    coords = torch.tensor(cells, dtype=torch.long)[torch.randperm(len(cells), generator=gen)]
    return torch.randn(len(cells), in_dim, generator=gen, dtype=dtype), coords


def _model(seed=0, **kwargs):
    torch.manual_seed(seed)
    options = dict(in_dim=5, num_classes=3, dim=8, attn_hidden=6, num_groups=3)
    options.update(kwargs)
    return build_model("dtfdmil", **options).double().eval()


def test_parameter_count_at_the_code_defaults():
    # DTFD-MIL: DimReduction 1024 -> 512 (no bias); per tier gated attention V, U (512 -> 128) and
    # weights (128 -> 1), classifier 512 -> C.
    tier = 2 * linear(512, 128) + linear(128, 1) + linear(512, 3)
    derived = linear(1024, 512, bias=False) + 2 * tier
    assert derived == 790_280
    model = build_model("dtfdmil", in_dim=1024, num_classes=3)
    assert sum(p.numel() for p in model.parameters()) == derived
    assert model.num_groups == 4 and model.distill == "afs"


def _gated(pool, tokens):
    """Gated attention by hand: score_k = w . (tanh(V h_k) * sigmoid(U h_k)) + b."""
    va, ua, w = pool.attention_a[0], pool.attention_b[0], pool.score
    scores = []
    for h in tokens:
        gate = torch.tanh(va.weight @ h + va.bias) * torch.sigmoid(ua.weight @ h + ua.bias)
        scores.append((w.weight[0] * gate).sum() + w.bias[0])
    scores = torch.stack(scores)
    weights = torch.exp(scores - scores.max())
    weights = weights / weights.sum()
    return (weights[:, None] * tokens).sum(0), weights, scores


def _reference(model, features, coords, width):
    """The slide's logits, pseudo-bag logits and patch weights by a loop over pseudo-bags."""
    order = torch.argsort(coords[:, 1] * width + coords[:, 0])
    tokens = torch.relu(features[order] @ model.reduce[0].weight.t())
    groups = model.pseudo_bags(len(tokens), tokens.device)
    group_logits, distilled, picked = [], [], []
    for group in groups:
        members = tokens[group]
        embedding, weights, _ = _gated(model.attention1, members)
        logits = model.classifier1.weight @ embedding + model.classifier1.bias
        group_logits.append(logits)
        if model.distill == "afs":
            distilled.append(embedding)
            picked.append([(int(g), a) for g, a in zip(group, weights)])
            continue
        target = int(logits.argmax())
        probabilities = []
        for k, h in enumerate(members):  # instance k's share a_k w_c . h_k of each class's logit
            contributions = torch.stack([weights[k] * (model.classifier1.weight[c] @ h) for c in range(3)])
            probabilities.append(torch.softmax(contributions, 0)[target])
        probabilities = torch.stack(probabilities)
        chosen = [int(probabilities.argmax())] + ([int(probabilities.argmin())] if model.distill == "maxmins" else [])
        for k in chosen:
            distilled.append(members[k])
            picked.append([(int(group[k]), torch.tensor(1.0, dtype=tokens.dtype))])
    slide_embedding, bag_weights, _ = _gated(model.attention2, torch.stack(distilled))
    logits = model.classifier.weight @ slide_embedding + model.classifier.bias
    patch_weights = torch.zeros(len(tokens), dtype=tokens.dtype)
    for members, weight in zip(picked, bag_weights):
        for g, a in members:
            patch_weights[g] += weight * a
    return logits, torch.stack(group_logits), patch_weights, order


@pytest.mark.parametrize("distill", ["afs", "maxs", "maxmins"])
def test_forward_against_a_loop_over_pseudo_bags(distill):
    model = _model(distill=distill, seed=1)
    features, coords = _slide(3, 4, holes=[(0, 1), (2, 3)], seed=2)
    out = model(features, coords)
    logits, group_logits, patch_weights, order = _reference(model, features, coords, 4)
    torch.testing.assert_close(out["logits"][0], logits)
    torch.testing.assert_close(out["pseudo_bag_logits"], group_logits)
    attention = torch.zeros(3, 4, dtype=torch.float64)
    sorted_coords = coords[order]
    attention[sorted_coords[:, 1], sorted_coords[:, 0]] = patch_weights
    torch.testing.assert_close(out["attention"], attention)
    torch.testing.assert_close(out["probabilities"], torch.softmax(out["logits"], dim=1))
    assert out["attention"][0, 1] == 0 and out["attention"][2, 3] == 0
    torch.testing.assert_close(out["attention"].sum(), torch.tensor(1.0, dtype=torch.float64))
    selected = int((out["attention"] > 0).sum())
    assert selected == {"afs": 10, "maxs": 3}.get(distill, selected)
    if distill == "maxmins":
        assert 3 < selected <= 6


def test_afs_embedding_is_the_attention_weighted_sum_of_patches():
    model = _model(num_groups=4)
    features, coords = _slide(4, 4, seed=3)
    out = model(features, coords)
    cells = coords[:, 1] * 4 + coords[:, 0]
    weights = out["attention"].flatten()[cells]
    tokens = model.reduce(features)
    torch.testing.assert_close(out["embedding"][0], (weights[:, None] * tokens).sum(0))


def test_tier_two_ignores_the_order_of_the_distilled_vectors():
    model = _model()
    distilled = torch.randn(6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    logits, weights, embedding = model.tier2(distilled)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    logits_p, weights_p, embedding_p = model.tier2(distilled[perm])
    torch.testing.assert_close(logits_p, logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights_p, weights[perm], rtol=0, atol=1e-12)


def test_pseudo_bags_partition_the_patches():
    model = _model(num_groups=4)
    for count in (1, 3, 4, 10, 11):
        groups = model.pseudo_bags(count, torch.device("cpu"))
        assert len(groups) == min(4, count)
        assert sorted(torch.cat(groups).tolist()) == list(range(count))
        sizes = [len(g) for g in groups]
        assert max(sizes) - min(sizes) <= 1
    # eval: the same split every time; training: a fresh split from the global generator
    first = model.pseudo_bags(10, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(first, model.pseudo_bags(10, torch.device("cpu"))))
    model.train()
    torch.manual_seed(7)
    drawn = [model.pseudo_bags(10, torch.device("cpu")) for _ in range(3)]
    assert not all(torch.equal(a, b) for a, b in zip(drawn[0], drawn[1]))
    torch.manual_seed(7)
    assert all(torch.equal(a, b) for a, b in zip(drawn[0], model.pseudo_bags(10, torch.device("cpu"))))


def test_eval_ignores_the_row_order_but_not_the_positions():
    model = _model()
    features, coords = _slide(4, 5, holes=[(0, 0), (3, 4)])
    logits = model(features, coords)["logits"]
    perm = torch.randperm(features.shape[0], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(features[perm], coords[perm])["logits"], logits, rtol=0, atol=1e-12)
    moved = coords[torch.randperm(coords.shape[0], generator=torch.Generator().manual_seed(2))]
    assert not torch.allclose(model(features, moved)["logits"], logits)  # other pseudo-bags
    assert not DTFDMIL.permutation_invariant


def test_one_pseudo_bag_is_gated_attention_mil():
    # M = 1 with AFS: tier 1 is gated attention MIL over the slide; tier 2 sees one vector (weight 1)
    model = _model(num_groups=1)
    features, coords = _slide(3, 3, seed=6)
    out = model(features, coords)
    tokens = model.reduce(features)
    embedding, weights, _ = _gated(model.attention1, tokens)
    torch.testing.assert_close(out["embedding"][0], embedding)
    cells = coords[:, 1] * 3 + coords[:, 0]
    torch.testing.assert_close(out["attention"].flatten()[cells], weights)


def test_loss_terms_by_hand():
    model = _model()
    features, coords = _slide(3, 4, seed=5)
    out = model(features, coords)
    label = 2
    record = SlideRecord("s", features, coords, (3, 4), (0, 0), (1, 1), label=label)
    total, terms = training_loss(model, out, record, "classification", 0.0, torch.device("cpu"), model.loss_weights)
    assert terms.keys() == {"slide", "pseudo_bag"}
    pseudo = sum(F.cross_entropy(row[None], torch.tensor([label])) for row in out["pseudo_bag_logits"]) / 3
    expected = F.cross_entropy(out["logits"], torch.tensor([label])) + pseudo
    torch.testing.assert_close(total.double(), expected, rtol=1e-6, atol=1e-6)  # the engine's task loss is fp32


def test_survival_head():
    model = _model(num_classes=4, survival=True)
    out = model(*_slide(3, 3))
    hazards = [1 / (1 + math.exp(-v)) for v in out["logits"][0].tolist()]
    survival = [math.prod(1 - h for h in hazards[: k + 1]) for k in range(4)]
    torch.testing.assert_close(out["survival"][0], torch.tensor(survival, dtype=torch.float64))
    assert out["pseudo_bag_logits"].shape == (3, 4)


@pytest.mark.parametrize("task", ["classification", "survival"])
def test_one_training_step_changes_both_tiers(task):
    torch.manual_seed(0)
    model = build_model("dtfdmil", in_dim=5, num_classes=3, dim=8, attn_hidden=6, num_groups=2,
                        survival=task == "survival")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    records = []
    for index in range(2):
        features, coords = _slide(3, 4, holes=[(1, 1)], seed=index, dtype=torch.float32)
        records.append(SlideRecord(f"s{index}", features, coords, (3, 4), (0, 0), (512, 512), label=index % 2,
                                   case_id=f"c{index}", time=10.0 + index, censorship=index % 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = train_one_epoch(model=model, dataset=records, order=[0, 1], optimizer=optimizer,
                            scaler=torch.amp.GradScaler("cpu", enabled=False), task=task, alpha=0.0,
                            device=torch.device("cpu"), amp="none", workers=0, seed=0, epoch=0, progress=False)
    assert math.isfinite(stats["train_loss"]) and {"train_loss_slide", "train_loss_pseudo_bag"} <= set(stats)
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert {"classifier.weight", "classifier1.weight", "reduce.0.weight", "attention2.score.weight"} <= changed


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_groups=0), "num_groups"), (dict(distill="mean"), "distill"), (dict(eval_seed=1.5), "eval_seed"),
    (dict(init="official"), "init"), (dict(attn_hidden=0), "attn_hidden"),
])
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_model("dtfdmil", in_dim=5, num_classes=2, **kwargs)


def test_bad_slides_are_named():
    model = _model()
    with pytest.raises(ValueError, match=r"in_dim=5"):
        model(torch.randn(3, 6, dtype=torch.float64), torch.tensor([[0, 0], [1, 0], [2, 0]]))
    with pytest.raises(ValueError, match="duplicate"):
        model(torch.randn(2, 5, dtype=torch.float64), torch.tensor([[1, 0], [1, 0]]))


def test_round_trips_through_its_config():
    model = build_model("dtfdmil", in_dim=5, num_classes=2, distill="maxmins", num_groups=3)
    copy = build_model(**model.config)
    assert isinstance(copy, DTFDMIL) and copy.config == model.config


@pytest.mark.parametrize("distill", ["afs", "maxmins"])
def test_runs_under_autocast(distill):
    torch.manual_seed(0)
    model = build_model("dtfdmil", in_dim=5, num_classes=3, dim=8, attn_hidden=6, num_groups=3, distill=distill)
    features, coords = _slide(3, 4, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.eval()(features, coords)
    assert out["attention"].dtype == torch.float32 and torch.isfinite(out["logits"].float()).all()
    torch.testing.assert_close(out["attention"].sum(), torch.tensor(1.0), atol=2e-2, rtol=0)
