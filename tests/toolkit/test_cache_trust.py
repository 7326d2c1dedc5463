"""The release cache is trusted only as far as it can be checked (issue 57): a slim tree carries the sha256 of
each of its files (checked against the wheel's RECORD when cut) and is checked on every read; a changed
file is cut again from the wheel with one line on stderr, or, offline with no wheel cached, is an error
naming the file, never a quietly different `matrix --offline` verdict. Every folder the cache gets is 0755
and every file 0644 at most, whatever the umask (under umask 0 they were 0777 and 0666).

Real pip downloads a real wheel from a local folder (the ``index`` fixture of test_release_cache.py).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tests.toolkit.test_release_cache import RELEASE, WHEEL, index  # noqa: F401 - the fixture
from toolkit import cli, matrix, patch_registry
from toolkit.kit import _releases as releases

SLIM_PROTOCOL = "sglang/srt/protocol.py"
# what an edit of the cached protocol.py did: the demo patch's anchor gone, the verdict changed quietly
EDITED = b"class Renamed:\n    text: str\n"


def _matrix(capsys, *extra: str) -> tuple[int, dict, str]:
    code = cli.main(["matrix", "sglang", "--release", "sglang==0.5.9", "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def _cut(capsys) -> Path:
    code, data, _ = _matrix(capsys)
    assert code == 0 and data["ok"] is True, data
    slim = releases.slim_dir(*RELEASE)
    assert json.loads((slim / releases.SLIM_MARKER).read_text())["sha256"][SLIM_PROTOCOL]
    return slim


def test_an_edited_slim_file_is_cut_again_with_one_line(index, capsys):  # noqa: F811
    slim = _cut(capsys)
    release = (slim / SLIM_PROTOCOL).read_bytes()
    (slim / SLIM_PROTOCOL).write_bytes(EDITED)
    code, data, err = _matrix(capsys)
    assert code == 0 and data["ok"] is True, data  # the release's verdict, not the edited file's
    lines = [line for line in err.splitlines() if "cutting the slim tree" in line]
    assert len(lines) == 1 and f"{slim / SLIM_PROTOCOL} differs from the wheel's RECORD" in lines[0], err
    assert (slim / SLIM_PROTOCOL).read_bytes() == release
    _, _, err = _matrix(capsys)
    assert "cutting" not in err  # whole again: read without a word


def test_an_edited_slim_protocol_offline_is_an_error_naming_it_not_another_verdict(index, capsys):  # noqa: F811
    slim = _cut(capsys)
    (slim / SLIM_PROTOCOL).write_bytes(EDITED)
    assert list(releases.cache_dir().rglob("*.whl")) == []  # the matrix kept no wheel: nothing to cut from
    code, data, _ = _matrix(capsys, "--offline")
    assert code == 1 and data["ok"] is False and "cells" not in data, data
    assert f"{slim / SLIM_PROTOCOL} differs from the wheel's RECORD" in data["error"], data
    assert "offline forbids" in data["error"] and "\n" not in data["error"]
    # a file added to the tree (a reader would take it for the release's) is refused the same way
    (slim / SLIM_PROTOCOL).unlink()
    code, data, _ = _matrix(capsys)  # online: cut again from the index
    assert code == 0 and data["ok"] is True
    (slim / "sglang/srt/extra.py").write_text("x = 1\n")
    code, data, _ = _matrix(capsys, "--offline")
    assert code == 1 and "extra.py is not a file of the wheel" in data["error"], data


def test_an_edited_slim_protocol_offline_is_cut_again_from_a_cached_wheel(index, capsys):  # noqa: F811
    releases.download(*RELEASE)  # a cached wheel, as scripts/fetch_sources.py keeps it
    slim = _cut(capsys)
    (slim / SLIM_PROTOCOL).write_bytes(EDITED)
    (index / WHEEL).unlink()  # no index either: only the cached wheel
    code, data, err = _matrix(capsys, "--offline")
    assert code == 0 and data["ok"] is True, data
    assert "cutting the slim tree of sglang==0.5.9 again" in err
    assert (slim / SLIM_PROTOCOL).read_bytes() != EDITED


def test_a_slim_tree_without_hashes_is_cut_again(index, capsys):  # noqa: F811
    """A slim tree cut by an older toolkit has no hashes to check: it is cut again, once."""
    slim = _cut(capsys)
    marker = json.loads((slim / releases.SLIM_MARKER).read_text())
    del marker["sha256"]
    (slim / releases.SLIM_MARKER).write_text(json.dumps(marker))
    code, _, err = _matrix(capsys)
    assert code == 0 and "holds no sha256 of its files" in err
    assert "sha256" in json.loads((slim / releases.SLIM_MARKER).read_text())


def test_a_wheel_whose_file_differs_from_its_record_is_not_cut(index, tmp_path):  # noqa: F811
    import zipfile

    bad = tmp_path / "bad" / WHEEL
    bad.parent.mkdir()
    with zipfile.ZipFile(index / WHEEL) as good, zipfile.ZipFile(bad, "w") as out:
        for name in good.namelist():
            out.writestr(name, EDITED if name == SLIM_PROTOCOL else good.read(name))
    (index / WHEEL).write_bytes(bad.read_bytes())
    try:
        releases.ensure_slim(*RELEASE, ["srt/protocol.py"])
        raise AssertionError("cut from a wheel that does not match its RECORD")
    except releases.PatchError as exc:
        assert f"{SLIM_PROTOCOL} differs from its RECORD" in str(exc)
    assert not releases.slim_dir(*RELEASE).exists()


def cache_modes(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): stat.S_IMODE(p.lstat().st_mode) for p in [cache, *cache.rglob("*")]}


def assert_never_more_open(cache: Path) -> None:
    for name, mode in cache_modes(cache).items():
        limit = 0o755 if (cache / name).is_dir() else 0o644
        assert mode & ~limit == 0, f"{name} is {oct(mode)}"


def test_the_release_cache_under_umask_0(index, capsys):  # noqa: F811
    """The wheel pip downloads, `matrix` (the slim tree, the lock) and an unpacked whole tree, all under
    umask 0: folders 0755, files 0644."""
    (index / WHEEL).chmod(0o666)
    old = os.umask(0)
    try:
        releases.download(*RELEASE)
        code, _, _ = _matrix(capsys)
        releases.unpack(*RELEASE, releases.find_wheel(*RELEASE))
    finally:
        os.umask(old)
    assert code == 0
    cache = releases.cache_dir()
    modes = cache_modes(cache)
    assert modes["sources-slim/sglang-0.5.9/" + SLIM_PROTOCOL] == 0o644
    assert modes[f"sources/wheels/{WHEEL}"] == 0o644 and modes["sources/sglang-0.5.9"] == 0o755
    assert_never_more_open(cache)
    assert {m for n, m in modes.items() if (cache / n).is_dir()} == {0o755}


def test_a_077_umask_is_kept(index, capsys):  # noqa: F811
    old = os.umask(0o077)
    try:
        releases.download(*RELEASE)
        code, _, _ = _matrix(capsys)
    finally:
        os.umask(old)
    assert code == 0
    modes = cache_modes(releases.cache_dir())
    assert modes["sources-slim/sglang-0.5.9/" + SLIM_PROTOCOL] == 0o600  # what we write: the umask applied
    assert_never_more_open(releases.cache_dir())


def test_the_wheel_repair_downloads_is_0644_under_umask_0(index, tmp_path, monkeypatch):  # noqa: F811
    from toolkit.engine.repair import pip_download

    (index / WHEEL).chmod(0o666)  # as a download under umask 0 leaves it: pip keeps a found-link file's mode
    old = os.umask(0)
    try:
        wheel = pip_download(os.environ.get("PYTHON", "") or __import__("sys").executable)(*RELEASE)
    finally:
        os.umask(old)
    assert stat.S_IMODE(wheel.lstat().st_mode) == 0o644
    assert_never_more_open(releases.cache_dir())
    assert [p.name for p in (releases.cache_dir() / "wheels").iterdir()] == [WHEEL]  # no partial folder left


def test_matrix_run_reads_the_slim_tree_it_checked(index, capsys):  # noqa: F811
    """The check is on every read: matrix.run (the API) takes the same path."""
    slim = _cut(capsys)
    (slim / SLIM_PROTOCOL).write_bytes(EDITED)
    cells = matrix.run(patch_registry.registry(), [RELEASE])
    assert {(c.patch, c.golden) for c in cells} == {("demo", "ok"), ("second", "ok")}
    capsys.readouterr()
