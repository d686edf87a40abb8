"""Quiet evaluation for the test commands: mmengine's log (environment, config, every logged
iteration) held back to warnings, and a progress bar over the test loop instead; the command
prints the metrics at the end."""
from __future__ import annotations

from typing import Optional

from mmengine.config import Config
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from tqdm import tqdm


class TestProgressBarHook(Hook):
    """A tqdm bar over the batches of the test loop, on the main process only."""

    priority = "VERY_LOW"

    def __init__(self) -> None:
        self._bar: Optional[tqdm] = None

    def before_test_epoch(self, runner) -> None:
        self._bar = tqdm(total=len(runner.test_dataloader), desc="test", unit="batch",
                         disable=not is_main_process(), dynamic_ncols=True)

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def after_test_epoch(self, runner, metrics=None) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def quiet_evaluation(cfg: Config) -> None:
    """Log warnings only and show a progress bar over the test loop (``cfg`` changed in place; the
    hook is registered in mmengine's HOOKS, which the toolkits' registries inherit)."""
    HOOKS.register_module(module=TestProgressBarHook, force=True)
    cfg.log_level = "WARNING"
    cfg.custom_hooks = [*(cfg.get("custom_hooks") or []), dict(type=TestProgressBarHook.__name__)]
