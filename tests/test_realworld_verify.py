"""Every kernel of the real-world corpus, brought in through `xeforge new`, verifies on the CPU interpreter against
its reference (or itself, where it has none): issue 32, item 3's first check. Slow (about 10 s a kernel)."""

from __future__ import annotations

import pytest

from tests.realworld import ENTRIES, problem_dir
from xeforge.cli import main

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ENTRIES)
def test_the_start_verifies(name, tmp_path, capsys):
    rc = main(["verify", str(problem_dir(name)), "--device", "cpu", "--runs-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and "VERIFIED CORRECT" in out, out[-2000:]
