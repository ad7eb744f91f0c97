"""flowc.compiler.settings: each accessor's parsing, and that the table stays the one place.

Three checks keep it so: every FLOWC_ name in the sources is declared, nothing outside
compiler/settings.py touches the environment, and README.md's table is the generated one.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from flowc.compiler import settings

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "python -m flowc.compiler.settings --write-readme   (from the repository root)"

ACCESSORS = {
    "FLOWC_CACHE_DIR": settings.cache_dir,
    "FLOWC_CORE_DIR": settings.core_dir,
    "FLOWC_LOCK_TIMEOUT": settings.lock_timeout,
    "FLOWC_DEBUG": settings.debug_level,
    "FLOWC_PROFILE": settings.profile,
    "FLOWC_TF32": settings.tf32,
    "FLOWC_CUDA_PER_LAUNCH": settings.cuda_per_launch,
    "FLOWC_STRICT_DEVICE": settings.strict_device,
    "FLOWC_DEVICES_PER_MACHINE": settings.devices_per_machine,
    "FLOWC_COMM_TIMEOUT": settings.comm_timeout,
    "FLOWC_MPICC": settings.mpicc,
    "FLOWC_NCCL": settings.nccl,
    "CXX": settings.cxx,
    "NVCC": settings.nvcc,
    "CUDA_HOME": settings.cuda_home,
    "CUDA_PATH": settings.cuda_home,
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No declared variable set (the test session's own FLOWC_CACHE_DIR is restored afterwards)."""
    for s in settings.SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    return monkeypatch


# --- parsing -------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, level", [(None, 0), ("", 0), ("0", 0), ("1", 1), ("2", 2), (" 3 ", 3),
                                        ("-1", -1), ("abc", 1), ("yes", 1), ("1.5", 1)])
def test_debug_level(clean_env, raw, level):
    if raw is not None:
        clean_env.setenv("FLOWC_DEBUG", raw)
    assert settings.debug_level() == level
    assert settings.debug() is (level >= 1)


@pytest.mark.parametrize("accessor, name", [(settings.profile, "FLOWC_PROFILE"), (settings.tf32, "FLOWC_TF32")])
@pytest.mark.parametrize("raw, on", [(None, False), ("", False), ("0", False), ("1", True), ("yes", True),
                                     ("2", True)])
def test_flags_are_on_unless_empty_or_zero(clean_env, accessor, name, raw, on):
    if raw is not None:
        clean_env.setenv(name, raw)
    assert accessor() is on


@pytest.mark.parametrize("raw, on", [(None, False), ("", False), ("0", False), ("1", True), ("true", False),
                                     (" 1", False)])
def test_strict_device_is_on_only_for_1(clean_env, raw, on):
    if raw is not None:
        clean_env.setenv("FLOWC_STRICT_DEVICE", raw)
    assert settings.strict_device() is on


@pytest.mark.parametrize("name, accessor, default", [
    ("FLOWC_CACHE_DIR", settings.cache_dir, Path.home() / ".cache" / "flowc"),
    ("FLOWC_CORE_DIR", settings.core_dir, Path.home() / ".cache" / "flowc-core"),
])
def test_cache_folders(clean_env, tmp_path, name, accessor, default):
    assert accessor() == default
    clean_env.setenv(name, "")
    assert accessor() == default
    clean_env.setenv(name, str(tmp_path / "c"))
    assert accessor() == tmp_path / "c"
    clean_env.setenv(name, "~/somewhere")
    assert accessor() == Path.home() / "somewhere"


def test_set_cache_dir_makes_the_folder_absolute_for_this_process_and_its_children(clean_env, tmp_path):
    clean_env.chdir(tmp_path)
    clean_env.setenv("FLOWC_CACHE_DIR", "restored by monkeypatch afterwards")
    settings.set_cache_dir("rel")
    assert settings.cache_dir() == tmp_path / "rel"
    assert os.environ["FLOWC_CACHE_DIR"] == str(tmp_path / "rel")


@pytest.mark.parametrize("name, accessor", [("CXX", settings.cxx), ("NVCC", settings.nvcc)])
def test_commands_are_stripped_and_blank_is_unset(clean_env, name, accessor):
    assert accessor() is None
    clean_env.setenv(name, "   ")
    assert accessor() is None
    clean_env.setenv(name, " ccache g++ -O1 ")
    assert accessor() == "ccache g++ -O1"


def test_cuda_home_then_cuda_path_then_usr_local_cuda(clean_env):
    assert settings.cuda_home() == Path("/usr/local/cuda")
    clean_env.setenv("CUDA_PATH", "/opt/cuda-path")
    assert settings.cuda_home() == Path("/opt/cuda-path")
    clean_env.setenv("CUDA_HOME", "")
    assert settings.cuda_home() == Path("/opt/cuda-path")
    clean_env.setenv("CUDA_HOME", "/opt/cuda-home")
    assert settings.cuda_home() == Path("/opt/cuda-home")


def test_the_callers_follow_the_environment(clean_env, tmp_path, capsys):
    from flowc.compiler import cache, cached_build, core_library, toolchain
    clean_env.setenv("FLOWC_CACHE_DIR", str(tmp_path / "a"))
    clean_env.setenv("FLOWC_CORE_DIR", str(tmp_path / "b"))
    clean_env.setenv("FLOWC_DEBUG", "abc")
    assert cache.default_cache_dir() == tmp_path / "a"
    assert core_library.core_dir() == tmp_path / "b"
    cached_build.debug("a miss, say")
    assert "[flowc] a miss, say" in capsys.readouterr().err
    clean_env.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(toolchain.ToolchainError, match=r"from \$CXX"):
        toolchain.find_compiler()


# --- the table -----------------------------------------------------------------------------------

def test_the_table_is_well_formed():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    for s in settings.SETTINGS:
        assert s.kind in ("flag", "level", "path", "text"), s
        assert s.doc and s.default and s.read_by, s
        assert "\n" not in s.doc, f"{s.name}: one paragraph, so one table row"
        # FLOWC_ names are flowc's own (or the test suite's); the others are the toolchain's.
        assert (s.scope == "toolchain") is (not s.name.startswith("FLOWC_")), s
    assert settings.setting("FLOWC_DEBUG").kind == "level"
    with pytest.raises(KeyError):
        settings.setting("FLOWC_NO_SUCH_THING")


def test_every_declared_variable_has_an_accessor():
    source = (ROOT / "compiler" / "settings.py").read_text()
    for s in settings.SETTINGS:
        if s.scope == "tests":
            continue          # read by tests/conftest.py, which sets up the environment flowc then reads
        assert re.search(rf'_(raw|flag|text|path)\("{s.name}"\)', source), f"no accessor reads {s.name}"
        assert s.name in ACCESSORS, f"add {s.name}'s accessor to ACCESSORS in this test"


@pytest.mark.parametrize("name", [s.name for s in settings.SETTINGS if s.kind in ("flag", "level")])
def test_the_declared_default_of_a_switch_is_what_unset_means(clean_env, name):
    unset = ACCESSORS[name]()
    clean_env.setenv(name, settings.setting(name).default.strip("`"))
    assert ACCESSORS[name]() == unset


@pytest.mark.parametrize("name", ["FLOWC_CACHE_DIR", "FLOWC_CORE_DIR", "CUDA_PATH"])
def test_the_declared_default_of_a_folder_is_what_unset_means(clean_env, name):
    assert ACCESSORS[name]() == Path(settings.setting(name).default.strip("`")).expanduser()


# --- the table is the one place ------------------------------------------------------------------

SOURCE_DIRS = ("compiler", "runtime", "flow", "flowc", "codegen_templates")
C_SUFFIXES = (".h", ".cpp", ".cu", ".j2")


def _sources(dirs=SOURCE_DIRS, suffixes=(".py", *C_SUFFIXES)) -> list[Path]:
    # os.walk does not follow links, so flowc/compiler (a link to compiler/) is read once.
    found = []
    for top in dirs:
        for folder, _, files in os.walk(ROOT / top):
            found += [Path(folder) / f for f in files if f.endswith(suffixes)]
    return sorted(found)


def _c_macros(files: list[Path]) -> set[str]:
    """FLOWC_ names the C++ preprocessor owns: on a #define/#if... line of a C++ file, or passed as -D."""
    macros = set()
    for path in files:
        text = path.read_text()
        macros |= set(re.findall(r"-D(FLOWC_[A-Z0-9_]+)", text))
        if path.suffix in C_SUFFIXES:
            for line in re.findall(r"^\s*#\s*(?:define|undef|ifdef|ifndef|if|elif)\b.*$", text, re.M):
                macros |= set(re.findall(r"FLOWC_[A-Z0-9_]+", line))
    return macros


def test_every_flowc_variable_in_the_sources_is_declared():
    files = [*_sources(), ROOT / "tests" / "conftest.py"]
    assert any(p.name == "flowc_gemm.h" for p in files) and any(p.name == "step.cpp.j2" for p in files)
    macros = _c_macros(files)
    declared = {s.name for s in settings.SETTINGS}
    assert not macros & declared, "a name is both a C++ macro and an environment variable"
    assert "FLOWC_KERNEL" in macros and "FLOWC_CORE_LIBRARY" in macros
    where: dict[str, str] = {}
    for path in files:
        for name in re.findall(r"FLOWC_[A-Z0-9_]+", path.read_text()):
            where.setdefault(name, str(path.relative_to(ROOT)))
    missing = {n: p for n, p in where.items() if n not in declared and n not in macros}
    assert not missing, f"declare these environment variables in compiler/settings.py: {missing}"


def test_only_the_settings_module_touches_the_environment():
    offenders = []
    for path in _sources(("compiler", "runtime", "flow", "flowc"), (".py",)):
        if path == ROOT / "compiler" / "settings.py":
            continue
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        offenders += [f"{path.relative_to(ROOT)}:{t.start[0]}: {t.line.strip()}" for t in tokens
                      if t.type == tokenize.NAME and t.string in ("environ", "environb", "getenv", "putenv",
                                                                    "unsetenv")]
    assert not offenders, ("read environment variables through flowc.compiler.settings (declare new ones "
                           "there):\n" + "\n".join(offenders))


def test_the_readme_table_is_the_generated_one():
    section = settings.readme_section((ROOT / "README.md").read_text())
    assert section == settings.markdown_table(), (
        f"README.md's environment-variable table differs from compiler/settings.py; regenerate it: {REGENERATE}")


def test_write_readme_replaces_only_the_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\nbefore\n{settings.README_BEGIN}\n| old |\n{settings.README_END}\nafter\n")
    assert settings.write_readme(readme) is True
    text = readme.read_text()
    assert text.startswith("# t\n\nbefore\n") and text.endswith(f"{settings.README_END}\nafter\n")
    assert settings.readme_section(text) == settings.markdown_table()
    assert settings.write_readme(readme) is False
    with pytest.raises(ValueError, match="markers"):
        settings.readme_section("no table here")


def test_the_command_prints_the_table_and_the_values(clean_env):
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLOWC_TF32="1")
    def run(*args):
        return subprocess.run([sys.executable, "-m", "flowc.compiler.settings", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True)
    table = run("--markdown")
    assert table.returncode == 0, table.stderr
    assert table.stdout == settings.markdown_table() + "\n"
    values = run()
    assert values.returncode == 0, values.stderr
    assert re.search(r"^FLOWC_TF32 +'1' ", values.stdout, re.M), values.stdout
    assert run("--nonsense").returncode == 2
