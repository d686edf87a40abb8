"""The README's commands run as written.

* Every ```python block runs (in a subprocess, from the repository root) unless the line before it
  is ``<!-- readme: skip (reason) -->``; blocks needing a dataset or a GPU carry such a marker.
* Every script a ```bash block invokes (``python path.py``, ``torchrun ... path.py``) exists and
  its ``--help`` lists each ``--option`` the README passes to it, so a renamed or removed option
  fails here instead of in a user's terminal (data-free, so no bash block is exempt).
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
SKIP_MARKER = re.compile(r"<!--\s*readme:\s*skip\s*\((.+?)\)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")


def _blocks() -> list[tuple[str, str, int, str | None]]:
    """(language, code, first line number, skip reason or None) for each fenced block."""
    lines = README.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        previous = lines[index - 1] if index else ""
        marker = SKIP_MARKER.search(previous)
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        blocks.append((opening.group(1), "\n".join(lines[index + 1:end]), index + 2,
                       marker.group(1) if marker else None))
        index = end + 1
    return blocks


PYTHON_BLOCKS = [b for b in _blocks() if b[0] == "python"]
BASH_BLOCKS = [b for b in _blocks() if b[0] in ("bash", "sh", "")]


def test_readme_has_runnable_python_blocks():
    assert any(reason is None for _, _, _, reason in PYTHON_BLOCKS)


@pytest.mark.parametrize("block", [b for b in PYTHON_BLOCKS if b[3] is None],
                         ids=lambda b: f"line{b[2]}")
def test_python_block_runs(block, tmp_path):
    _, code, line, _ = block
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"README block at line {line} failed:\n{result.stderr[-3000:]}"


def _commands(code: str) -> list[list[str]]:
    """Shell commands of a block, continuation lines joined, comments and env assignments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for raw in joined.splitlines():
        raw = raw.split(" #", 1)[0].strip()
        if not raw or raw.startswith("#"):
            continue
        words = shlex.split(raw.replace("$CFG", "CFG"))
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def _script_and_options(words: list[str]) -> tuple[str, list[str]] | None:
    """The .py script a ``python script.py`` / ``torchrun ... script.py`` command runs and the
    --options passed to it (``python -m ...`` and ``python -c ...`` are not script runs)."""
    if not words or Path(words[0]).name not in ("python", "python3", "torchrun"):
        return None
    if words[0] == "torchrun":
        scripts = [i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")]
        if not scripts:
            return None
        at = scripts[0]
    elif len(words) > 1 and words[1].endswith(".py"):
        at = 1
    else:
        return None
    rest = words[at + 1:]
    # A runner's options end where the script it runs (another .py argument) begins.
    nested = next((i for i, w in enumerate(rest) if w.endswith(".py") and not w.startswith("-")
                   and not w.startswith(("configs/", "CFG"))), len(rest))
    options = [w.split("=", 1)[0] for w in rest[:nested] if w.startswith("--")]
    return words[at], options


@functools.lru_cache(maxsize=None)
def _help_text(script: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, script, "--help"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{script} --help failed:\n{result.stderr[-2000:]}"
    return result.stdout


BASH_INVOCATIONS = sorted({
    (found[0], tuple(found[1]), line)
    for _, code, line, _ in BASH_BLOCKS
    for words in _commands(code)
    if (found := _script_and_options(words)) is not None
})


def test_readme_invokes_scripts():
    assert BASH_INVOCATIONS


@pytest.mark.parametrize("invocation", BASH_INVOCATIONS, ids=lambda i: f"{i[0]}:line{i[2]}")
def test_bash_command_options_exist(invocation):
    script, options, line = invocation
    assert (REPO_ROOT / script).is_file(), f"README line {line}: {script} does not exist"
    help_text = _help_text(script)
    unknown = [option for option in options if option not in help_text]
    assert not unknown, f"README line {line}: {script} has no option(s) {unknown}"
