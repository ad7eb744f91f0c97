"""The generated C++ and CUDA of the seed jobs equal tests/golden/ byte for byte.

A failure means the compiler now generates different code.  If that is intended, run
`python -m tests.golden_sources`, review the diff of tests/golden/ and commit it with the change.
"""
import difflib

import pytest

from tests.golden_sources import GOLDEN_DIR, render_all


@pytest.fixture(scope="module")
def rendered():
    return render_all()


def test_every_golden_file_is_still_generated(rendered):
    assert sorted(p.name for p in GOLDEN_DIR.iterdir()) == sorted(rendered)


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN_DIR.iterdir()))
def test_generated_code_equals_the_golden_file(rendered, name):
    expected = (GOLDEN_DIR / name).read_text()
    actual = rendered.get(name, "")
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{name}", "generated", n=2))
        pytest.fail(f"{name} differs from its golden file (regenerate with `python -m tests.golden_sources` "
                    f"if intended):\n{diff[:4000]}")
