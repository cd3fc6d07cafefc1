"""Dependencies point one way: ``tbe_plugin.ops`` <- ``tbe_plugin.module`` <-
``tbe_plugin.torchrec`` <- ``pipelines`` (the library) <- ``pipelines.app`` <-
``pipelines.bench``.

Reads the source with ``ast`` (nothing is imported), so an import inside a function counts
as much as one at the top, and so does a module named in a string that is looked up
(``importlib.import_module("pipelines.app.config")``, a ``"module:function"`` target).
"""

import ast
import re
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A string that names a module, maybe with ":function" (docstrings and messages do not match).
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(?:\.\w+)*(?::\w+)?")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def named_modules(path: Path, root: Path = ROOT) -> Iterator[Tuple[int, str]]:
    """(line, dotted name) of every module ``path`` imports or names in a string: for
    ``from p import x`` both ``p`` and ``p.x`` (``x`` may be a submodule); relative imports
    resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bare_strings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare_strings:
            if MODULE_NAME.fullmatch(node.value):
                yield node.lineno, node.value.partition(":")[0]


def is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def sources(folder: str, excluding: Sequence[str] = ()) -> List[Path]:
    found = [p for p in sorted((ROOT / folder).rglob("*.py"))
             if not any(p.is_relative_to(ROOT / other) for other in excluding)]  # fmt: skip
    assert found, f"no Python files under {folder}"
    return found


def violations(paths: Sequence[Path], forbidden: Sequence[str], root: Path = ROOT) -> List[str]:
    """``file:line imports name`` for each line of ``paths`` that names a module under one
    of ``forbidden``."""
    found = {}
    for path in paths:
        for line, name in named_modules(path, root):
            if any(is_under(name, prefix) for prefix in forbidden):
                found.setdefault((str(path.relative_to(root)), line), name)
    return [f"{path}:{line} imports {name}" for (path, line), name in sorted(found.items())]


RULES = {
    "the library never imports the app or the benchmarks": (
        sources("pipelines", excluding=("pipelines/app", "pipelines/bench")), ("pipelines.app", "pipelines.bench"),
    ),
    "the app never imports the benchmarks": (sources("pipelines/app"), ("pipelines.bench",)),
    "tbe_plugin never imports pipelines": (sources("tbe_plugin"), ("pipelines",)),
    "tbe_plugin.ops imports neither the module, the adapter, TorchRec nor FBGEMM": (
        sources("tbe_plugin/ops"), ("tbe_plugin.module", "tbe_plugin.torchrec", "torchrec", "fbgemm_gpu"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("rule", RULES)
def test_dependencies_point_one_way(rule):
    paths, forbidden = RULES[rule]
    assert violations(paths, forbidden) == [], rule


def test_the_reader_sees_every_kind_of_import(tmp_path):
    """The rules are only as good as the reader: a top-level, a lazy, a relative and a
    looked-up import of the app are all found, a docstring naming it is not."""
    package = tmp_path / "pipelines"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "library.py").write_text(
        '"""Mentions pipelines.app in prose."""\n'
        "import pipelines.app.train\n"
        "def f():\n"
        "    from pipelines.app.config import ConfigError\n"
        "    from . import bench\n"
        "    from .app import data\n"
        "    return __import__('importlib').import_module('pipelines.app.config')\n"
    )  # fmt: skip
    found = violations([package / "library.py"], ("pipelines.app", "pipelines.bench"), root=tmp_path)
    assert [int(entry.split(":")[1].split()[0]) for entry in found] == [2, 4, 5, 6, 7], found


def test_config_error_is_one_class():
    """The app re-exports the library's ``ConfigError``: a hold recognizes the app's."""
    from pipelines.app.config import ConfigError as AppConfigError
    from pipelines.errors import ConfigError

    assert AppConfigError is ConfigError
