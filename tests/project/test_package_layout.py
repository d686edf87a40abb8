"""The package's shape: no import cycle, the model reaches the scan only through ``vmamba2d.ops``'s
public names, and ``import vmamba2d`` loads no optional heavy package and prints nothing."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vmamba2d"
# Packages `import vmamba2d` must not load: they belong to export, plotting and the triton backend.
OPTIONAL_HEAVY = ("onnx", "onnxscript", "triton", "matplotlib")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(folder: Path) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(folder.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (module level, in functions, or
    by ``importlib.import_module("...")``), as absolute names among ``known``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.add(child if child in known else base)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets.add(node.args[0].value)
    return {t for t in targets if t in known and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _graph(folder: Path) -> dict[str, set[str]]:
    modules = _modules(folder)
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_the_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_ops_has_no_import_cycle():
    """No module of vmamba2d.ops imports, at any depth and however late, one that imports it back
    (lazy imports inside functions count: they hide a cycle, they do not remove it)."""
    graph = _graph(PACKAGE / "ops")
    assert "vmamba2d.ops.interface" in graph and "vmamba2d.ops.compiled.cross_ops" in graph
    assert _cycles(graph) == []


def test_package_has_no_import_cycle():
    graph = _graph(PACKAGE)
    assert "vmamba2d.mil.models.baselines" in graph and "vmamba2d.mil.models" in graph
    assert _cycles(graph) == []


def test_ops_modules_import_no_private_name_of_another_module():
    """Shared helpers live in one named module under a public name: no ``from .x import _helper``."""
    borrowed = []
    for name, path in _modules(PACKAGE / "ops").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                borrowed += [f"{name}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert borrowed == []


def test_models_use_only_the_public_ops_api():
    import vmamba2d.ops

    public = set(vmamba2d.ops.__all__)
    for path in sorted((PACKAGE / "models").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and "ops" in node.module.split("."):
                assert node.module in ("ops", "vmamba2d.ops"), f"{path.name} imports {node.module}"
                names = {a.name for a in node.names}
                assert names <= public, f"{path.name} imports non-public {sorted(names - public)}"


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


def _loaded_after(statement: str) -> tuple[set[str], subprocess.CompletedProcess]:
    names = ", ".join(repr(m) for m in OPTIONAL_HEAVY)
    result = _run_python(f"{statement}\nimport sys\nsys.__stdout__.write(repr(sorted(m for m in ({names}) if m in sys.modules)))")
    assert result.returncode == 0, result.stderr
    return set(ast.literal_eval(result.stdout.splitlines()[-1] if result.stdout else "[]")), result


@pytest.mark.slow
def test_import_vmamba2d_is_lean_and_silent():
    """``import vmamba2d`` prints nothing and loads no onnx / onnxscript / matplotlib, nor triton
    beyond what timm itself loads (timm imports torchvision, which imports torch._dynamo, which
    imports triton when it is installed: that is timm's, not the package's)."""
    result = _run_python("import vmamba2d")
    assert result.returncode == 0, result.stderr
    assert (result.stdout, result.stderr) == ("", "")
    loaded, _ = _loaded_after("import vmamba2d")
    by_timm, _ = _loaded_after("import timm")
    assert loaded - by_timm == set(), f"import vmamba2d loads {sorted(loaded - by_timm)}"
    assert not loaded & {"onnx", "onnxscript", "matplotlib"}


def test_ss2d_reaches_the_cpu_kernel_in_three_files_without_coming_back(monkeypatch):
    """Following the data from SS2D to the compiled kernel: the package's files on the stack when
    the extension's route kernel is called are ss2d.py -> ops/interface.py -> ops/compiled/cross_ops.py
    (torch's dispatcher frames in between are not the package's), none entered twice."""
    import traceback

    import torch

    from vmamba2d.models.ss2d import SS2D
    from vmamba2d.ops import backend_info
    from vmamba2d.ops.compiled import cross_ops

    if not backend_info()["cpu_extension"]:
        pytest.skip("needs the compiled CPU kernel")
    stacks = []
    real_module = cross_ops.kernel_module

    class Recording:
        def __init__(self, module):
            self.module = module

        def cross_forward(self, *args):
            stacks.append([frame.filename for frame in traceback.extract_stack()])
            return self.module.cross_forward(*args)

    monkeypatch.setattr(cross_ops, "kernel_module", lambda device: Recording(real_module(device)))
    torch.manual_seed(0)
    mixer = SS2D(8, d_state=2, scan_backend="cpu").eval()
    with torch.no_grad():
        mixer(torch.randn(1, 8, 5, 6))
    assert len(stacks) == 1
    ours = [Path(f).resolve().relative_to(PACKAGE).as_posix() for f in stacks[0]
            if Path(f).resolve().is_relative_to(PACKAGE)]
    visited = [f for i, f in enumerate(ours) if i == 0 or f != ours[i - 1]]
    assert visited == ["models/ss2d.py", "ops/interface.py", "ops/compiled/cross_ops.py"]
