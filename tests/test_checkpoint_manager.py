"""`flow.train.SimpleCheckPointManager` (flow/checkpoint_manager.py): OneFlow's naming (prefix + local
timestamp), listing and ordering, initialize_or_restore in an empty root and in a fresh session,
atomic saves, and a root folder treated as untrusted (links, hidden and incomplete folders, hostile
prefixes).

Model: one dense layer (8 -> 4) trained with SGD and momentum, so the restored state includes the
optimizer's and the train step counter.
"""
import datetime
import os
import re

import numpy as np
import pytest

import flow
import flow.checkpoint_manager as cm
import flow.typing as tp
import flowc.runtime.checkpoint as ckpt
from flow.checkpoint_manager import SimpleCheckPointManager
from flowc.runtime.checkpoint import CheckpointError
from flowc.runtime.session import default_session

N, IN, OUT = 6, 8, 4
_rng = np.random.RandomState(11)
X = _rng.uniform(-1, 1, (N, IN)).astype(np.float32)
LABELS = _rng.randint(0, OUT, (N,)).astype(np.int32)
NAME = re.compile(r"snapshot_\d{8}_\d{6}_\d{6}")      # OneFlow's "%Y%m%d_%H%M%S_%f"


def make_train_job():
    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((N, IN)), labels: tp.Numpy.Placeholder((N,), dtype=flow.int32)
                  ) -> tp.Numpy:
        logits = flow.layers.dense(x, OUT, kernel_initializer=flow.random_uniform_initializer(-0.5, 0.5),
                                   name="dense")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    return train_job


def values() -> dict[str, np.ndarray]:
    return {name: v.numpy() for name, v in flow.get_all_variables().items()}


def assert_same_bits(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


class Clock:
    """The time `cm._now` reports: set by the test, one second later at each reading unless frozen."""

    def __init__(self, start: datetime.datetime, step: datetime.timedelta = datetime.timedelta(seconds=1)):
        self.time, self.step = start, step

    def __call__(self) -> datetime.datetime:
        now = self.time
        self.time += self.step
        return now


def make_checkpoint(root, name: str, complete: bool = True) -> None:
    """A folder `root/name` that looks like a checkpoint (with snapshot_done where `complete`)."""
    folder = os.path.join(root, name)
    os.makedirs(folder)
    if complete:
        open(os.path.join(folder, "snapshot_done"), "wb").close()


# ---------------------------------------------------------------------------------------------
# Saving and listing
# ---------------------------------------------------------------------------------------------
def test_saves_are_listed_by_time_under_oneflow_names(tmp_path):
    train_job = make_train_job()
    manager = SimpleCheckPointManager(str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt").is_dir()                       # created, as OneFlow does
    assert manager.list_checkpoints() == [] and manager.latest_checkpoint() is None
    saved = []
    for _ in range(3):
        train_job(X, LABELS)
        manager.save()
        saved.append(values())
    names = manager.list_checkpoints()
    assert len(names) == 3 and all(NAME.fullmatch(n) for n in names)
    assert names == sorted(names) and len(set(names)) == 3
    assert manager.latest_checkpoint() == names[-1]
    assert sorted(os.listdir(tmp_path / "ckpt")) == names     # no temporary folder left
    for name, state in zip(names, saved):                     # each folder is a flowc checkpoint of its step
        on_disk = flow.checkpoint.get(tmp_path / "ckpt" / name)
        assert_same_bits({k: on_disk[k].numpy() for k in state}, state)
    steps = [int(flow.checkpoint.get(tmp_path / "ckpt" / n)["System-Train-TrainStep-train_job"].numpy())
             for n in names]
    assert steps == [1, 2, 3]


def test_names_are_the_local_time_and_sort_by_it(tmp_path, monkeypatch):
    monkeypatch.setattr(cm, "_now", Clock(datetime.datetime(2021, 3, 9, 9, 59, 59, 999999)))
    manager = SimpleCheckPointManager(tmp_path)
    manager.save()
    manager.save()
    assert manager.list_checkpoints() == ["snapshot_20210309_095959_999999", "snapshot_20210309_100000_999999"]


def test_a_clock_set_back_still_saves_after_the_latest(tmp_path, monkeypatch):
    # the autumn's daylight-saving hour: local time goes back; the next name must still sort last
    clock = Clock(datetime.datetime(2021, 10, 31, 2, 30), datetime.timedelta(0))
    monkeypatch.setattr(cm, "_now", clock)
    manager = SimpleCheckPointManager(tmp_path)
    manager.save()
    clock.time = datetime.datetime(2021, 10, 31, 2, 0)
    manager.save()
    manager.save()                                           # and twice in one microsecond
    assert manager.list_checkpoints() == ["snapshot_20211031_023000_000000", "snapshot_20211031_023000_000001",
                                          "snapshot_20211031_023000_000002"]
    (tmp_path / "snapshot_20211031_023000_000003").mkdir()    # present, not a checkpoint: its name is taken
    manager.save()
    assert manager.latest_checkpoint() == "snapshot_20211031_023000_000004"


def test_listing_is_oneflows_name_order_and_skips_what_is_not_a_checkpoint(tmp_path):
    root = tmp_path / "root"
    manager = SimpleCheckPointManager(root, prefix="run_")
    for name in ("run_9", "run_10", "run_20210101_000000_000000"):
        make_checkpoint(root, name)
    make_checkpoint(root, "run_incomplete", complete=False)            # a save that never finished
    make_checkpoint(root, "other_20210101_000000_000000")              # another prefix
    (root / "run_a_file").write_text("not a folder")
    make_checkpoint(root, "run_done_is_a_folder", complete=False)
    (root / "run_done_is_a_folder" / "snapshot_done").mkdir()
    # OneFlow sorts by name: its own names are fixed-width timestamps, so that is their time order;
    # names made by hand sort as text ("run_10" before "run_9")
    assert manager.list_checkpoints() == ["run_10", "run_20210101_000000_000000", "run_9"]
    assert manager.latest_checkpoint() == "run_9"


def test_interrupted_save_is_not_listed(tmp_path, monkeypatch):
    train_job = make_train_job()
    train_job(X, LABELS)
    manager = SimpleCheckPointManager(tmp_path)
    manager.save()
    first = manager.list_checkpoints()

    def fail(folder, name, value, dtype):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ckpt, "_write_variable", fail)
    with pytest.raises(OSError, match="simulated"):
        manager.save()
    assert manager.list_checkpoints() == first
    assert sorted(os.listdir(tmp_path)) == first                  # the temporary folder is gone too


# ---------------------------------------------------------------------------------------------
# initialize_or_restore
# ---------------------------------------------------------------------------------------------
def test_initialize_or_restore_in_an_empty_root_initializes_and_saves(tmp_path):
    train_job = make_train_job()
    train_job(X, LABELS)
    manager = SimpleCheckPointManager(tmp_path / "new" / "root")
    manager.initialize_or_restore()                 # OneFlow: init(), then save() as the first checkpoint
    (name,) = manager.list_checkpoints()
    assert NAME.fullmatch(name)
    assert default_session().train_steps == {}
    state = values()
    assert not np.any(state["dense-weight-momentum"]) and not np.any(state["dense-bias"])
    on_disk = flow.checkpoint.get(tmp_path / "new" / "root" / name)
    assert_same_bits({k: on_disk[k].numpy() for k in state}, state)


def test_initialize_or_restore_restores_into_a_fresh_session(tmp_path):
    root = tmp_path / "ckpt"
    train_job = make_train_job()
    manager = SimpleCheckPointManager(root)
    manager.initialize_or_restore()
    for _ in range(3):
        train_job(X, LABELS)
    manager.save()
    saved = values()
    for _ in range(2):                              # the run that never stopped
        train_job(X, LABELS)
    uninterrupted = values()

    flow.clear_default_session()
    train_job = make_train_job()
    SimpleCheckPointManager(root).initialize_or_restore()     # before the first call, as OneFlow programs do
    assert len(SimpleCheckPointManager(root).list_checkpoints()) == 2    # a restore saves nothing
    assert_same_bits(values(), saved)
    assert default_session().train_steps == {"train_job": 3}
    for _ in range(2):
        train_job(X, LABELS)
    assert_same_bits(values(), uninterrupted)


def test_a_damaged_latest_checkpoint_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(cm, "_now", Clock(datetime.datetime(2021, 1, 1)))
    train_job = make_train_job()
    train_job(X, LABELS)
    manager = SimpleCheckPointManager(tmp_path)
    manager.save()
    manager.save()
    latest = manager.latest_checkpoint()
    with open(tmp_path / latest / "dense-weight" / "out", "r+b") as f:
        f.truncate(8)
    before = values()
    with pytest.raises(CheckpointError, match=rf"{latest}.*'dense-weight'.*8 bytes, expected 128"):
        manager.initialize_or_restore()
    assert_same_bits(values(), before)              # a failed load changes nothing


# ---------------------------------------------------------------------------------------------
# The root is untrusted: nothing outside it is listed, loaded or written
# ---------------------------------------------------------------------------------------------
def test_a_link_to_a_checkpoint_elsewhere_is_not_listed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    make_checkpoint(elsewhere, "snapshot_20990101_000000_000000")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(elsewhere / "snapshot_20990101_000000_000000", root / "snapshot_20990101_000000_000000")
    make_checkpoint(root, "snapshot_20980101_000000_000000", complete=False)
    os.symlink(elsewhere / "snapshot_20990101_000000_000000" / "snapshot_done",
               root / "snapshot_20980101_000000_000000" / "snapshot_done")      # a linked marker
    assert SimpleCheckPointManager(root).list_checkpoints() == []


def test_hidden_folders_are_never_checkpoints_even_with_an_empty_prefix(tmp_path):
    # a save killed after writing snapshot_done, before its rename, leaves `.<name>.saving-<host>-<pid>-<hex>`
    make_checkpoint(tmp_path, ".snapshot_20210101_000000_000000.saving-host-12345-0123abcd")
    make_checkpoint(tmp_path, "20210101_000000_000000")
    assert SimpleCheckPointManager(tmp_path, prefix="").list_checkpoints() == ["20210101_000000_000000"]


@pytest.mark.parametrize("prefix, message", [
    ("../snapshot_", "contains '/'"),
    ("/tmp/snapshot_", "contains '/'"),
    ("runs/snapshot_", "contains '/'"),
    (".", "starts with '.'"),
    ("..", "starts with '.'"),
    (".snapshot_", "starts with '.'"),
    ("snap\0shot_", "NUL"),
    ("snap\udc80_", "lone surrogate"),
    ("s" * 240, "240 bytes long in UTF-8; at most 143 bytes are allowed"),
    ("é" * 72, "144 bytes long in UTF-8"),
    (b"snapshot_", "must be a str, got bytes"),
    (None, "must be a str, got NoneType"),
])
def test_hostile_prefixes_are_refused(tmp_path, prefix, message):
    with pytest.raises(CheckpointError, match="SimpleCheckPointManager: prefix") as info:
        SimpleCheckPointManager(tmp_path / "root", prefix=prefix)
    assert message in str(info.value)
    assert not (tmp_path / "root").exists()         # refused before anything is created
    assert len(str(info.value)) < 400               # a long prefix is shortened in the message


def test_root_path_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not a folder"):
        SimpleCheckPointManager(tmp_path / "file")
    manager = SimpleCheckPointManager(tmp_path / "gone")
    os.rmdir(tmp_path / "gone")
    with pytest.raises(CheckpointError, match="cannot list root_path"):
        manager.list_checkpoints()


def test_the_longest_prefix_fits_the_file_name_limit(tmp_path, monkeypatch):
    # the limit leaves room for the timestamp and for the temporary name a save writes first
    # (".<name>.saving-<host>-<pid>-<8 hex>"), whatever the host's name and the pid
    monkeypatch.setattr(cm, "_now", Clock(datetime.datetime(2021, 1, 1)))
    monkeypatch.setattr(ckpt, "_host", lambda: "h" * 64)
    assert cm.MAX_PREFIX_BYTES == 143
    prefix = "p" * cm.MAX_PREFIX_BYTES
    manager = SimpleCheckPointManager(tmp_path, prefix=prefix)
    manager.save()
    assert manager.list_checkpoints() == [prefix + "20210101_000000_000000"]
    with pytest.raises(CheckpointError, match="144 bytes long"):
        SimpleCheckPointManager(tmp_path, prefix=prefix + "p")
