"""agenthost as a package other code lives beside: its namespace, its metadata, what its wheel carries, and a plugin
that ships modules with the generic names agenthost's folders have in the repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SUBPACKAGES = ("host", "plugins", "protos", "runners")


@pytest.mark.e2e
def test_a_project_with_its_own_plugins_protos_runners_imports_them_beside_agenthost(tmp_path: Path) -> None:
    for name in SUBPACKAGES:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MARK = 'project {name}'\n")
    code = (
        "import json, host, plugins, protos, runners\n"
        "import agenthost.host.cli.main, agenthost.host.api.client, agenthost.protos.host_pb2\n"
        "from agenthost.runners.sdk import Runner\n"
        "from agenthost.plugins.manifest import RunnerManifest\n"
        "print(json.dumps({m.__name__: m.MARK for m in (host, plugins, protos, runners)}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {name: f"project {name}" for name in SUBPACKAGES}


def test_every_folder_of_code_is_a_package_the_wheel_carries() -> None:
    """pyproject lists the packages by name (the repository's folders are renamed into one namespace), so a new
    folder of modules must be added there: forgotten, the editable install still imports it and only the wheel
    fails, with ModuleNotFoundError at the first `agenthost` command."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    renamed = {folder: name for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
    missing: set[str] = set()
    for top, name in renamed.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            folder = path.parent.relative_to(ROOT / top)
            if "examples" in folder.parts or "__pycache__" in folder.parts:
                continue
            package = ".".join([name, *folder.parts])
            if package not in listed:
                missing.add(package)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_version_lives_in_pyproject_only() -> None:
    from importlib.metadata import version

    assert version("agenthost") == PYPROJECT["project"]["version"]
    literal = re.compile(r"""version\s*=\s*["']\d+\.\d+""")
    for path in [ROOT / "host" / "cli" / "main.py", ROOT / "host" / "cli" / "demo.py"]:
        assert not literal.search(path.read_text()), path


def test_metadata_license_classifiers_and_typing_markers() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    classifiers = set(project["classifiers"])
    assert "Typing :: Typed" in classifiers
    low, high = "Programming Language :: Python :: 3.11", "Programming Language :: Python :: 3.13"
    assert {low, high} <= classifiers and project["requires-python"] == ">=3.11"
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for name in SUBPACKAGES:
        assert (ROOT / name / "py.typed").exists()
        assert "py.typed" in data[f"agenthost.{name}"]
    # What `plugins install --offline` builds source directories with (no index, so no isolated build env).
    assert any(
        re.match(r"setuptools>=(\d+)", d) and int(re.match(r"setuptools>=(\d+)", d)[1]) >= 71
        for d in project["dependencies"]
    )


@pytest.mark.slow
def test_the_wheel_carries_the_example_plugin_typing_markers_and_license(tmp_path: Path) -> None:
    # No build isolation: the test stays offline, using this environment's setuptools.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("agenthost-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    example = "agenthost/plugins/examples/notes-runner/"
    assert {f"{example}pyproject.toml", f"{example}README.md", f"{example}agenthost_notes/__init__.py"} <= names
    assert {f"agenthost/{name}/py.typed" for name in SUBPACKAGES} <= names
    console = "agenthost/host/api/gateway/console_static/"
    assert {f"{console}index.html", f"{console}app.js", f"{console}style.css"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any("/build/" in n or ".egg-info" in n or "__pycache__" in n for n in names)
    metadata = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Typing :: Typed" in metadata


@pytest.mark.slow
async def test_a_plugin_shipping_its_own_protos_module_installs_and_runs(tmp_path: Path) -> None:
    from agenthost.host.api.client import HostClient
    from agenthost.host.server import Host
    from agenthost.protos import host_pb2 as hpb

    async with Host(tmp_path / "data", builtin_plugins=False) as host:
        async with HostClient(host.admin_address, token=host.admin_token, timeout=300) as c:
            source = str(ROOT / "tests" / "fixtures" / "protos-plugin")
            info = await c.call("InstallPlugin", hpb.InstallPluginRequest(source=source, offline=True))
            assert info.state == "ready" and [r.runner_id for r in info.runners] == ["agenthost-protos-clash/clash"]
            await c.call("CreateBot", hpb.CreateBotRequest(name="b"))
            await c.bind("b", "agenthost-protos-clash/clash")
            result = await c.send("b", "which protos?")
    assert result.run.status == "completed", result.run.error_message
    assert result.text == "the plugin's own protos; agenthost's: agenthost.v1"
