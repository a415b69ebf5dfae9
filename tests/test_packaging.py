"""The wheel a user installs holds every module and data file of the tree.

An editable install (the README's, CI's) imports from the checkout and so hides a subpackage left out of the
wheel: `pytest_msprobe.online` once was, and `--msprobe-online` failed with an ImportError after a plain
`pip install`. This builds the wheel as pip does and compares it with the tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("pytest_msprobe", "bench_functions", "api_specs")


def tree_files() -> set[str]:
    """Every file of the shipped packages in the checkout, as a wheel names it."""
    found = set()
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_wheel_holds_every_file_of_the_packages(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="77", reason="building the wheel needs setuptools>=77 (pyproject.toml)")
    # from a copy: setuptools reuses the checkout's build/ folder, which may still hold a module the
    # configuration no longer ships
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for package in SHIPPED:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("pytest_msprobe-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.split("/")[0] in SHIPPED}
    expected = tree_files()
    assert "pytest_msprobe/online/receiver.py" in expected
    assert sorted(expected - shipped) == []
    assert sorted(shipped - expected) == []
