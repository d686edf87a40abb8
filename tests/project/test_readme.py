"""The README's commands run as written.

* Every ```python block runs (in a subprocess, from the repository root) unless the line before it
  is ``<!-- readme: skip (reason) -->``; blocks needing a dataset or a GPU carry such a marker.
* Every command a ```bash block runs — an installed ``vmamba2d-*`` command (declared in
  pyproject.toml's ``[project.scripts]``), a module (``python -m`` / ``torchrun -m``) or a script
  (``python path.py``, ``torchrun ... path.py``) — exists and its ``--help`` lists each
  ``--option`` the README passes to it, so a renamed or removed option fails here instead of in a
  user's terminal (data-free, so no bash block is exempt). A config name given to a seg / det
  command (or to ``--config``) is one the package ships.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
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


@pytest.mark.slow
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
        raw = re.sub(r"\$\(which ([\w-]+)\)", r"\1", raw.replace("$CFG", "CFG"))
        words = shlex.split(raw)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words:
            commands.append(words)
    return commands


def _options(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("--")]


def _invocation(words: list[str]) -> tuple[str, str, list[str], list[str]] | None:
    """(kind, target, --options, other arguments) of a command: kind "command" (an installed
    ``vmamba2d-*`` command; target its name), "module" (``python -m`` / ``torchrun -m``) or "script"
    (``python path.py`` / ``torchrun ... path.py``); None for anything else (make, pip, ...)."""
    if not words:
        return None
    first = Path(words[0]).name
    if first.startswith("vmamba2d-"):
        return "command", first, _options(words[1:]), [w for w in words[1:] if not w.startswith("-")]
    if first not in ("python", "python3", "torchrun"):
        return None
    if first == "torchrun":
        launch = next((i for i, w in enumerate(words) if i and not w.startswith("-") and not words[i - 1].startswith("--")), None)
        if "-m" in words:
            at = words.index("-m") + 1
            return "module", words[at], _options(words[at + 1:]), []
        if launch is not None and Path(words[launch]).name.startswith("vmamba2d-"):
            return "command", Path(words[launch]).name, _options(words[launch + 1:]), \
                [w for w in words[launch + 1:] if not w.startswith("-")]
        scripts = [i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")]
        if not scripts:
            return None
        at = scripts[0]
    elif len(words) > 2 and words[1] == "-m":
        return "module", words[2], _options(words[3:]), []
    elif len(words) > 1 and words[1].endswith(".py"):
        at = 1
    else:
        return None
    rest = words[at + 1:]
    # A runner's options end where the script it runs (another .py argument) begins.
    nested = next((i for i, w in enumerate(rest) if w.endswith(".py") and not w.startswith("-")
                   and not w.startswith(("vmamba2d/configs/", "CFG"))), len(rest))
    return "script", words[at], _options(rest[:nested]), []


# Prints the --help text of every (kind, target) in argv[1] (JSON) as one JSON object: one process
# imports the package and the toolkits once for all the README's commands.
HELP_COLLECTOR = """
import contextlib, io, json, runpy, sys
texts = {}
for kind, target, entry in json.loads(sys.argv[1]):
    out = io.StringIO()
    sys.argv = [target, "--help"]
    with contextlib.redirect_stdout(out):
        try:
            if kind == "command":
                module, attr = entry.split(":")
                getattr(__import__(module, fromlist=["_"]), attr)(["--help"])
            elif kind == "module":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (0, None):
                out.write(f"<exit {stop.code}>")
    texts[f"{kind}:{target}"] = out.getvalue()
print(json.dumps(texts))
"""


BASH_COMMANDS = [(found, line) for _, code, line, _ in BASH_BLOCKS for words in _commands(code)
                 if (found := _invocation(words)) is not None]
BASH_INVOCATIONS = sorted({(kind, target, tuple(options), line) for (kind, target, options, _), line in BASH_COMMANDS})


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    """``{"kind:target": --help output}`` of every command the README runs (one subprocess)."""
    targets = sorted({(kind, target, SCRIPTS.get(target, "")) for kind, target, _, _ in BASH_INVOCATIONS})
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), MPLBACKEND="Agg")
    result = subprocess.run([sys.executable, "-c", HELP_COLLECTOR, json.dumps(targets)], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_readme_invokes_installed_commands():
    assert any(kind == "command" for kind, _, _, _ in BASH_INVOCATIONS)


@pytest.mark.slow
@pytest.mark.parametrize("invocation", BASH_INVOCATIONS, ids=lambda i: f"{i[1]}:line{i[3]}")
def test_bash_command_options_exist(invocation, help_texts):
    kind, target, options, line = invocation
    if kind == "command":
        assert target in SCRIPTS, f"README line {line}: {target} is not in pyproject.toml's [project.scripts]"
    if kind == "script":
        assert (REPO_ROOT / target).is_file(), f"README line {line}: {target} does not exist"
    help_text = help_texts[f"{kind}:{target}"]
    assert "usage:" in help_text, f"README line {line}: {target} --help printed no usage:\n{help_text[-500:]}"
    unknown = [option for option in options if option not in help_text]
    assert not unknown, f"README line {line}: {target} has no option(s) {unknown}"


def _shipped(kind: str) -> set[str]:
    return {p.stem for p in (REPO_ROOT / "vmamba2d" / "configs" / kind).glob("*.*") if p.is_file()}


def test_config_names_in_commands_are_shipped():
    """The first argument of a seg / det command is a config we ship (a path or its name); so is the
    value of --config of the ImageNet and MIL commands."""
    unknown = []
    for (kind, target, _, arguments), line in BASH_COMMANDS:
        if kind != "command":
            continue
        toolkit = next((k for k in ("seg", "det") if target.startswith(f"vmamba2d-{k}-")), None)
        if target == "vmamba2d-weights":
            toolkit = "seg det"
        if toolkit and arguments:
            names = set().union(*(_shipped(k) for k in toolkit.split()))
            if Path(arguments[0]).stem not in names:
                unknown.append(f"line {line}: {target} {arguments[0]}")
    for _, code, line, _ in BASH_BLOCKS:
        for words in _commands(code):
            if "--config" in words and words[0] in ("vmamba2d-train", "vmamba2d-mil-train"):
                name = words[words.index("--config") + 1]
                kind = "classification" if words[0] == "vmamba2d-train" else "mil"
                if name not in _shipped(kind):
                    unknown.append(f"line {line}: {words[0]} --config {name}")
    assert not unknown, "configs the package does not ship:\n" + "\n".join(unknown)
