"""The runtime-import guard (toolkit/guard.py) on small modules, in a fresh interpreter each: with
``toolkit`` importable the patched module runs; without it the release's file (the backup) runs in
its place, whatever the patched code does with the runtime at module level; other import errors stay
errors; a lost backup is one clear ImportError. The real engines: tests/packaging/test_runtime_gone.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from toolkit.guard import guard_runtime_imports

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
    package.mkdir()
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
    assert f"_toolkit_release(_toolkit_missing, {BACKUP!r})" in guarded  # our own: the bytes as before
    seen, stderr = _import(_site(tmp_path, FOREIGN), hide=True, missing="clamp_fix")
    assert seen == {"value": "release", "release": True, "names": []}
    assert stderr.count("clamp_fix is not importable") == 1, stderr


def test_an_unmarked_import_of_a_runtime_is_not_ours_to_guard():
    source = "import os\nfrom somewhere import runtime as _r\nVALUE = 1\n"
    assert guard_runtime_imports(source, "vllm", BACKUP) == source
