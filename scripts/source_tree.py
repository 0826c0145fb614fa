"""The repository's top-level folders are the subpackages of the `agenthost` namespace only once installed
(pyproject's package-dir), so tools that read source files rather than import it — mkdocstrings for `make docs`,
mypy for `make check` — are given a tree that spells that mapping out: build/docs-src/agenthost/<part> -> <repo>/<part>.
Made when loaded: as an MkDocs hook (mkdocs.yml) that is before any plugin reads its configuration; `make check`
runs it as a script."""

from __future__ import annotations

from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
_PARTS = ("channels", "host", "plugins", "protos", "runners")

tree = _REPO / "build" / "docs-src" / "agenthost"
tree.mkdir(parents=True, exist_ok=True)
(tree / "__init__.py").touch()
for part in _PARTS:
    link = tree / part
    if not link.is_symlink():
        link.symlink_to(_REPO / part, target_is_directory=True)
