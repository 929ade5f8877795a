"""Settings: the instance's generated keys (one key however many processes start at once,
never a file another process is still writing), and a value no coercer can read stops the
start with the setting's name."""

from __future__ import annotations

import threading
import time

import pytest

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


def test_a_boolean_setting_is_read_strictly(monkeypatch, tmp_path):
    from dashboard.config import SettingError, settings_from_env

    for word, meant in (("Yes", True), (" on ", True), ("1", True), ("off", False),
                        ("FALSE", False), ("0", False)):
        monkeypatch.setenv("SESSION_COOKIE_SECURE", word)
        assert settings_from_env(tmp_path)["SESSION_COOKIE_SECURE"] is meant, word
    monkeypatch.setenv("SESSION_COOKIE_SECURE", "ture")  # a typo is not quietly False
    with pytest.raises(SettingError, match="^SESSION_COOKIE_SECURE: not a boolean"):
        settings_from_env(tmp_path)


def test_a_number_setting_that_is_no_number_stops_the_start(monkeypatch, tmp_path):
    from dashboard.config import SettingError, settings_from_env

    monkeypatch.setenv("TRUSTED_PROXIES", "two")
    with pytest.raises(SettingError, match="^TRUSTED_PROXIES: "):
        settings_from_env(tmp_path)


@pytest.mark.parametrize("name,bad", [("PORT", "80a"), ("PORT", "0"), ("PORT", "70000"),
                                      ("WEB_WORKERS", "0"), ("WEB_WORKERS", "two")])
def test_where_the_run_command_serves_is_read_strictly(monkeypatch, tmp_path, name, bad):
    from dashboard.config import SettingError, settings_from_env

    monkeypatch.setenv(name, bad)
    with pytest.raises(SettingError, match=f"^{name}: "):
        settings_from_env(tmp_path)


def test_the_run_command_and_stdio_read_their_settings_from_the_environment(monkeypatch,
                                                                            tmp_path):
    from dashboard.config import instance_folder, settings_from_env

    for name, value in (("HOST", "0.0.0.0"), ("PORT", "8080"), ("WEB_WORKERS", "3"),
                        ("ORBITPILOT_API_KEY", "op_key"),
                        ("ORBITPILOT_INSTANCE", str(tmp_path / "elsewhere"))):
        monkeypatch.setenv(name, value)
    settings = settings_from_env(tmp_path)
    assert (settings["HOST"], settings["PORT"], settings["WEB_WORKERS"]) == ("0.0.0.0", 8080, 3)
    assert settings["ORBITPILOT_API_KEY"] == "op_key"
    assert instance_folder(tmp_path / "default") == tmp_path / "elsewhere"
