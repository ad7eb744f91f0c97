"""`flow.train.SimpleCheckPointManager`: OneFlow 0.3's automatic checkpoints in one root folder.

Each `save()` writes a new checkpoint folder `<root_path>/<prefix><timestamp>` (the timestamp is
local time as `%Y%m%d_%H%M%S_%f`, e.g. `snapshot_20240131_235959_000123`, OneFlow's naming); the
checkpoints are the root's folders whose name starts with the prefix and that hold a
`snapshot_done` file, sorted by name, so the latest is the last.  The folders are flowc's (and
OneFlow's) checkpoint format, written and read by flowc.runtime.checkpoint: saves stay atomic, loads
check every value before writing any.

Where flowc is stricter than OneFlow, and why:

* The prefix must be part of one folder name (no `/`, NUL, leading `.`): a prefix like `../x`
  would put checkpoints outside `root_path`.
* A checkpoint folder is untrusted input.  Only real folders directly in the root are listed: a
  symbolic link (to a folder elsewhere) and a `snapshot_done` that is not a regular file are
  skipped, as are hidden names (`.<name>.saving-...` is a save in progress, or one that was killed).
* A new name always sorts after the latest checkpoint: when the clock is behind it (set back, or the
  autumn's daylight-saving hour: the timestamp is local time, as OneFlow's is), the name is the
  latest's time plus one microsecond, so `latest_checkpoint()` is the one saved last.

Example:
    manager = flow.train.SimpleCheckPointManager("./checkpoints")
    manager.initialize_or_restore()       # the latest checkpoint, or initial values (saved at once)
    for step in range(1000):
        train_job(images, labels)
        if step % 100 == 99:
            manager.save()
"""
from __future__ import annotations

import datetime
import os
import stat
import threading

from flowc.runtime import checkpoint as _impl
from flowc.runtime.checkpoint import CheckpointError
from flowc.runtime.session import default_session

# OneFlow's `_NextSnapshotName`: local time to the microsecond; fixed width, so names sort by time.
TIMESTAMP_FORMAT = "%Y%m%d_%H%M%S_%f"
TIMESTAMP_LENGTH = len(datetime.datetime(2000, 1, 1).strftime(TIMESTAMP_FORMAT))
# A save first writes `.<name>.saving-<host>-<pid>-<8 hex>` (flowc.runtime.checkpoint), which must fit
# the file name limit too.  Reserve for a 64-byte host name (Linux's HOST_NAME_MAX) and a 7-digit pid
# (Linux's largest pid_max), so a prefix that works on one machine works on the others (a host with a
# longer name allows less: `prefix_problem`).
TEMP_NAME_RESERVE = len(".") + len(".saving-") + 64 + len("-") + 7 + len("-") + 8
MAX_PREFIX_BYTES = _impl.FILE_NAME_MAX_BYTES - TIMESTAMP_LENGTH - TEMP_NAME_RESERVE
_API = "flow.train.SimpleCheckPointManager"


def _now() -> datetime.datetime:
    """The local time a new checkpoint is named after (tests replace it to set the clock)."""
    return datetime.datetime.now()


def prefix_problem(prefix: object) -> str | None:
    """Why `prefix` cannot start the checkpoint folder names in a root folder, or None when it can.

    Example:
        prefix_problem("../snapshot_")   # "contains '/' ..."
    """
    if not isinstance(prefix, str):
        return f"must be a str, got {type(prefix).__name__}"
    if "/" in prefix or os.sep in prefix or (os.altsep and os.altsep in prefix):
        return "contains '/': a checkpoint's name must be one folder directly in root_path"
    if "\0" in prefix:
        return "contains a NUL character"
    if prefix.startswith("."):
        return ("starts with '.': hidden names in the root are flowc's saves in progress "
                "('.<name>.saving-...'), never listed as checkpoints")
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid Unicode text (it holds a lone surrogate character)"
    # this host's temporary name may be longer than the reserve (a long FQDN): it must fit as well
    reserve = max(TEMP_NAME_RESERVE, len(_impl._temp_folder_name("").encode("utf-8", "replace")))
    limit = _impl.FILE_NAME_MAX_BYTES - TIMESTAMP_LENGTH - reserve
    if size > limit:
        return (f"is {size:,} bytes long in UTF-8; at most {limit} bytes are allowed, so that the checkpoint's "
                f"folder name (prefix, {TIMESTAMP_LENGTH}-character timestamp) and its temporary name while it "
                f"is saved fit the {_impl.FILE_NAME_MAX_BYTES}-byte file name limit")
    return None


class SimpleCheckPointManager:
    """Save checkpoints into `root_path` under names that sort by time, and start a run from the
    latest one (OneFlow's `flow.train.SimpleCheckPointManager`).

    `root_path` is created if it does not exist (as OneFlow does) and must be a folder.  Every method
    first traces the job functions defined so far, as `flow.train.CheckPoint` does, so they may come
    before the first job call.

    Example:
        manager = flow.train.SimpleCheckPointManager("./models", prefix="lenet_")
        manager.initialize_or_restore()
        ...
        manager.save()                    # ./models/lenet_20240131_235959_000123
        manager.latest_checkpoint()       # 'lenet_20240131_235959_000123'
    """

    def __init__(self, root_path: str | os.PathLike, prefix: str = "snapshot_") -> None:
        problem = prefix_problem(prefix)
        if problem is not None:
            raise CheckpointError(f"{_API}: prefix {_impl.shorten_name(str(prefix))} {problem}")
        root = os.fspath(root_path)
        if not isinstance(root, str):
            raise CheckpointError(f"{_API}: root_path must be a str or os.PathLike of str, got {root!r}")
        if not os.path.exists(root):
            os.makedirs(root, exist_ok=True)     # another rank or process may create it at the same time
        if not os.path.isdir(root):
            raise CheckpointError(f"{_API}: root_path {root} exists and is not a folder")
        self._root_path = root
        self._prefix = prefix
        # One save at a time per manager: two threads' saves in one microsecond would pick one name.
        self._lock = threading.Lock()

    @property
    def root_path(self) -> str:
        return self._root_path

    @property
    def prefix(self) -> str:
        return self._prefix

    def list_checkpoints(self) -> list[str]:
        """The names (not paths) of the complete checkpoints in the root, oldest first: its folders
        whose name starts with the prefix and that hold a `snapshot_done` file, sorted by name.

        Example:
            manager.list_checkpoints()   # ['snapshot_20240131_120000_000001', 'snapshot_20240131_130000_000002']
        """
        try:
            names = os.listdir(self._root_path)
        except OSError as e:
            raise CheckpointError(f"{_API}: cannot list root_path {self._root_path} ({e.strerror})") from e
        return sorted(name for name in names if self._is_checkpoint(name))

    def latest_checkpoint(self) -> str | None:
        """The name of the last checkpoint of `list_checkpoints()`, or None where there is none.

        Example:
            name = manager.latest_checkpoint()
            if name is not None:
                values = flow.checkpoint.get(os.path.join(manager.root_path, name))
        """
        names = self.list_checkpoints()
        return names[-1] if names else None

    def initialize_or_restore(self) -> None:
        """Load the latest checkpoint; where there is none, initialize every variable (as
        `flow.train.CheckPoint().init()`) and save that state as the first checkpoint (OneFlow's rule).

        A damaged latest checkpoint is an error naming it, not a silent fallback to an older one.

        Example:
            manager.initialize_or_restore()
        """
        session = default_session()
        session.trace_jobs(f"{_API}.initialize_or_restore()")
        name = self.latest_checkpoint()
        if name is not None:
            _impl.load(session, self._path(name))
            return
        _impl.init(session)
        self.save()

    def save(self) -> None:
        """Save every variable (optimizer state and train step counters included) as a new
        checkpoint `<prefix><timestamp>` in the root, atomically: it is listed complete or not at all.

        Example:
            manager.save()
        """
        session = default_session()
        session.trace_jobs(f"{_API}.save()")
        with self._lock:
            _impl.save(session, self._path(self._next_name()))

    # -----------------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        # The prefix is checked and listed names come from os.listdir, so this holds; kept as the one
        # rule that a checkpoint is read from or written to a folder directly in the root.
        if name in ("", ".", "..") or os.path.basename(name) != name or (os.altsep and os.altsep in name):
            raise CheckpointError(f"{_API}: checkpoint name {_impl.shorten_name(name)} is not a folder name")
        return os.path.join(self._root_path, name)

    def _is_checkpoint(self, name: str) -> bool:
        if not name.startswith(self._prefix) or name.startswith("."):
            return False
        folder = os.path.join(self._root_path, name)
        try:
            if not stat.S_ISDIR(os.lstat(folder).st_mode):        # a link to a folder elsewhere: not ours
                return False
            return stat.S_ISREG(os.lstat(os.path.join(folder, _impl.SNAPSHOT_DONE)).st_mode)
        except OSError:
            return False

    def _timestamp_of(self, name: str) -> datetime.datetime | None:
        try:
            return datetime.datetime.strptime(name[len(self._prefix):], TIMESTAMP_FORMAT)
        except ValueError:                      # a folder named by hand: not one of ours
            return None

    def _next_name(self) -> str:
        when = _now()
        latest = self.latest_checkpoint()
        latest_time = self._timestamp_of(latest) if latest is not None else None
        if latest_time is not None and latest_time >= when:
            when = latest_time + datetime.timedelta(microseconds=1)
        name = self._prefix + when.strftime(TIMESTAMP_FORMAT)
        # Not listed but present (a folder without snapshot_done, a file): the next microsecond.
        while os.path.lexists(os.path.join(self._root_path, name)):
            when += datetime.timedelta(microseconds=1)
            name = self._prefix + when.strftime(TIMESTAMP_FORMAT)
        return name
