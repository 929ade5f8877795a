"""The two commands share one virtualenv: switching between them installs nothing, and an
install covers what both need (a fake pip records what would be installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def make_venv(tmp_path: Path) -> tuple[Path, Path]:
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    pip = venv / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    pip.chmod(0o755)
    return venv, log


def source_env(venv: Path, extras: str) -> str:
    env = {**os.environ, "VENV": str(venv), "EXTRAS": extras}
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
    assert installs(log)[-1].endswith("-e .[dev,ml]")
    source_env(venv, "")  # the run command
    source_env(venv, "dev,ml")  # the test command again
    source_env(venv, "ml")  # the run command with the MiniLM model
    assert len(installs(log)) == 1


def test_an_extra_not_installed_yet_installs_the_union(tmp_path):
    venv, log = make_venv(tmp_path)
    source_env(venv, "ml")
    source_env(venv, "dev")
    assert installs(log)[-1].endswith("-e .[dev,ml]")
    source_env(venv, "ml")
    assert len(installs(log)) == 2
