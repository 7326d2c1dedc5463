"""The runtime-import guard (toolkit/engine/guard.py) on small modules, in a fresh interpreter each: with
``toolkit`` importable the patched module runs; without it the release's file (the backup) runs in
its place, whatever the patched code does with the runtime at module level; other import errors stay
errors; a lost backup is one clear ImportError. A ``toolkit`` folder in the working directory does not
switch the patches off (issue 49), and ``TOOLKIT_EXPECT_PATCHES`` turns every "run as the release" into a
refusal. The real engines: tests/packaging/test_runtime_gone.py; a real patched vLLM server started from a
folder with a ``toolkit/`` of its own: tests/patches/vllm/tito/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit.engine.guard import guard_runtime_imports

BACKUP = "../.toolkit-state/x/backups/mod.py"
RELEASE = "VALUE = 'release'\n"

# A module-level use of everything a stand-in must survive: a loop, a decorator, a base class, an
# annotation, a call, and a second patch's guarded import in the same file.
PATCHED = textwrap.dedent("""\
    import os
    from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
    from toolkit.patches.vllm.patch_sweep import runtime as _toolkit_sweep  # toolkit:patch-sweep
    for _item in _toolkit_tito.things:
        pass
    @_toolkit_tito.decorate("x")
    def helper():
        return 1
    class Model(_toolkit_sweep.Base):
        field: _toolkit_tito.Kind | None = None
    _toolkit_sweep.register(helper)
    VALUE = 'patched'
""")

DRIVER = textwrap.dedent("""\
    import json, sys
    site, hide, missing = sys.argv[1], sys.argv[2] == "hide", sys.argv[3]

    class Hide:
        def find_spec(self, name, path=None, target=None):
            if name == missing or name.startswith(missing + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    if hide:
        sys.meta_path.insert(0, Hide())
    sys.path.insert(0, site)
    try:
        import fakeengine.mod as mod
    except ImportError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        print(json.dumps({"value": mod.VALUE, "release": getattr(mod, "__toolkit_release__", False),
                          "names": sorted(n for n in vars(mod) if n.startswith("_toolkit"))}))
""")


def _site(tmp_path: Path, patched: str, backup: str | None = RELEASE) -> Path:
    package = tmp_path / "fakeengine"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(guard_runtime_imports(patched, "vllm", BACKUP))
    if backup is not None:
        state = tmp_path / ".toolkit-state" / "x" / "backups"
        state.mkdir(parents=True)
        (state / "mod.py").write_text(backup)
    return tmp_path


def _import(site: Path, hide: bool, missing: str = "toolkit") -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(site), "hide" if hide else "show", missing],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_without_toolkit_the_release_file_runs_and_warns_once(tmp_path):
    site = _site(tmp_path, PATCHED)
    seen, stderr = _import(site, hide=True)
    assert seen == {"value": "release", "release": True, "names": []}
    assert stderr.count("serving-toolkit is not importable") == 1, stderr
    assert "toolkit revert vllm" in stderr


def test_with_toolkit_the_patched_file_runs(tmp_path):
    # toolkit.patches.vllm.tito.runtime is real; the module-level uses above call into it, so the
    # patched text for this check binds only names the real runtimes have.
    patched = textwrap.dedent("""\
        from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
        VALUE = 'patched'
    """)
    seen, _ = _import(_site(tmp_path, patched), hide=False)
    assert seen["value"] == "patched" and not seen["release"] and "_toolkit_tito" in seen["names"]


def test_another_missing_module_is_still_an_error(tmp_path):
    patched = "import os\nimport some_engine_dependency\n" + PATCHED
    seen, _ = _import(_site(tmp_path, patched), hide=True, missing="some_engine_dependency")
    assert seen["error"] == "ModuleNotFoundError" and "some_engine_dependency" in seen["message"]


def test_a_lost_backup_is_one_clear_import_error(tmp_path):
    seen, _ = _import(_site(tmp_path, PATCHED, backup=None), hide=True)
    assert seen["error"] == "ImportError"
    assert "not importable here" in seen["message"] and "reinstall vllm" in seen["message"]


def test_a_file_without_runtime_imports_is_left_as_it_is():
    source = "import os\nVALUE = 1  # toolkit:x\n"
    assert guard_runtime_imports(source, "vllm", BACKUP) == source


def test_the_guarded_file_keeps_each_import_line_and_its_marker():
    guarded = guard_runtime_imports(PATCHED, "vllm", BACKUP)
    assert guarded.count("def _toolkit_release(") == 1
    for line in PATCHED.splitlines()[1:3]:
        assert "    " + line in guarded.splitlines()
    compile(guarded, "mod.py", "exec")


# Another distribution's patch (the patch kit): its codemod's RUNTIME is its own package, and the marked
# import line is guarded the same way, forgiving that package's absence (and toolkit's), nothing else.
FOREIGN = textwrap.dedent("""\
    import os
    from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
    from clamp_fix import runtime as _clamp_fix  # toolkit:clamp-fix
    _clamp_fix.register(_toolkit_tito)
    VALUE = 'patched'
""")


def test_another_packages_runtime_import_is_guarded_by_its_package(tmp_path):
    guarded = guard_runtime_imports(FOREIGN, "vllm", BACKUP)
    assert guarded.count("def _toolkit_release(") == 1
    assert f"_toolkit_release(_toolkit_missing, {BACKUP!r}, 'clamp_fix')" in guarded
    assert f"_toolkit_release(_toolkit_missing, {BACKUP!r}, 'toolkit.patches.vllm.tito')" in guarded
    seen, stderr = _import(_site(tmp_path, FOREIGN), hide=True, missing="clamp_fix")
    assert seen == {"value": "release", "release": True, "names": []}
    assert stderr.count("clamp_fix is not importable") == 1, stderr


def test_an_unmarked_import_of_a_runtime_is_not_ours_to_guard():
    source = "import os\nfrom somewhere import runtime as _r\nVALUE = 1\n"
    assert guard_runtime_imports(source, "vllm", BACKUP) == source



# --- issue 49: a `toolkit` of the working directory ---------------------------------------------------
# ``python -m`` puts the working directory first on sys.path (``python -c`` puts "", a script its folder):
# there a `toolkit/` (a checkout of this repository has one, without `patches/`) comes before the installed
# serving-toolkit. The driver runs with -S and the install as a wheel lays it out (one `toolkit/` folder
# with `patches/` inside, appended to sys.path as site-packages is): an editable install's import hook
# finds `toolkit.patches` whatever `toolkit` is, which hides the shadowing the wheel's users meet. The
# patched module imports the real tito runtime; the driver reports which `toolkit` and which runtime the
# process ended up with.
RUNTIME_ONLY = textwrap.dedent("""\
    from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
    VALUE = 'patched'
""")

SHADOW_DRIVER = textwrap.dedent("""\
    import json, os, sys
    first = sys.path[0]
    # after everything, as site-packages: the working directory (or the script's folder) comes first
    sys.path.extend(entry for entry in (os.environ["INSTALLED"], os.environ["SITE"]) if entry)
    if os.environ["MODE"] == "user-first":  # code of the process imports its own toolkit before the engine
        import toolkit
    try:
        import fakeengine.mod as mod
    except ImportError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    else:
        runtime = getattr(mod, "_toolkit_tito", None)
        print(json.dumps({"value": mod.VALUE, "release": getattr(mod, "__toolkit_release__", False),
                          "runtime": getattr(runtime, "__file__", None),
                          "toolkit": getattr(sys.modules.get("toolkit"), "__file__", None),
                          "path_kept": sys.path[0] == first and os.environ["SITE"] in sys.path}))
""")

REPO = Path(__file__).resolve().parents[2]


def _wheel_install(where: Path) -> Path:
    """serving-toolkit laid out as its wheel installs it (``toolkit/`` with ``patches/``, ``verify/`` and
    ``kernels/`` inside; setup.py), made of links to this checkout's files."""
    package = where / "toolkit"
    package.mkdir(parents=True)
    for entry in (REPO / "toolkit").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in ("patches", "verify", "kernels"):
        (package / folder).symlink_to(REPO / folder)
    return where


def _user_toolkit(work: Path, shape: str) -> Path:
    """``work`` with a `toolkit` of its own: a package as in a checkout of this repository, a folder
    without ``__init__.py`` (a namespace package) or a single module."""
    if shape == "module":
        (work / "toolkit.py").write_text("USER = True\n")
        return work / "toolkit.py"
    folder = work / "toolkit"
    folder.mkdir()
    (folder / "cli.py").write_text("USER = True\n")
    if shape == "package":
        (folder / "__init__.py").write_text('"""the user\'s own toolkit"""\nUSER = True\n')
    return folder


def _setup(tmp_path: Path, patched: str = RUNTIME_ONLY, installed: bool = True) -> tuple[Path, Path, Path | None]:
    """(the engine's site, an empty working directory, the wheel-shaped install or None)."""
    work = tmp_path / "work"
    work.mkdir()
    return _site(tmp_path / "site", patched), work, _wheel_install(tmp_path / "installed") if installed else None


def _run_from(work: Path, site: Path, installed: Path | None, launch: str = "-m", mode: str = "", *,
              expect: str = "", site_packages: bool = False) -> tuple[dict, str]:
    """The driver run from ``work`` the way an engine is started: ``-c`` (sys.path[0] is ""), ``-m`` (the
    working directory's full path) or a script of the working directory (its folder); with -S unless
    ``site_packages`` (this venv's, with its editable install of serving-toolkit)."""
    import os

    # PYTHONSAFEPATH would keep the working directory off sys.path: the engine's users do not set it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "TOOLKIT_EXPECT_PATCHES")}
    env.update(SITE=str(site), INSTALLED=str(installed or ""), MODE=mode)
    if expect:
        env["TOOLKIT_EXPECT_PATCHES"] = expect
    flags = [] if site_packages else ["-S"]
    if launch == "-c":
        argv = [sys.executable, *flags, "-c", SHADOW_DRIVER]
    else:
        (work / "drive_engine.py").write_text(SHADOW_DRIVER)
        argv = [sys.executable, *flags, *(["-m", "drive_engine"] if launch == "-m" else [str(work / "drive_engine.py")])]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _installed_runtime() -> str:
    import toolkit.patches.vllm.tito.runtime as runtime

    return runtime.__file__


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ERROR serving-toolkit:")]


@pytest.mark.parametrize("launch", ["-c", "-m", "script"])
@pytest.mark.parametrize("shape", ["package", "namespace", "module"])
def test_a_toolkit_of_the_working_directory_does_not_switch_the_patches_off(tmp_path, launch, shape):
    # (a folder without __init__.py never shadowed a regular package: kept here so that it stays so)
    site, work, installed = _setup(tmp_path)
    shadow = _user_toolkit(work, shape)
    seen, stderr = _run_from(work, site, installed, launch)
    assert seen["value"] == "patched" and not seen["release"], (seen, stderr)
    ours = installed / "toolkit"
    assert seen["runtime"] == str(ours / "patches" / "vllm" / "tito" / "runtime.py"), seen  # the installed one
    assert seen["toolkit"] == str(ours / "__init__.py"), seen
    assert seen["path_kept"], seen  # sys.path is the process's own again
    assert "is not importable" not in stderr and not _errors(stderr), stderr
    if shape != "namespace":
        assert stderr.count("shadows serving-toolkit") == 1 and str(shadow) in stderr, stderr


def test_a_shadowing_toolkit_package_under_an_editable_install_does_not_switch_the_patches_off(tmp_path):
    # the editable install's import hook (this venv's) maps toolkit.patches under any `toolkit`, but not
    # toolkit.patches.vllm.tito under a project's own toolkit/patches/vllm/: the runtime comes back
    # through the import system (the hook), not only from sys.path
    site, work, _ = _setup(tmp_path, installed=False)
    shadow = _user_toolkit(work, "package")
    (shadow / "patches" / "vllm").mkdir(parents=True)
    (shadow / "patches" / "__init__.py").write_text("")
    (shadow / "patches" / "vllm" / "__init__.py").write_text("")
    seen, stderr = _run_from(work, site, None, site_packages=True)
    assert seen["value"] == "patched" and not seen["release"], (seen, stderr)
    assert seen["runtime"] == _installed_runtime() and not seen["toolkit"].startswith(str(work)), seen
    assert stderr.count("shadows serving-toolkit") == 1 and str(shadow) in stderr and not _errors(stderr), stderr


def test_a_user_toolkit_imported_before_the_engine_is_an_error_not_a_quiet_release(tmp_path):
    site, work, installed = _setup(tmp_path)
    shadow = _user_toolkit(work, "package")
    # one `toolkit` per process, and the user's code holds its own: the patches cannot load, and it is said
    seen, stderr = _run_from(work, site, installed, mode="user-first")
    assert seen["value"] == "release" and seen["release"], seen
    assert seen["toolkit"] == str(shadow / "__init__.py"), seen  # the user's toolkit is left as it was
    errors = _errors(stderr)
    assert len(errors) == 1, stderr
    assert str(shadow) in errors[0] and "the patches cannot load" in errors[0] and "rename it" in errors[0]

    seen, _ = _run_from(work, site, installed, mode="user-first", expect="tito")
    assert seen["error"] == "ImportError", seen
    assert "TOOLKIT_EXPECT_PATCHES is set" in seen["message"] and str(shadow) in seen["message"], seen


def test_expect_patches_refuses_to_start_when_toolkit_is_gone(tmp_path):
    site, work, _ = _setup(tmp_path, PATCHED, installed=False)
    seen, stderr = _run_from(work, site, None, "-c", expect="tito")
    assert seen["error"] == "ImportError", seen
    message = seen["message"]
    assert "serving-toolkit is not importable" in message and "TOOLKIT_EXPECT_PATCHES is set" in message, message
    assert "refuses to start" in message and "toolkit revert vllm" in message, message
    assert "\n" not in message and ". " not in message, message  # one sentence
    assert "is not importable, but it patched" not in stderr  # nothing ran as the release


def test_a_stray_folder_without_an_installed_toolkit_still_runs_the_release_quietly(tmp_path):
    site, work, _ = _setup(tmp_path, installed=False)
    _user_toolkit(work, "package")
    seen, stderr = _run_from(work, site, None)
    assert seen["value"] == "release" and seen["release"], seen
    assert stderr.count("serving-toolkit is not importable") == 1 and not _errors(stderr), stderr
    seen, _ = _run_from(work, site, None, expect="tito")
    assert seen["error"] == "ImportError" and "TOOLKIT_EXPECT_PATCHES" in seen["message"], seen


def test_an_installed_toolkit_without_the_runtime_is_an_error(tmp_path):
    # what a serving-toolkit of another version than the one that patched the file gives
    patched = "from toolkit.patches.vllm.no_such_patch import runtime as _toolkit_tito  # toolkit:x\nVALUE = 'patched'\n"
    site, work, installed = _setup(tmp_path, patched)
    seen, stderr = _run_from(work, site, installed)
    assert seen["value"] == "release", seen
    errors = _errors(stderr)
    assert len(errors) == 1 and "toolkit.patches.vllm.no_such_patch" in errors[0], stderr
    assert "pip install serving-toolkit==" in errors[0], errors


# --- issue 57: a runtime of another serving-toolkit version ------------------------------------------
# An older serving-toolkit unpacked in the working directory (a `toolkit/` holding only its patches'
# runtime modules, a namespace package) or installed in place of the one that patched the file: its
# runtime imports fine, and ran quietly before. Now it is refused as a missing one is, naming the folder
# and both versions.
def _stale_toolkit(where: Path, version: str | None) -> Path:
    """A serving-toolkit of another version at ``where/toolkit``: the tito runtime only, and an
    ``__init__.py`` saying ``version`` (None: a namespace folder, as an unpacked sdist's patches)."""
    runtime = where / "toolkit" / "patches" / "vllm" / "tito"
    runtime.mkdir(parents=True)
    (runtime / "runtime.py").write_text("OLD = True\n")
    if version is not None:
        (where / "toolkit" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return where / "toolkit"


def test_an_older_runtime_in_the_working_directory_is_refused_naming_both_versions(tmp_path):
    from toolkit import __version__

    site, work, _ = _setup(tmp_path, installed=False)
    stale = _stale_toolkit(work, None)
    seen, stderr = _run_from(work, site, None)
    assert seen["value"] == "release" and seen["release"], (seen, stderr)
    (error,) = _errors(stderr)
    assert str(stale) in error and "(version unknown)" in error and f"not {__version__}" in error, error
    seen, _ = _run_from(work, site, None, expect="tito")
    assert seen["error"] == "ImportError" and "TOOLKIT_EXPECT_PATCHES is set" in seen["message"], seen
    assert str(stale) in seen["message"] and f"not {__version__}" in seen["message"], seen


def test_an_older_runtime_in_the_working_directory_gives_way_to_the_installed_one(tmp_path):
    site, work, installed = _setup(tmp_path)
    stale = _stale_toolkit(work, "0.0.1")
    seen, stderr = _run_from(work, site, installed)
    assert seen["value"] == "patched" and not seen["release"], (seen, stderr)
    assert seen["runtime"] == str(installed / "toolkit" / "patches" / "vllm" / "tito" / "runtime.py"), seen
    assert stderr.count("shadows serving-toolkit") == 1 and str(stale) in stderr and not _errors(stderr), stderr


def test_an_installed_toolkit_of_another_version_is_refused(tmp_path):
    from toolkit import __version__

    site, work, _ = _setup(tmp_path, installed=False)
    other = _stale_toolkit(tmp_path / "other-install", "0.0.1")
    seen, stderr = _run_from(work, site, other.parent)
    assert seen["value"] == "release" and seen["release"], (seen, stderr)
    (error,) = _errors(stderr)
    assert str(other) in error and f"serving-toolkit 0.0.1, not {__version__}" in error, error
    assert f"pip install serving-toolkit=={__version__}" in error, error
    seen, _ = _run_from(work, site, other.parent, expect="tito")
    assert seen["error"] == "ImportError" and "serving-toolkit 0.0.1" in seen["message"], seen


# --- issue 57: the words of a shadow ----------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["package", "module"])
def test_a_shadow_on_pythonpath_of_an_installed_toolkit_gets_no_pip_advice(tmp_path, shape):
    """A `toolkit` earlier on sys.path (PYTHONPATH) than the installed serving-toolkit of the right version:
    the error names it and says to take it off sys.path, never to `pip install` what is installed; a
    `toolkit.py` is called a file, not a folder."""
    from toolkit import __version__

    site, work, installed = _setup(tmp_path)
    info = installed / f"serving_toolkit-{__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: serving-toolkit\nVersion: {__version__}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shadow = _user_toolkit(elsewhere, shape)
    driver = f"import sys; sys.path.insert(0, {str(elsewhere)!r})\n" + SHADOW_DRIVER  # as PYTHONPATH puts it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TOOLKIT_EXPECT_PATCHES")}
    env.update(SITE=str(site), INSTALLED=str(installed), MODE="")
    proc = subprocess.run([sys.executable, "-S", "-c", driver], capture_output=True, text=True, timeout=60, cwd=work,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    (error,) = _errors(proc.stderr)
    assert str(shadow) in error and "off sys.path (PYTHONPATH)" in error and "pip install" not in error, error
    assert "folder" not in error if shape == "module" else True, error


def test_a_toolkit_py_of_the_working_directory_is_called_a_file(tmp_path):
    site, work, installed = _setup(tmp_path)
    shadow = _user_toolkit(work, "module")
    _, stderr = _run_from(work, site, installed)
    assert f"{shadow}, a file of the working directory, shadows serving-toolkit" in stderr, stderr
