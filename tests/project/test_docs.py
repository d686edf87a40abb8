"""The repository documents itself: no pointer leaves it, and every documentation link resolves.

* No git-tracked file names the team's notes files or a path outside the repository (a ``shared``
  notes folder, or a ``../`` path that climbs above the repository root).
* Every relative link of the Markdown documentation (README.md, docs/*.md) points to a tracked file
  or folder, and every ``#anchor`` to a heading of the target, slugged as GitHub does.
* The README links every page under docs/.
"""
from __future__ import annotations

import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()

# Built from pieces so that this file's own source does not contain what it looks for.
_NOTES_NAMES = ("DESIGN", "MIL")
NOTES_FILE = re.compile(r"\b(?:" + "|".join(_NOTES_NAMES) + r")\.md\b")
NOTES_FOLDER = re.compile(r"(?<![\w-])" + "shared" + "/")
PARENT_PATH = re.compile(r"(?<![\w.])((?:\.\./)+[^\s`'\"()<>\[\]{},;|*]*)")

MARKDOWN_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@lru_cache(maxsize=None)
def tracked_files() -> tuple[str, ...]:
    """Repository-relative paths of the git-tracked files (skips outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"not a git checkout ({err})")
    return tuple(sorted(p for p in out.decode().split("\0") if p))


@lru_cache(maxsize=None)
def tracked_dirs() -> frozenset[str]:
    dirs = {""}
    for path in tracked_files():
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(dirs)


def read_text(path: str) -> str | None:
    """The file's text, or None for a binary file (images, model assets)."""
    data = (REPO / path).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def text_files() -> list[tuple[str, str]]:
    files = []
    for path in tracked_files():
        if path == THIS_FILE or not (REPO / path).is_file():
            continue
        text = read_text(path)
        if text is not None:
            files.append((path, text))
    return files


def escapes_repo(path: str, relative: str) -> bool:
    """Whether ``relative``, written in tracked file ``path``, resolves above the repository root."""
    base = os.path.dirname(path)
    resolved = os.path.normpath(os.path.join(base, relative))
    return resolved == ".." or resolved.startswith("../")


def outside_pointers(path: str, text: str) -> list[str]:
    """Every pointer in ``text`` to the team's notes or to a path outside the repository."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in ((NOTES_FILE, "notes file"), (NOTES_FOLDER, "notes folder")):
            for match in pattern.finditer(line):
                found.append(f"{path}:{number}: {what} {match.group(0)!r}: {line.strip()}")
        for match in PARENT_PATH.finditer(line):
            if escapes_repo(path, match.group(1)):
                found.append(f"{path}:{number}: path outside the repository {match.group(1)!r}: {line.strip()}")
    return found


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: rendered text, lower case, punctuation other
    than '-' and '_' removed, each space turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links / images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    text = text.lower()
    text = "".join(ch for ch in text if ch in " -_" or ch.isalnum())
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) pairs outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        marker = FENCE.match(line)
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif marker.group(1) == fence:
                fence = None
            continue
        if fence is None:
            lines.append((number, line))
    return lines


def anchors(markdown: str) -> set[str]:
    """GitHub anchors of the headings of a Markdown text (duplicates numbered -1, -2, ...)."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in prose_lines(markdown):
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    for match in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", markdown):
        result.add(match.group(1))
    return result


def documentation_files() -> list[str]:
    return [p for p in tracked_files() if p == "README.md" or (p.startswith("docs/") and p.endswith(".md"))]


def link_problems(path: str) -> list[str]:
    """Broken relative links (missing target, target outside the repository, unknown anchor)."""
    text = (REPO / path).read_text(encoding="utf-8")
    problems = []
    for number, line in prose_lines(text):
        for match in MARKDOWN_LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if URL_SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            where = f"{path}:{number}: link {target!r}"
            if file_part:
                if file_part.startswith("/"):
                    problems.append(f"{where}: absolute path (use a path relative to {path})")
                    continue
                if escapes_repo(path, file_part):
                    problems.append(f"{where}: leaves the repository")
                    continue
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if resolved not in tracked_files() and resolved not in tracked_dirs():
                    problems.append(f"{where}: no tracked file or folder {resolved!r}")
                    continue
            else:
                resolved = path
            if anchor and resolved.endswith(".md") and resolved in tracked_files():
                known = anchors((REPO / resolved).read_text(encoding="utf-8"))
                if anchor not in known:
                    problems.append(f"{where}: {resolved} has no heading with anchor #{anchor}")
    return problems


def test_no_tracked_file_points_outside_the_repository():
    problems = [p for path, text in text_files() for p in outside_pointers(path, text)]
    assert not problems, "pointers outside the repository:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", ["README.md", "docs/scan.md", "docs/kernels.md", "docs/models.md",
                                  "docs/training.md", "docs/mil.md", "docs/benchmarks.md",
                                  "docs/install.md", "docs/usage.md", "benchmarks/README.md"])
def test_documentation_page_is_tracked(path):
    assert path in tracked_files(), f"{path} is missing (or not added to git)"


def test_relative_links_and_anchors_resolve():
    problems = [p for path in documentation_files() for p in link_problems(path)]
    assert not problems, "broken documentation links:\n" + "\n".join(problems)


def test_readme_links_every_documentation_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {os.path.normpath(m.group(1).partition("#")[0]) for _, line in prose_lines(readme)
              for m in MARKDOWN_LINK.finditer(INLINE_CODE.sub("", line))}
    pages = [p for p in tracked_files() if p.startswith("docs/") and p.endswith(".md")]
    missing = [p for p in pages if p not in linked]
    assert not missing, f"README.md does not link {missing}"


# The checker itself, on made-up inputs (independent of the repository's current state).

@pytest.mark.parametrize("heading, slug", [
    ("The 2D selective scan", "the-2d-selective-scan"),
    ("Share of copy bandwidth", "share-of-copy-bandwidth"),
    ("The 1D routes of VMamba", "the-1d-routes-of-vmamba"),
    ("`cross_scan_merge` and copies", "cross_scan_merge-and-copies"),
    ("Train, evaluate, draw.", "train-evaluate-draw"),
    ("Whole-slide images (2DMambaMIL)", "whole-slide-images-2dmambamil"),
    ("Effective receptive fields (`vmamba2d/cli/erf.py`)", "effective-receptive-fields-vmamba2dclierfpy"),
    ("VMamba's routes: k0 & k1", "vmambas-routes-k0--k1"),
])
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_anchors_number_duplicates_and_skip_code_blocks():
    text = "# Intro\n\n```bash\n# not a heading\n```\n## Intro\n### Notes `x`\n"
    assert anchors(text) == {"intro", "intro-1", "notes-x"}


@pytest.mark.parametrize("path, line, bad", [
    ("README.md", "see " + "DESIGN" + ".md section 7", True),
    ("benchmarks/x.py", "# " + "MIL" + ".md §7", True),
    ("docs/mil.md", "the file docs/mil.md", False),
    ("README.md", "cat /work/" + "shared" + "/notes.txt", True),
    ("README.md", "shared memory per SM", False),
    ("docs/scan.md", "[readme](../README.md)", False),
    ("docs/scan.md", "[up](../../outside.md)", True),
    ("README.md", "open ../elsewhere/file.txt", True),
    ("csrc/cuda/a.h", '#include "../cpu/b.h"', False),
])
def test_outside_pointer_patterns(path, line, bad):
    assert bool(outside_pointers(path, line)) == bad
