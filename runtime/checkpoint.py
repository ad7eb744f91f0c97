"""Checkpoints in OneFlow's directory format, so models move between OneFlow and flowc.

A checkpoint is a folder holding one sub-folder per variable and an empty `snapshot_done`:

    path/
      hidden-weight/out     raw C-order little-endian bytes of the array
      hidden-weight/meta    VariableMetaInfo { shape { dim: 512 dim: 784 } data_type: kFloat }
      ...
      System-Train-TrainStep-train_job/out    the job's step counter, an int64 scalar
      snapshot_done

Optimizer state (`<var>-momentum`, `<var>-m`, `<var>-v`) is made of ordinary session variables
and is saved with the rest; each train job's step counter (`Session.train_steps`) is saved as a
variable-like folder and restored by `load`.

Rules this module keeps:

* Saving is atomic: everything is written (and fsync'ed) into a temporary sibling folder that is
  renamed to `path` only when complete; a failed save removes it, so an interrupted save never
  leaves a folder that loads.  `path` must not exist or be an empty folder (OneFlow's rule).
* Loading validates every variable (meta shape and dtype against the declared variable, the byte
  size of `out`) before it changes any value, and every error names the variable.  A checkpoint
  without `snapshot_done` is incomplete and refused.  Folders without `meta` (OneFlow's legacy
  format) load when the shape is known from the declared variable.
* Variables are declared when a job is first traced, while OneFlow programs load before the first
  call: a value for a variable not yet declared waits in `Session.pending_values` and becomes the
  variable's initial value when it is declared (`take_pending`, called by the session).
* Values are written in place (`np.copyto`): compiled steps hold pointers into the arrays.
* Never pickle: arrays are read with an explicit little-endian dtype.
* A variable's name is its folder's name, so which names are allowed is decided once, when a job
  declares the variable (`check_variable_name`, called by `flow.get_variable`), not discovered
  at the first save: no `/` (OneFlow reads `op/blob`, so its variables cannot have one either),
  not `snapshot_done` or the train step prefix, at most MAX_VARIABLE_NAME_BYTES of UTF-8.
* A save's temporary folder is named after the host and pid that write it; the next save into
  the same parent folder removes those of this host whose process is gone (a killed save).
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowc.compiler.errors import FlowError
from flowc.compiler.ir import TensorType, numpy_dtype
from flowc.runtime.devices import sync_to_device
from flowc.runtime.world import detect_world

SNAPSHOT_DONE = "snapshot_done"
TRAIN_STEP_PREFIX = "System-Train-TrainStep-"

# A name is one folder name: 255 bytes on Linux, macOS and Windows file systems.  The variable's
# optimizer state is saved beside it as `<name>-momentum` (SGD) or `<name>-m`, `<name>-v` (Adam),
# so the name leaves room for the longest of those suffixes.
FILE_NAME_MAX_BYTES = 255
MAX_VARIABLE_NAME_BYTES = FILE_NAME_MAX_BYTES - len("-momentum")

# flowc dtype names <-> OneFlow's DataType enum names (as protobuf text format writes them).
ONEFLOW_DTYPE = {"float16": "kFloat16", "float32": "kFloat", "float64": "kDouble", "int8": "kInt8", "int32": "kInt32",
                 "int64": "kInt64", "uint8": "kUInt8"}
FROM_ONEFLOW_DTYPE = {v: k for k, v in ONEFLOW_DTYPE.items()}


class CheckpointError(FlowError, ValueError):
    """A checkpoint cannot be saved or loaded; the message names the folder and the variable."""


# ---------------------------------------------------------------------------------------------
# The on-disk format of one variable
# ---------------------------------------------------------------------------------------------
def format_meta(shape: tuple[int, ...], dtype: str) -> str:
    """The `meta` text of a variable.

    Example:
        format_meta((512, 784), "float32")
        # 'VariableMetaInfo { shape { dim: 512 dim: 784 } data_type: kFloat }'
    """
    dims = "".join(f"dim: {int(d)} " for d in shape)
    return f"VariableMetaInfo {{ shape {{ {dims}}} data_type: {ONEFLOW_DTYPE[dtype]} }}"


_DIMS = re.compile(r"\bshape\s*\{([^}]*)\}")
_DIM = re.compile(r"\bdim\s*:\s*(-?\d+)")
_DATA_TYPE = re.compile(r"\bdata_type\s*:\s*(\w+)")


def parse_meta(text: str, name: str, where: str) -> TensorType:
    """Read a `meta` file: the one-line form above or protobuf's multi-line text format."""
    shape_block = _DIMS.search(text)
    data_type = _DATA_TYPE.search(text)
    if data_type is None:
        raise CheckpointError(f"checkpoint {where}: variable {name!r}: cannot read its meta file "
                              f"(no data_type): {text.strip()[:200]!r}")
    dtype = FROM_ONEFLOW_DTYPE.get(data_type.group(1))
    if dtype is None:
        raise CheckpointError(f"checkpoint {where}: variable {name!r} has data_type {data_type.group(1)}, "
                              f"which flowc does not support (it supports {', '.join(FROM_ONEFLOW_DTYPE)})")
    shape = tuple(int(d) for d in _DIM.findall(shape_block.group(1))) if shape_block else ()
    if any(d < 0 for d in shape):
        raise CheckpointError(f"checkpoint {where}: variable {name!r} has a negative dimension in its "
                              f"meta shape {list(shape)}")
    return TensorType(shape, dtype)


def _little_endian(dtype: str) -> np.dtype:
    return numpy_dtype(dtype).newbyteorder("<")


def _fsync_dir(path: str) -> None:
    """Make a folder's entries durable; a no-op where the file system cannot fsync folders."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _write_file(path: str, data) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_variable(folder: str, name: str, value: np.ndarray, dtype: str) -> None:
    """Write `folder/name/out` and `folder/name/meta` (tests monkeypatch this to interrupt a save)."""
    var_dir = os.path.join(folder, name)
    os.mkdir(var_dir)
    data = np.asarray(value, dtype=_little_endian(dtype), order="C")
    _write_file(os.path.join(var_dir, "out"), data.data.cast("B") if data.size else b"")
    _write_file(os.path.join(var_dir, "meta"), format_meta(data.shape, dtype).encode())
    _fsync_dir(var_dir)


@dataclass
class SavedVariable:
    """One variable of a checkpoint on disk, read when asked (`flow.checkpoint.get`).

    `type` is the shape and dtype from its `meta`, or None for a legacy folder without one: then
    the shape comes from the variable it is loaded into (`read_as`).
    """
    name: str
    folder: str
    type: TensorType | None
    checkpoint: str

    @property
    def out_path(self) -> str:
        return os.path.join(self.folder, "out")

    @property
    def shape(self) -> tuple[int, ...] | None:
        return self.type.shape if self.type is not None else None

    @property
    def dtype(self) -> str | None:
        return self.type.dtype if self.type is not None else None

    def nbytes_on_disk(self) -> int:
        return os.path.getsize(self.out_path)

    def numpy(self) -> np.ndarray:
        """The array, read from disk now.  A legacy folder (no meta) needs its variable declared."""
        if self.type is None:
            from flowc.runtime.session import default_session
            slot = default_session().variables.get(self.name)
            if slot is None:
                raise CheckpointError(f"checkpoint {self.checkpoint}: variable {self.name!r} has no meta file "
                                      f"(legacy format), so its shape and dtype are unknown until a job "
                                      f"declares it; load it with flow.load_variables or CheckPoint().load")
            return self.read_as(slot.type)
        return self.read_as(self.type)

    def read_as(self, want: TensorType) -> np.ndarray:
        """Read the array as a variable of type `want`, checking meta and byte size against it."""
        if self.type is not None:
            check_type(self.name, want, self.type, f"checkpoint {self.checkpoint}")
        expected = want.nbytes
        actual = self.nbytes_on_disk()
        if actual != expected:
            raise CheckpointError(f"checkpoint {self.checkpoint}: variable {self.name!r}: its out file has "
                                  f"{actual} bytes, expected {expected} ({want}); the file is truncated, "
                                  f"corrupt or from a different model")
        data = np.fromfile(self.out_path, dtype=_little_endian(want.dtype), count=want.size)
        if data.size != want.size:     # the file changed under us
            raise CheckpointError(f"checkpoint {self.checkpoint}: variable {self.name!r}: read {data.size} "
                                  f"values, expected {want.size}")
        return np.asarray(data.reshape(want.shape), dtype=numpy_dtype(want.dtype), order="C")

    def __repr__(self) -> str:
        what = str(self.type) if self.type is not None else "legacy, shape from the declared variable"
        return f"<SavedVariable {self.name!r} {what} in {self.checkpoint}>"


def check_type(name: str, declared: TensorType, found: TensorType, where: str) -> None:
    """Raise unless `found` has the declared shape and dtype; the message names the variable."""
    if tuple(found.shape) != tuple(declared.shape):
        raise CheckpointError(f"{where}: variable {name!r} has shape {list(found.shape)} but is declared "
                              f"with shape {list(declared.shape)}")
    if found.dtype != declared.dtype:
        raise CheckpointError(f"{where}: variable {name!r} has dtype {found.dtype} but is declared "
                              f"with dtype {declared.dtype}")


# ---------------------------------------------------------------------------------------------
# Reading a checkpoint folder
# ---------------------------------------------------------------------------------------------
def read_checkpoint(path: str | os.PathLike) -> dict[str, SavedVariable]:
    """The variables of the checkpoint at `path` (nothing read yet but the meta files)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path}: no such folder")
    if not os.path.isfile(os.path.join(path, SNAPSHOT_DONE)):
        raise CheckpointError(f"checkpoint {path} is incomplete: it has no {SNAPSHOT_DONE} file (the save "
                              f"that wrote it did not finish, or this is not a checkpoint folder)")
    found: dict[str, SavedVariable] = {}
    for name in sorted(os.listdir(path)):
        folder = os.path.join(path, name)
        if not os.path.isdir(folder):
            continue
        out, meta = os.path.join(folder, "out"), os.path.join(folder, "meta")
        if not os.path.isfile(out):
            if os.path.exists(meta):
                raise CheckpointError(f"checkpoint {path}: variable {name!r} has a meta file but no out file")
            continue                                     # not a variable folder
        var_type = None
        if os.path.isfile(meta):
            var_type = parse_meta(_read_meta_text(meta, name, path), name, path)
        found[name] = SavedVariable(name, folder, var_type, path)
    return found


def _read_meta_text(meta: str, name: str, where: str) -> str:
    """A meta file's text; a file that cannot be read or is not text is a CheckpointError naming it."""
    try:
        with open(meta, "rb") as f:
            data = f.read(1 << 20)              # a real meta file is one line; more is not one
    except OSError as e:
        raise CheckpointError(f"checkpoint {where}: variable {name!r}: cannot read its meta file {meta} "
                              f"({e.strerror})") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"checkpoint {where}: variable {name!r}: its meta file {meta} is not text "
                              f"(byte {e.start} is {data[e.start:e.start + 1]!r}); the checkpoint is damaged, "
                              f"or this folder is not a checkpoint") from None


# ---------------------------------------------------------------------------------------------
# Session operations
# ---------------------------------------------------------------------------------------------
@dataclass
class PendingValue:
    """A value loaded for a variable no job has declared yet; it becomes the variable's initial value
    when a job declares it (`take_pending`)."""
    data: np.ndarray          # the typed array, or the raw bytes (uint8) of a legacy folder without meta
    raw: bool                 # legacy: shape and dtype come from the declaration, checked by byte size
    cast_ok: bool             # a user's array (load_variables): same-kind dtype conversion is allowed
    source: str               # where it came from, for messages

    def describe(self) -> str:
        if self.raw:
            return f"{self.data.nbytes} bytes"
        return f"shape {list(self.data.shape)} ({self.data.dtype})"


def take_pending(session, name: str, declared: TensorType, loc: str) -> np.ndarray:
    """The pending value of `name` checked against its declaration, as a fresh array; called by
    `Session.declare_variable`.  The entry is removed only when it fits."""
    pending: PendingValue = session.pending_values[name]
    target = numpy_dtype(declared.dtype)
    if pending.raw:
        ok = pending.data.nbytes == declared.nbytes
    else:
        ok = tuple(pending.data.shape) == tuple(declared.shape) and (
            pending.data.dtype == target
            or (pending.cast_ok and np.can_cast(pending.data.dtype, target, casting="same_kind")))
    if not ok:
        raise CheckpointError(f"{loc}: variable {name!r} is declared with shape {list(declared.shape)} "
                              f"({declared.dtype}, {declared.nbytes} bytes), but the value loaded for it from "
                              f"{pending.source} has {pending.describe()}")
    value = pending.data.view(_little_endian(declared.dtype)).reshape(declared.shape) if pending.raw \
        else pending.data
    del session.pending_values[name]
    return np.array(value, dtype=target, order="C", copy=True)


def _current_value(session, name: str) -> np.ndarray:
    return session.value(name)


def save(session, path: str | os.PathLike, var_dict: dict[str, Any] | None = None) -> None:
    """Write every variable of `session` (and its train step counters) to a fresh folder `path`, or,
    given `var_dict`, exactly its entries (name -> array or object with `.numpy()`) and nothing else."""
    path = os.path.abspath(os.fspath(path))
    if not detect_world().is_master:
        # A worker of a distributed run, before its first job call (after it, only the master runs the
        # script): the master writes the logical variables, once; two ranks writing would race.
        return
    _check_fresh(path)
    session.sync("flow.checkpoint.save()")        # the values after every call made so far
    entries = _dict_entries(var_dict) if var_dict is not None else _session_entries(session)
    _write_checkpoint(path, entries)


def _dict_entries(var_dict: Any) -> list[tuple[str, np.ndarray, str | None]]:
    """The entries of `flow.checkpoint.save(path, var_dict)`, each value checked before anything is written."""
    if not isinstance(var_dict, dict):
        raise CheckpointError(f"flow.checkpoint.save: var_dict must be a dict of name -> value, got "
                              f"{type(var_dict).__name__}")
    entries: list[tuple[str, np.ndarray, str | None]] = []
    for name, value in var_dict.items():
        if not isinstance(name, str):
            raise CheckpointError(f"flow.checkpoint.save: var_dict keys must be variable names (str), got "
                                  f"{name!r}")
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if array.dtype.name not in ONEFLOW_DTYPE:
            raise CheckpointError(f"flow.checkpoint.save: the value for variable {name!r} has dtype "
                                  f"{array.dtype}, which flowc does not support (it supports "
                                  f"{', '.join(ONEFLOW_DTYPE)})")
        entries.append((name, np.array(array, order="C", copy=True), array.dtype.name))
    return entries


def _session_entries(session) -> list[tuple[str, np.ndarray, str | None]]:
    """(name, value, dtype; None: raw bytes) of every variable, loaded value and train step counter.
    One consistent cut: no step runs while they are copied, so a save made while another thread
    trains holds them as some whole number of steps left them."""
    entries: list[tuple[str, np.ndarray, str | None]] = []
    with session.holding_steps():
        for name in list(session.variables):
            entries.append((name, _current_value(session, name).copy(), session.variables[name].type.dtype))
        for name, pending in session.pending_values.items():   # loaded, not declared yet: keep them as loaded
            if name not in session.variables:
                entries.append((name, pending.data, None if pending.raw else pending.data.dtype.name))
        for job, steps in session.train_steps.items():
            entries.append((TRAIN_STEP_PREFIX + job, np.array(steps, dtype=np.int64), "int64"))
    return entries


def _write_checkpoint(path: str, entries: list[tuple[str, np.ndarray, str | None]]) -> None:
    for name, _, _ in entries:
        _check_name(name)
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    remove_dead_temp_folders(parent)
    tmp = os.path.join(parent, _temp_folder_name(base))
    os.mkdir(tmp)
    try:
        for name, value, dtype in entries:
            if dtype is None:                     # a legacy value stays legacy: out only
                os.mkdir(os.path.join(tmp, name))
                _write_file(os.path.join(tmp, name, "out"), value.tobytes())
            else:
                _write_variable(tmp, name, value, dtype)
        _write_file(os.path.join(tmp, SNAPSHOT_DONE), b"")
        _fsync_dir(tmp)
        try:
            os.rename(tmp, path)                  # atomic; replaces only an empty folder
        except OSError as e:
            raise CheckpointError(f"checkpoint {path}: cannot save there ({e.strerror}); save into a new "
                                  f"folder") from e
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# `.<base>.saving-<host>-<pid>-<8 hex>`: who writes it, so a later save can tell a dead save's
# folder from one in progress.  The host matters when the folder is shared over the network: a pid
# is only known dead on its own machine.
_TEMP_FOLDER = re.compile(r"\..*\.saving-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{8}")


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def _temp_folder_name(base: str) -> str:
    return f".{base}.saving-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                   # another user's process: alive
        return True
    except OverflowError:                     # not a pid at all
        return False
    return True


def remove_dead_temp_folders(parent: str) -> list[str]:
    """Remove the temporary folders in `parent` left by saves of this host's processes that died
    (killed mid-save: `save` removes its own on every error it sees); return their paths.

    A folder of a live process (a save in progress, this process's own included), of another
    host, or with a name of another form is left alone.
    """
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed                        # the save itself reports an unusable folder
    host = _host()
    for name in names:
        match = _TEMP_FOLDER.fullmatch(name)
        if match is None or match["host"] != host or _pid_alive(int(match["pid"])):
            continue
        folder = os.path.join(parent, name)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _check_fresh(path: str) -> None:
    base = os.path.basename(path)
    extra = len(_temp_folder_name("").encode("utf-8", "surrogateescape"))
    size = len(base.encode("utf-8", "surrogateescape"))
    if size + extra > FILE_NAME_MAX_BYTES:
        # the save writes `.<name>.saving-<host>-<pid>-<hex>` first: say so here, not with the OS's error
        raise CheckpointError(f"checkpoint {shorten_name(path)}: its folder name is {size} bytes long; a save first "
                              f"writes a temporary folder {extra} bytes longer, so the name may have at most "
                              f"{FILE_NAME_MAX_BYTES - extra} bytes (the file name limit is {FILE_NAME_MAX_BYTES})")
    if os.path.isdir(path):
        if os.listdir(path):
            raise CheckpointError(f"checkpoint {path}: the folder exists and is not empty; save into a new "
                                  f"folder (OneFlow does not overwrite a checkpoint)")
    elif os.path.exists(path):
        raise CheckpointError(f"checkpoint {path}: exists and is not a folder")


def variable_name_problem(name: str, max_bytes: int = MAX_VARIABLE_NAME_BYTES) -> str | None:
    """Why `name` cannot be a variable's name (its checkpoint folder's name), or None when it can.

    `max_bytes` is MAX_VARIABLE_NAME_BYTES for a name a user declares, FILE_NAME_MAX_BYTES for a
    folder a save writes (an optimizer state's `<name>-momentum` uses the room left for it).

    Example:
        variable_name_problem("dense/weight")
        # "contains '/', which a checkpoint folder name cannot hold ..."
    """
    if name == SNAPSHOT_DONE:
        return f"is reserved: {SNAPSHOT_DONE!r} is the file that marks a checkpoint complete"
    if name.startswith(TRAIN_STEP_PREFIX):
        return f"starts with {TRAIN_STEP_PREFIX!r}, reserved for the train step counters of checkpoints"
    if max_bytes < FILE_NAME_MAX_BYTES:
        why = (f"so that its checkpoint folder (and its optimizer state's, '<name>-momentum') fits the "
               f"{FILE_NAME_MAX_BYTES}-byte file name limit")
    else:
        why = "the file name limit"
    return _folder_name_problem(name, max_bytes, why)


def _folder_name_problem(name: str, max_bytes: int, why_max: str) -> str | None:
    if not name or name in (".", ".."):
        return "is not a folder name"
    if "/" in name or os.sep in name:
        return ("contains '/', which a checkpoint folder name cannot hold (nor can OneFlow use it: it "
                "names a variable's value 'name/out'); use '-' as flow.layers does ('dense-weight')")
    if "\0" in name:
        return "contains a NUL character"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate character)"
    if size > max_bytes:
        return f"is {size:,} bytes long in UTF-8; at most {max_bytes} bytes are allowed, {why_max}"
    return None


def check_variable_name(name: str, where: str, max_bytes: int = MAX_VARIABLE_NAME_BYTES) -> None:
    """Raise CheckpointError unless `name` can be a variable's name; `where` starts the message."""
    problem = variable_name_problem(name, max_bytes)
    if problem is not None:
        raise CheckpointError(f"{where}: variable name {shorten_name(name)} {problem}")


def shorten_name(name: str) -> str:
    """repr(name), cut to 60 characters: a 10,000-character name must not fill the message."""
    text = repr(name)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]} ({len(name):,} characters)"


def _check_name(name: str) -> None:
    if not name.startswith(TRAIN_STEP_PREFIX):
        check_variable_name(name, "cannot save", FILE_NAME_MAX_BYTES)
        return
    problem = _folder_name_problem(name, FILE_NAME_MAX_BYTES, "the file name limit")
    if problem is not None:                      # the job's name makes the folder's
        raise CheckpointError(f"cannot save the train step counter of job "
                              f"{shorten_name(name[len(TRAIN_STEP_PREFIX):])}: its folder name {problem}")


def resolve(session, name: str, value: Any, where: str) -> np.ndarray | PendingValue:
    """Read and check `value` (an array, an object with `.numpy()`, or a SavedVariable) for variable
    `name`: the array to write for a declared variable, a PendingValue for one not declared yet."""
    slot = session.variables.get(name)
    if isinstance(value, SavedVariable):
        if slot is not None:
            return value.read_as(slot.type)
        source = f"checkpoint {value.checkpoint}"
        if value.type is None:
            return PendingValue(np.fromfile(value.out_path, dtype=np.uint8), True, False, source)
        return PendingValue(value.read_as(value.type), False, False, source)
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.dtype.name not in ONEFLOW_DTYPE:
        raise CheckpointError(f"{where}: the value for variable {name!r} has dtype {array.dtype}, which "
                              f"flowc does not support (it supports {', '.join(ONEFLOW_DTYPE)})")
    if slot is None:
        return PendingValue(np.array(array, order="C", copy=True), False, True, where)
    if tuple(array.shape) != tuple(slot.type.shape):
        raise CheckpointError(f"{where}: the value for variable {name!r} has shape {list(array.shape)} but "
                              f"the variable is declared with shape {list(slot.type.shape)}")
    target = numpy_dtype(slot.type.dtype)
    if not np.can_cast(array.dtype, target, casting="same_kind"):
        raise CheckpointError(f"{where}: the value for variable {name!r} has dtype {array.dtype}, which "
                              f"cannot be converted to the variable's {slot.type.dtype}")
    return np.asarray(array, dtype=target, order="C")


def assign(session, values: dict[str, Any], steps: dict[str, int]) -> None:
    """Write checked values into the session: in place for declared variables, pending otherwise."""
    session.sync("loading variables (flow.load_variables, a checkpoint load)")   # calls made so far: old values
    with session.holding_steps():                  # and no other thread's step sees half of the new ones
        for name, value in values.items():
            slot = session.variables.get(name)
            if slot is None:                       # no job has declared it yet
                session.pending_values[name] = value
            elif slot.value is None:
                slot.value = np.array(value, dtype=numpy_dtype(slot.type.dtype), order="C")
            else:
                np.copyto(slot.value, value, casting="same_kind")   # compiled steps point into it
        session.train_steps.update(steps)
        sync_to_device(session)                    # GPU jobs read their device copies
        if session.cluster is not None:            # a distributed session: the workers get them before the next step
            session.cluster.variables_sent = False


def _train_step(value: Any, name: str, where: str) -> int:
    if isinstance(value, SavedVariable):
        array = value.read_as(TensorType((), "int64") if value.type is None else value.type)
    else:
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.size != 1 or array.dtype.kind not in "iu":
        raise CheckpointError(f"{where}: {name!r} must hold one integer (a train step count), got "
                              f"{array.dtype}{list(array.shape)}")
    return int(array.reshape(()))


def load_values(session, values: dict[str, Any], where: str, ignore_unknown: bool = True) -> None:
    """Check every value, then assign them all (a failed load changes nothing)."""
    checked: dict[str, Any] = {}
    steps: dict[str, int] = {}
    for name, value in values.items():
        if name.startswith(TRAIN_STEP_PREFIX):
            steps[name[len(TRAIN_STEP_PREFIX):]] = _train_step(value, name, where)
            continue
        if name not in session.variables:     # kept for a later declaration: refuse what none could be
            check_variable_name(name, where, FILE_NAME_MAX_BYTES)    # (an optimizer state's name is longer)
        if not ignore_unknown and name not in session.variables:
            known = ", ".join(sorted(session.variables)) or "none yet: no job has been called"
            raise CheckpointError(f"{where}: variable {name!r} is not declared in this session (declared: "
                                  f"{known}); pass ignore_mismatch=True to skip unknown names")
        checked[name] = resolve(session, name, value, where)
    assign(session, checked, steps)


def load(session, path: str | os.PathLike) -> None:
    """Load the checkpoint at `path` into `session` (before or after its jobs are first called)."""
    path = os.fspath(path)
    load_values(session, read_checkpoint(path), f"checkpoint {path}")


def init(session) -> None:
    """Initialize every declared variable from its initializer, in place; forget loaded values
    still pending and the train step counters (OneFlow's init starts training afresh)."""
    session.sync("flow.train.CheckPoint().init()")
    with session.holding_steps():                  # one consistent cut, as a load takes
        session.pending_values.clear()
        session.initialize_all(force=True)
        session.train_steps.clear()
        sync_to_device(session)


class VariableValue:
    """A copy of one variable's current value (what `flow.get_all_variables()` maps names to)."""

    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name = name
        self._value = value

    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.shape

    @property
    def dtype(self) -> np.dtype:
        return self._value.dtype

    def numpy(self) -> np.ndarray:
        return self._value.copy()

    def __repr__(self) -> str:
        return f"<VariableValue {self.name!r} {self._value.dtype}{list(self._value.shape)}>"


def all_variables(session) -> dict[str, VariableValue]:
    session.sync("flow.get_all_variables()")
    with session.holding_steps():           # one consistent cut, as a save takes
        return {name: VariableValue(name, _current_value(session, name).copy()) for name in list(session.variables)}
