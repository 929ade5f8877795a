"""The run command's supervisor finds what its children leave behind: as their
subreaper, an orphan (a work horse whose worker died) is still its to stop, while the
embedded servers it is told to keep are spared for their orderly stop. And when it starts
a child that died again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.processes
def test_orphans_are_stopped_and_kept_servers_spared():
    script = textwrap.dedent("""
        import subprocess, psutil
        from dashboard.embedded import become_subreaper
        from dashboard.supervisor import stop_orphans

        become_subreaper()
        def orphan():
            # The shell exits at once: its sleep is orphaned, and re-parented to us.
            out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
                                 capture_output=True, text=True).stdout
            return int(out)
        horse, server = orphan(), orphan()
        assert psutil.Process(horse).ppid() == psutil.Process().pid
        stop_orphans(keep={server})
        print(psutil.pid_exists(horse) and psutil.Process(horse).status() != "zombie",
              psutil.Process(server).is_running())
        psutil.Process(server).kill()
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_restarts_back_off_and_the_sixth_death_in_a_minute_gives_up():
    from dashboard.supervisor import RestartPolicy

    policy = RestartPolicy()
    # A child that dies again as soon as it is up: 1 s, then twice as long each time.
    assert [policy.died(at) for at in (0.0, 1.5, 4.0, 8.5, 17.0)] == [1, 2, 4, 8, 16]
    assert policy.died(33.5) is None  # the sixth death within 60 s: restarts keep failing

    calm = RestartPolicy()
    assert [calm.died(at) for at in (0.0, 100.0, 250.0)] == [1, 1, 1]  # a minute apart
