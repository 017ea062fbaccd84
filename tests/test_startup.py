"""Start-up: the Inductor cache folder is persistent by default, printed, and overridable."""

from __future__ import annotations

from brisk.config import SpeedConfig
from brisk.speed.compile import inductor_cache_dir


def test_inductor_cache_defaults_to_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert inductor_cache_dir(SpeedConfig()) == (str(tmp_path / "xdg" / "brisk" / "inductor"), "default")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "env"))
    assert inductor_cache_dir(SpeedConfig()) == (str(tmp_path / "env"), "TORCHINDUCTOR_CACHE_DIR")
    cfg = SpeedConfig(inductor_cache_dir=str(tmp_path / "cfg"))
    assert inductor_cache_dir(cfg) == (str(tmp_path / "cfg"), "speed.inductor_cache_dir")
