"""Day-one trust (issue 24): model files are data, a failed start leaves nothing behind, every mistake is one
line, Ctrl-C saves, the numbers a user reads are right, exports behave like shared files."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from brisk.cli import main
from brisk.safe_load import UnsafeFileError, load_torch_file

from .conftest import DEMO_CONFIG, tiny_overrides


def _error_line(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


# --------------------------------------------------------------------------------- files are data
class _RunsACommand:
    """Unpickling this would create ``marker`` (a stand-in for any command a file's author chose)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil_file(tmp_path, legacy: bool):
    marker = tmp_path / "MARKER"
    path = tmp_path / ("evil_legacy.pt" if legacy else "evil.pt")
    obj = {"state_dict": {"w": torch.zeros(2)}, "extra": _RunsACommand(marker)}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path, marker


@pytest.mark.parametrize("legacy", [False, True])
def test_a_pickle_that_runs_a_command_is_refused_and_nothing_runs(tmp_path, legacy):
    path, marker = _evil_file(tmp_path, legacy)
    with pytest.raises(UnsafeFileError) as e:
        load_torch_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_an_unsafe_model_init_is_one_line_exit_2_through_the_cli(tmp_path, capsys):
    path, marker = _evil_file(tmp_path, legacy=False)
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"model.init={path}"])
    assert str(path) in line and "posix.system" in line and "refused" in line
    assert not marker.exists()


def test_a_model_init_with_other_keys_says_counts_and_first_keys(tmp_path, capsys):
    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"encoder.foo": torch.zeros(2), "bar": torch.zeros(1)}}, path)
    line = _error_line(capsys, ["train", str(DEMO_CONFIG), *tiny_overrides(tmp_path / "run"), f"model.init={path}"])
    assert f"{path}: keys do not match" in line and "2 unexpected" in line and "'bar'" in line and "missing (e.g. [" in line


def test_rng_state_is_plain_data_and_round_trips(tmp_path):
    from brisk.train.checkpoint import rng_state, set_rng_state

    torch.manual_seed(1), random.seed(2), np.random.seed(3)
    torch.save({"rng": rng_state()}, tmp_path / "c.pt")
    want = (torch.rand(3), random.random(), np.random.rand(3))
    set_rng_state(load_torch_file(tmp_path / "c.pt")["rng"])  # weights_only=True
    got = (torch.rand(3), random.random(), np.random.rand(3))
    assert torch.equal(want[0], got[0]) and want[1] == got[1] and np.array_equal(want[2], got[2])


def test_a_checkpoint_written_before_the_rule_still_loads(tmp_path):
    """Older checkpoints hold numpy's RNG state as a numpy array: numpy's array reconstruction is allowed."""
    from brisk.train.checkpoint import set_rng_state

    np.random.seed(5)
    old = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    torch.save({"rng": old, "config": {"a": 1}}, tmp_path / "old.pt")
    want = np.random.rand(2)
    set_rng_state(load_torch_file(tmp_path / "old.pt")["rng"])
    assert np.array_equal(np.random.rand(2), want)


def test_an_array_of_python_objects_is_still_refused(tmp_path):
    marker = tmp_path / "MARKER"
    arr = np.empty(1, dtype=object)
    arr[0] = _RunsACommand(marker)
    torch.save({"a": arr}, tmp_path / "obj.pt")
    with pytest.raises(UnsafeFileError):
        load_torch_file(tmp_path / "obj.pt")
    assert not marker.exists()
