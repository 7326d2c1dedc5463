"""The state directory is ordinary and stays inside site-packages: 0755 directories and 0644 files
whatever the umask, and a symbolic link anywhere under ``.toolkit-state`` is refused, never followed."""

from __future__ import annotations

import os
import stat

import pytest

from toolkit import api, cli
from toolkit.errors import PatchError



pytestmark = pytest.mark.usefixtures("demo_registry")  # demo patches on the `site` tree (conftest.py)


def test_state_modes_whatever_the_umask(site):
    old = os.umask(0)
    try:
        api.apply_patch(patches=["demo"])
    finally:
        os.umask(old)
    state = site / ".toolkit-state"
    for path in [state, *state.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
    assert (state / "sglang/lock").exists() and (state / "sglang/backups/srt/serving.py").exists()


@pytest.mark.parametrize("link", [".toolkit-state", ".toolkit-state/sglang", ".toolkit-state/sglang/backups"])
def test_a_symlink_in_the_state_path_is_refused(link, site, tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (site / link).parent.mkdir(parents=True, exist_ok=True)
    (site / link).symlink_to(outside, target_is_directory=True)
    original = {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")}
    with pytest.raises(PatchError, match="is a symbolic link"):
        api.apply_patch(patches=["demo"])
    assert cli.main(["apply-patch"]) == 1
    err = capsys.readouterr().err
    assert "symbolic link" in err and len(err.strip().splitlines()) == 1
    assert list(outside.rglob("*")) == []  # nothing written through the link
    assert {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")} == original
