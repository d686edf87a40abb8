"""vmamba2d.runs.seeding / schedule: loader randomness as a function of (seed, epoch, index)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from vmamba2d.runs import (EpochSampler, SeededSamples, capture_rng_state, clamp_warmup,
                               loader_generator)


class RandomAugmentation(Dataset):
    """Each sample draws from all three global generators, as timm / torchvision transforms do."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), torch.rand(()).item(), random.random(),
                             float(np.random.rand())], dtype=torch.float64)


def epoch_batches(workers: int, epochs: range, persistent: bool = False) -> list[torch.Tensor]:
    sampler = EpochSampler(DistributedSampler(RandomAugmentation(), num_replicas=1, rank=0,
                                              shuffle=True, seed=5))
    loader = DataLoader(SeededSamples(RandomAugmentation(), seed=3), batch_size=4,
                        sampler=sampler, num_workers=workers, generator=loader_generator(3),
                        persistent_workers=persistent)
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out.append(torch.cat(list(loader)))
    return out


def same_rng_state(a: dict, b: dict) -> bool:
    return (a["python"] == b["python"] and torch.equal(a["torch"], b["torch"])
            and torch.equal(a["numpy"]["keys"], b["numpy"]["keys"])
            and a["numpy"]["pos"] == b["numpy"]["pos"])


def test_samples_do_not_depend_on_workers_or_on_where_the_run_started():
    torch.manual_seed(0)
    before = capture_rng_state()
    single = epoch_batches(0, range(3))
    assert same_rng_state(before, capture_rng_state())  # the main process's streams untouched
    # persistent workers seeded once at epoch 0 (uninterrupted run) ...
    persistent = epoch_batches(2, range(3), persistent=True)
    # ... and fresh workers started at epoch 2 (a resumed run) give the same samples
    resumed = epoch_batches(2, range(2, 3))
    for a, b in zip(persistent, single):
        assert torch.equal(a, b)
    assert torch.equal(resumed[0], single[2])
    assert same_rng_state(before, capture_rng_state())
    # the order follows (seed, epoch); the draws differ between epochs and between samples
    assert sorted(single[0][:, 0].tolist()) == list(map(float, range(12)))
    assert single[0][:, 0].tolist() != single[1][:, 0].tolist()
    draws = torch.cat(single)[:, 1:]
    assert draws.unique().numel() == draws.numel()


def test_seeded_samples_need_epoch_keys():
    with pytest.raises(TypeError, match=r"\(epoch, index\) keys"):
        SeededSamples(RandomAugmentation(), seed=0)[3]
    with pytest.raises(ValueError, match="seed must be >= 0"):
        SeededSamples(RandomAugmentation(), seed=-1)


@pytest.mark.parametrize("warmup, length, expected", [(20, 300, 20), (0, 1, 0), (20, 5, 4),
                                                      (5, 5, 4), (3, 1, 0)])
def test_clamp_warmup(warmup, length, expected):
    clamped, warning = clamp_warmup(warmup, length)
    assert clamped == expected
    assert (warning is None) == (warmup == expected)
    if warning:
        assert f"--warmup-epochs {warmup}" in warning and f"clamped to {expected} epochs" in warning


def test_clamp_warmup_rejects_impossible_values():
    with pytest.raises(ValueError, match="--warmup-iters must be >= 0"):
        clamp_warmup(-1, 10, option="--warmup-iters")
    with pytest.raises(ValueError, match="run length must be >= 1 iterations"):
        clamp_warmup(0, 0, unit="iterations")
