"""The instance's generated keys: one key however many processes start at once, and
never a file another process is still writing."""

from __future__ import annotations

import threading
import time

from dashboard.config import _instance_secret_key


def test_processes_starting_at_once_all_read_the_one_key(tmp_path):
    keys, start = [], threading.Barrier(8)

    def start_one() -> None:
        start.wait()
        keys.append(_instance_secret_key(tmp_path / "instance"))

    threads = [threading.Thread(target=start_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and len(keys[0]) == 64
    assert (tmp_path / "instance" / "secret_key").read_text() == keys[0]
    assert [p.name for p in (tmp_path / "instance").iterdir()] == ["secret_key"]


def test_a_key_file_still_being_written_is_waited_for(tmp_path):
    path = tmp_path / "secret_key"
    path.write_text("")  # created, not yet written (an older release's way)

    def finish() -> None:
        time.sleep(0.2)
        path.write_text("k" * 64)

    writer = threading.Thread(target=finish)
    writer.start()
    assert _instance_secret_key(tmp_path) == "k" * 64
    writer.join()
