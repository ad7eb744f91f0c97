"""runtime/arrival_watch.py without MPI: the watcher ends a waiting rank when a peer ends first and
names it; a rank already gone is named before MPI starts; nothing is watched where it cannot tell.
(tests/test_distributed_training.py runs it under mpiexec.)"""
from __future__ import annotations

import subprocess
import sys
import time

from flowc.runtime import arrival_watch
from flowc.runtime.world import World


def sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_watcher_ends_the_waiting_rank_naming_the_peer_that_ended_first(capsys):
    waiting, peer = sleeper(60), sleeper(0.2)
    try:
        start = time.monotonic()
        arrival_watch.watch(waiting.pid, 0, {peer.pid: 1})
        assert waiting.wait(timeout=10) < 0          # killed, not ended by itself
        assert time.monotonic() - start < 10
    finally:
        waiting.kill()
        peer.kill()
    err = capsys.readouterr().err
    assert f"flowc: rank 1 (pid {peer.pid} on " in err and "ended before its first job call: rank 0 stops too" in err


def test_the_watcher_leaves_when_its_rank_ends_and_spares_live_peers(capsys):
    waiting, peer = sleeper(0.3), sleeper(60)
    try:
        arrival_watch.watch(waiting.pid, 0, {peer.pid: 1})    # returns once `waiting` is gone
        assert peer.poll() is None
    finally:
        peer.kill()
        waiting.kill()
    assert capsys.readouterr().err == ""


def test_a_peer_already_gone_is_named_before_mpi_starts():
    world = World(rank=0, size=3, local_rank=0, local_size=3)
    assert arrival_watch.ended_before_call(world, {101: 1, 102: 2}, 3) is None
    message = arrival_watch.ended_before_call(world, {102: 2}, 3)
    assert message is not None and message.startswith("rank 1 of this job ended before its first job call: rank 0")
    # ranks on other hosts too: the lost one's rank is not known, only how many
    world = World(rank=2, size=4, local_rank=0, local_size=2)
    assert arrival_watch.ended_before_call(world, {}, 2).startswith("a rank of this job ended before")


def test_nothing_is_watched_outside_a_launcher():
    # pytest's parent is a shell or make, not an MPI launcher's proxy
    world = World(rank=0, size=2, local_rank=0, local_size=2)
    assert arrival_watch.local_peers(world, {"MPI_LOCALNRANKS": "2"}) is None
    watch = arrival_watch.check_arrivals(world)
    assert watch.process is None
    watch.stop()


def test_a_dead_process_and_a_zombie_are_not_alive():
    child = sleeper(0)
    deadline = time.monotonic() + 10
    while arrival_watch.alive(child.pid):       # a zombie until reaped: not alive already
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child.wait()
    assert not arrival_watch.alive(child.pid)
    live = sleeper(60)
    try:
        assert arrival_watch.alive(live.pid)
    finally:
        live.kill()
        live.wait()
