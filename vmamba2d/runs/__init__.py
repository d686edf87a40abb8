"""What a training run keeps on disk and how it restarts, shared by the training scripts
(classification, segmentation, detection, MIL); the training loops themselves live with each task.

* :mod:`.checkpoint` - atomic file writes, stale temporary file cleanup, RNG state capture.
* :mod:`.run_folder` - the run-folder protocol: ``last.pth`` as the one commit point per epoch,
  ``best.pth`` / ``metrics.jsonl`` never behind it, repair on start, resume rules.
* :mod:`.run_lock` - one run per folder: an exclusive OS lock held while a run writes there.
* :mod:`.seeding` - data-loading randomness as a function of (seed, epoch, sample index), so
  kill / resume reproduces a run exactly with any number of loader workers.
* :mod:`.schedule` - warm-up clamping for runs shorter than the recipe's warm-up.
* :mod:`.options` - KEY=VALUE option lists and AMP autocast contexts for the CLIs.
"""
from .checkpoint import (atomic_torch_save, atomic_write, capture_rng_state,
                         remove_stale_temp_files, restore_rng_state)
from .run_folder import (BEST_NAME, LAST_NAME, METRICS_NAME, RunFolder, RunFolderError,
                         StartPlan, read_metrics)
from .run_lock import RunFolderBusy, RunFolderLock
from .schedule import clamp_warmup
from .seeding import EpochSampler, SeededSamples, loader_generator, sample_seed_words

__all__ = ["BEST_NAME", "EpochSampler", "LAST_NAME", "METRICS_NAME", "RunFolder",
           "RunFolderBusy", "RunFolderError", "RunFolderLock", "SeededSamples", "StartPlan",
           "atomic_torch_save", "atomic_write",
           "capture_rng_state", "clamp_warmup", "loader_generator", "read_metrics",
           "remove_stale_temp_files", "restore_rng_state", "sample_seed_words"]
