"""`flowc launch` (flowc/cli/launch_command.py): the mpiexec command it builds for each launcher, its
refusals, and one real two-process run on loopback."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flowc.cli import launch_command, main
from flowc.cli.modules import CliError
from flowc.compiler import settings

ROOT = Path(__file__).resolve().parent.parent
HYDRA, OPEN_MPI = launch_command.FLAVOURS


def fake_mpiexec(folder: Path, version_text: str) -> Path:
    """An executable `mpiexec` that prints `version_text` for --version (and records any other call)."""
    path = folder / "mpiexec"
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo {shlex.quote(version_text)}; exit 0; fi\n"
                    f"echo \"$@\" > {shlex.quote(str(folder / 'called'))}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


def test_dry_run_prints_the_hydra_command(tmp_path, script, monkeypatch, capsys):
    mpiexec = fake_mpiexec(tmp_path, "HYDRA build details:\n    Version: 4.3.0")
    monkeypatch.setattr(launch_command, "find_mpiexec", lambda: str(mpiexec))
    assert main(["launch", "-n", "4", "--hosts", "node1,node2", "--dry-run", str(script), "--lr", "0.1",
                 "-n", "5"]) == 0
    printed = capsys.readouterr().out.strip()
    assert shlex.split(printed) == [str(mpiexec), "-disable-auto-cleanup", "-n", "4", "-hosts", "node1,node2",
                                    "-ppn", "2", "-genv",
                                    "FLOWC_DEVICES_PER_MACHINE", "2", sys.executable, str(script), "--lr", "0.1",
                                    "-n", "5"]
    assert not (tmp_path / "called").exists()          # a dry run runs nothing


def test_dry_run_prints_the_open_mpi_command(tmp_path, script, monkeypatch, capsys):
    mpiexec = fake_mpiexec(tmp_path, "mpiexec (Open MPI) 4.1.4")
    monkeypatch.setattr(launch_command, "find_mpiexec", lambda: str(mpiexec))
    assert main(["launch", "-n", "6", "--hosts", "a,b,c", "--dry-run", str(script)]) == 0
    assert shlex.split(capsys.readouterr().out) == [str(mpiexec), "-n", "6", "--host", "a:2,b:2,c:2", "-x",
                                                    "FLOWC_DEVICES_PER_MACHINE=2", sys.executable, str(script)]


def test_dry_run_quotes_hostile_arguments(tmp_path, monkeypatch, capsys):
    mpiexec = fake_mpiexec(tmp_path, "HYDRA build details:")
    monkeypatch.setattr(launch_command, "find_mpiexec", lambda: str(mpiexec))
    hostile = tmp_path / "my $(touch pwned) script.py"
    hostile.write_text("")
    assert main(["launch", "-n", "2", "--dry-run", str(hostile), "; rm -rf /", "$HOME"]) == 0
    printed = capsys.readouterr().out.strip()
    assert shlex.split(printed)[-3:] == [str(hostile), "; rm -rf /", "$HOME"]
    assert shlex.split(printed)[:7] == [str(mpiexec), "-disable-auto-cleanup", "-n", "2", "-genv",
                                        "FLOWC_DEVICES_PER_MACHINE", "2"]


def test_a_run_passes_arguments_as_argv_items_and_forwards_the_exit_code(tmp_path, script, monkeypatch):
    mpiexec = tmp_path / "mpiexec"        # prints its argv one per line, and the variable, then exits 7
    mpiexec.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo HYDRA; exit 0; fi\n"
                       f"printf '%s\\n' \"$@\" > {shlex.quote(str(tmp_path / 'argv'))}\n"
                       f"echo \"$FLOWC_DEVICES_PER_MACHINE\" > {shlex.quote(str(tmp_path / 'env'))}\nexit 7\n")
    mpiexec.chmod(0o755)
    monkeypatch.setattr(launch_command, "find_mpiexec", lambda: str(mpiexec))
    monkeypatch.setenv("FLOWC_DEVICES_PER_MACHINE", "1")     # flowc launch sets it in this process: undone after
    assert main(["launch", "-n", "2", str(script), "a b", "$(echo no)"]) == 7
    assert (tmp_path / "argv").read_text().splitlines() == ["-disable-auto-cleanup", "-n", "2", "-genv",
                                                            "FLOWC_DEVICES_PER_MACHINE", "2", sys.executable,
                                                            str(script), "a b", "$(echo no)"]
    assert (tmp_path / "env").read_text().strip() == "2"


@pytest.mark.parametrize("argv, message", [
    (["-n", "3", "--hosts", "a,b"], "-n 3 does not divide evenly over the 2 hosts of --hosts (a,b)"),
    (["-n", "0"], "-n: expected a number of processes >= 1, got 0"),
    (["-n", "2", "--hosts", "a,,b"], "--hosts: host 1 ('') is not a host name"),
    (["-n", "2", "--hosts", "a,-b"], "--hosts: host 1 ('-b') is not a host name"),
    (["-n", "2", "--hosts", "a,b c"], "--hosts: host 1 ('b c') is not a host name"),
    (["-n", "2", "--hosts", "a,a"], "--hosts: 'a' is listed twice"),
])
def test_bad_arguments_are_refused_naming_them(argv, message, script, capsys):
    assert main(["launch", *argv, str(script)]) == 2
    assert f"flowc launch: error: {message}" in capsys.readouterr().err


def test_a_missing_script_is_refused(tmp_path, capsys):
    assert main(["launch", "-n", "2", str(tmp_path / "nope.py")]) == 2
    assert "flowc launch: error: no such script:" in capsys.readouterr().err


def test_find_mpiexec_prefers_the_one_beside_python(tmp_path):
    venv_bin, other = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for folder in (venv_bin, other):
        folder.mkdir(parents=True)
        fake_mpiexec(folder, "HYDRA")
    assert launch_command.find_mpiexec(str(venv_bin / "python"), path=str(other)) == str(venv_bin / "mpiexec")
    assert launch_command.find_mpiexec(str(tmp_path / "python"), path=str(other)) == str(other / "mpiexec")
    with pytest.raises(CliError, match=r"no mpiexec beside .* or on PATH; `pip install 'flowc\[distributed\]'`"):
        launch_command.find_mpiexec(str(tmp_path / "python"), path=str(tmp_path / "empty"))


def test_an_unknown_mpiexec_is_named(tmp_path):
    mpiexec = fake_mpiexec(tmp_path, "SomeOtherMPI 1.0")
    with pytest.raises(CliError, match=r"is neither MPICH's Hydra nor Open MPI's launcher \(its --version said: "
                                       r"SomeOtherMPI 1.0\)"):
        launch_command.flavour_of(str(mpiexec))


# -- a real run ----------------------------------------------------------------------------------------
REAL_MPIEXEC = Path(sys.executable).parent / "mpiexec"
HAS_MPIEXEC = REAL_MPIEXEC.is_file() or shutil.which("mpiexec") is not None

TINY_SCRIPT = """\
import sys
import flow
from flowc.runtime.world import check_configuration, detect_world

flow.config.cpu_device_num(2)
world = detect_world()
devices = check_configuration(world, flow.config.values, flow.env.values)
# one file per rank: mpiexec forwards the ranks' stdout in chunks, so two lines can interleave
with open(f"rank{world.rank}.txt", "w") as out:
    out.write(f"rank {world.rank} of {world.size}, local {world.local_rank} of {world.local_size}, "
              f"{devices} devices per machine, args {sys.argv[1:]}")
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MPIEXEC, reason="no mpiexec (pip install 'flowc[distributed]')")
@pytest.mark.parametrize("hosts", [[], ["--hosts", "localhost"]], ids=["no_hosts", "localhost"])
def test_flowc_launch_runs_two_processes(tmp_path, hosts):
    script = tmp_path / "tiny_script.py"
    script.write_text(TINY_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in settings.MPI_LAUNCHER_VARIABLES
           and k != "FLOWC_DEVICES_PER_MACHINE"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "flowc", "launch", "-n", "2", *hosts, str(script), "--seed", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in tmp_path.glob("rank*.txt"))
    assert written == ["rank0.txt", "rank1.txt"], (written, done.stdout)
    for r in (0, 1):
        assert (tmp_path / f"rank{r}.txt").read_text() == (f"rank {r} of 2, local {r} of 2, 2 devices per machine, "
                                                           "args ['--seed', '1']")

    # the same script run alone: the configured 2 devices are refused, naming the command that matches
    alone = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert alone.returncode != 0
    assert ("WorldError: the script configures 2 devices per machine (flow.config.cpu_device_num(2)) on 1 machine "
            "(no flow.env.machine call): 2 processes, one per device, but this process runs alone (not under "
            "mpiexec); run `flowc launch -n 2 tiny_script.py`") in alone.stderr
