"""Which variable names are allowed is decided when a job declares the variable (flow.get_variable),
with an error naming the argument and the user's line, never at the first checkpoint save; damaged
checkpoint files and leftovers of killed saves give checkpoint errors, not raw OS errors."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import flow
import flow.typing as tp
import flowc.runtime.checkpoint as ckpt
from flowc.compiler.errors import TraceError
from flowc.runtime.session import default_session


def job_with_variable(name: str):
    @flow.global_function(type="predict")
    def named_job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable(name, shape=(2,), initializer=flow.zeros_initializer())  # DECLARED HERE
        return x + w
    return named_job


def _declaration_line() -> str:
    with open(__file__) as f:
        number = next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# DECLARED HERE"))
    return f"{os.path.basename(__file__)}:{number}"


@pytest.mark.parametrize("name, reason", [
    ("dense/weight", "contains '/'"),
    ("snapshot_done", "is reserved"),
    ("System-Train-TrainStep-w", "reserved for the train step counters"),
    ("w" * 10_000, "10,000 bytes long"),
    ("é" * 124, "248 bytes long"),                       # 124 characters, but 248 bytes of UTF-8
    ("..", "is not a folder name"),
    ("a\0b", "NUL"),
    ("\udc80", "lone surrogate"),
])
def test_bad_names_are_refused_at_declaration_naming_the_users_line(name, reason):
    job = job_with_variable(name)
    with pytest.raises(TraceError) as info:
        job(np.zeros(2, np.float32))
    message = str(info.value)
    assert message.startswith(f"{_declaration_line()}: flow.get_variable: name ")
    assert reason in message
    assert len(message) < 600                    # a 10,000-character name is not repeated whole
    assert not default_session().variables       # nothing was declared


def test_the_longest_allowed_name_saves_with_its_optimizer_state(tmp_path):
    name = "w" * ckpt.MAX_VARIABLE_NAME_BYTES

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable(name, shape=(2,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    train_job(np.ones(2, np.float32))
    flow.checkpoint.save(str(tmp_path / "ck"))
    saved = flow.checkpoint.get(str(tmp_path / "ck"))
    assert sorted(saved) == sorted([name, f"{name}-momentum", "System-Train-TrainStep-train_job"])
    flow.clear_default_session()
    flow.load_variables(saved)                   # before any declaration: kept until a job declares them


def test_load_variables_refuses_a_name_no_job_could_declare():
    with pytest.raises(ckpt.CheckpointError, match=r"flow.load_variables: variable name 'a/b' contains '/'"):
        flow.load_variables({"a/b": np.zeros(2, np.float32)})


def _save_one(tmp_path, name="w"):
    job = job_with_variable(name)
    job(np.zeros(2, np.float32))
    path = tmp_path / "ck"
    flow.checkpoint.save(str(path))
    return path


def test_binary_meta_file_is_a_checkpoint_error_naming_the_file(tmp_path):
    path = _save_one(tmp_path)
    meta = path / "w" / "meta"
    meta.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ckpt.CheckpointError) as info:
        flow.checkpoint.get(str(path))
    message = str(info.value)
    assert str(meta) in message and "is not text" in message and "'w'" in message


def test_unreadable_meta_file_is_a_checkpoint_error_naming_the_file(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    path = _save_one(tmp_path)
    meta = path / "w" / "meta"
    meta.chmod(0)
    with pytest.raises(ckpt.CheckpointError, match=f"cannot read its meta file {meta}"):
        flow.checkpoint.get(str(path))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_save_removes_temp_folders_of_dead_saves_only(tmp_path):
    host = ckpt._host()
    dead = tmp_path / f".old.saving-{host}-{_dead_pid()}-0123abcd"
    live = tmp_path / f".other.saving-{host}-{os.getpid()}-0123abcd"     # a save in progress
    elsewhere = tmp_path / f".shared.saving-otherhost-{_dead_pid()}-0123abcd"
    unrelated = tmp_path / ".old.saving-notes"
    for folder in (dead, live, elsewhere, unrelated):
        (folder / "w").mkdir(parents=True)
        (folder / "w" / "out").write_bytes(b"\0" * 8)
    _save_one(tmp_path)
    assert not dead.exists()
    assert live.exists() and elsewhere.exists() and unrelated.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ck", live.name, elsewhere.name, unrelated.name])


def test_temp_folder_names_carry_host_and_pid(tmp_path, monkeypatch):
    seen = []
    real_write = ckpt._write_variable

    def spy(folder, *args):
        seen.append(os.path.basename(folder))
        return real_write(folder, *args)

    monkeypatch.setattr(ckpt, "_write_variable", spy)
    _save_one(tmp_path)
    match = ckpt._TEMP_FOLDER.fullmatch(seen[0])
    assert match and match["host"] == ckpt._host() and int(match["pid"]) == os.getpid()
