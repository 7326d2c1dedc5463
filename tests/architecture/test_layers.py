"""The layers of this project, checked on its import graph (tests/architecture/import_graph.py).

Top to bottom: the CLI and the package's front door; ``verify``; the patch engine and its API; the
patches; at the bottom the codemod base (what a patch's declaration and codemods build on) and the
kernels. A module may import from its own layer or any layer below, never above; there are no
circles; a patch for one engine never imports another engine's patches, and shared patch code
(``toolkit.patches.common``) imports no engine's patches.
"""

from __future__ import annotations

from tests.architecture.import_graph import cycles, edges, stray_top_level_imports

LAYERS: list[tuple[str, tuple[str, ...]]] = [  # top first; a module's layer is its longest matching prefix
    ("front", ("toolkit", "toolkit.__main__", "toolkit.cli")),
    ("verify", ("toolkit.verify",)),
    # the patch engine whole (engine/, cluster/), the registry and API, and the kit's code beyond the declarations
    ("engine", ("toolkit.api", "toolkit.engine", "toolkit.patch_registry", "toolkit.patch_study", "toolkit.clients",
                "toolkit.cluster", "toolkit.kit", "toolkit.testing", "toolkit.releases", "toolkit.matrix", "toolkit.ray",
                "toolkit.start_check")),
    ("patches", ("toolkit.patches",)),
    # what a patch's declaration and codemods build on, and what runtime code (patches, verify) may import; the
    # kit's package spans two layers by nature: its declarations and codemod base are here, the rest above
    ("base", ("toolkit.codemod", "toolkit.declare", "toolkit.kit._declare", "toolkit.kit._codemod", "toolkit.errors",
              "toolkit.base", "toolkit.kernels")),
]
RANK = {prefix: len(LAYERS) - i for i, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}


def layer_of(module: str) -> tuple[str, int]:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix == "toolkit" and module != "toolkit":
            continue  # the package's front door itself, not everything in it: toolkit.x must be listed
        if prefix in RANK:
            name = next(layer for layer, prefixes in LAYERS if prefix in prefixes)
            return name, RANK[prefix]
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")


def engine_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["toolkit", "patches"] and len(parts) > 2 else None


def test_the_graph_sees_the_known_dependencies():
    graph = edges()
    assert "toolkit.codemod" in graph["toolkit.patches.vllm.tito.codemods"]  # a patch builds on the codemod base
    assert "toolkit.clients.patch_study" in graph["toolkit.verify.checks.sweep_checks"]
    assert "toolkit.verify.grammar" in graph["toolkit.verify.checks.stream_checks"]
    assert "toolkit.engine.patching" in graph["toolkit.verify.run"]  # a lazy import counts too


def test_nothing_imports_the_folders_as_top_level_packages():
    assert stray_top_level_imports() == []


def test_no_import_circles():
    assert cycles(edges()) == []


def test_every_import_goes_down_or_sideways():
    wrong = []
    for module, targets in sorted(edges().items()):
        (layer, rank) = layer_of(module)
        for target, line in targets.items():
            target_layer, target_rank = layer_of(target)
            if target_rank > rank:
                wrong.append(f"{module}:{line} ({layer}) imports {target} ({target_layer}), a layer above it")
    assert wrong == []


def test_verify_knows_no_patch_by_name():
    """The verifier owns its checks (``toolkit.verify.checks``), each naming the patch id it needs; it learns
    which patches an install has from the patch engine (``toolkit.engine.patching.applied_ids``) and imports no
    patch module itself."""
    wrong = [f"{module}:{line} imports {target}" for module, targets in sorted(edges().items())
             if module.startswith("toolkit.verify") for target, line in targets.items()
             if target.startswith("toolkit.patches")]
    assert wrong == []


def test_patches_hold_only_patches_plugins_and_their_shared_code():
    """No verify check, client or checker under patches/: each engine folder holds patch packages (a
    ``patch.py`` declaration) and engine plugins (a ``plugin.py``), ``common`` their shared code."""
    from tests.architecture.import_graph import REPO

    root = REPO / "patches"
    stray = [str(path.relative_to(REPO)) for engine in ("vllm", "sglang") for path in sorted((root / engine).iterdir())
             if path.is_dir() and not path.name.startswith("__")
             and not ((path / "patch.py").exists() or (path / "plugin.py").exists())]
    stray += [str(path.relative_to(REPO)) for path in sorted(root.rglob("*.py"))
              if path.stem in ("check", "client", "grammar")]
    assert stray == []


def test_each_engine_folder_is_a_registered_patch_or_a_registered_plugin():
    """A folder under ``patches/<engine>/`` is either a patch (its ``patch.py`` registered in
    ``toolkit.patches``) or an engine plugin (its ``plugin.py`` registered in the engine's own plugin
    group), never both: SGLang's ``superlinear/`` is the plugin (0.5.11 on) and ``superlinear_backend/``
    the patch ``superlinear-backend`` that writes the same registration into 0.5.9 and 0.5.10."""
    import tomllib

    from tests.architecture.import_graph import REPO

    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    declared = {value.split(":")[0].rsplit(".", 1)[0]: group for group, entries in groups.items()
                for value in entries.values() if value.startswith("toolkit.patches.")}
    kinds = {}
    for engine in ("vllm", "sglang"):
        for path in sorted((REPO / "patches" / engine).iterdir()):
            if path.is_dir() and (path / "__init__.py").exists():
                kinds[f"{engine}/{path.name}"] = declared.get(f"toolkit.patches.{engine}.{path.name}")
    assert kinds == {"vllm/patch_sweep": "toolkit.patches", "vllm/responses_stream": "toolkit.patches",
                     "vllm/superlinear": "vllm.general_plugins", "vllm/tito": "toolkit.patches",
                     "sglang/superlinear": "sglang.srt.plugins", "sglang/superlinear_backend": "toolkit.patches",
                     "sglang/tito": "toolkit.patches", "sglang/token_ids": "toolkit.patches"}


def test_no_package_reaches_back_into_one_above_it():
    """Package by package (patches, verify, the clients): shared patch code and patches never import the
    verifier or a client, so there is no loop between the packages."""
    above = ("toolkit.verify", "toolkit.clients", "toolkit.patch_study", "toolkit.patch_registry")
    wrong = [f"{module}:{line} imports {target}" for module, targets in sorted(edges().items())
             if module.startswith("toolkit.patches.") for target, line in targets.items()
             if target.startswith(above)]
    assert wrong == []


def test_patches_of_one_engine_never_import_another_engines():
    wrong = []
    for module, targets in sorted(edges().items()):
        source_engine = engine_of(module)
        if source_engine is None:
            continue
        for target, line in targets.items():
            target_engine = engine_of(target)
            if target_engine not in (None, "common", source_engine):
                wrong.append(f"{module}:{line} imports {target}")
            if source_engine == "common" and target_engine not in (None, "common"):
                wrong.append(f"{module}:{line} (shared code) imports {target}")
    assert wrong == []


def test_import_toolkit_loads_neither_libcst_nor_torch():
    """Patched engines import this package in every process: the front door stays light."""
    import subprocess
    import sys

    from tests.architecture.import_graph import REPO

    code = "import sys, toolkit; print(sorted(m for m in ('libcst', 'torch', 'rich') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_reading_the_patch_declarations_loads_no_codemod():
    """``toolkit list``, ``status`` and an apply with nothing to do read declarations only: libcst (about
    a third of a second to import) loads when a file is rewritten, not before."""
    import subprocess
    import sys

    from tests.architecture.import_graph import REPO

    code = ("import sys; from toolkit import patch_registry; patches = patch_registry.registry(); "
            "print(len(patches), 'libcst' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    count, libcst_loaded = out.stdout.split()
    assert int(count) >= 6 and libcst_loaded == "False", out.stdout


MAX_MODULE_LINES = 400
# Over the cap while issue 52's patches/ part is under way: the PatchStudy client leaves patches/ there
# (and is split). Listed by name so that it cannot grow, and so that this list must shrink once it is done.
OVER_THE_CAP: dict[str, int] = {}  # none today: a module over the cap is named here with its lines, for a while


def test_no_product_module_is_over_400_lines():
    """A module does one job: past 400 lines it holds several, and is split where they part
    (docs/architecture.md, "Modules along their seams")."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    long = {str(path.relative_to(root)): n for folder in ("toolkit", "patches", "verify", "kernels")
            for path in sorted((root / folder).rglob("*.py"))
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert {path: n for path, n in long.items() if n > OVER_THE_CAP.get(path, 0)} == {}
    assert set(OVER_THE_CAP) <= set(long), "a module listed in OVER_THE_CAP is under the cap now: drop it there"


def _product_sources():
    from tests.architecture.import_graph import REPO

    return REPO, [p for folder in ("toolkit", "patches", "verify", "kernels") for p in sorted((REPO / folder).rglob("*.py"))
                  if "__pycache__" not in p.parts]


def test_no_reexport_hub():
    """Callers import a name from the module that defines it: no module re-exports another's names for its
    callers (a ``noqa: F401`` import, an ``import x as x``), the public faces excepted, whose job that is
    (tests/architecture/test_public_paths.py); a runtime lists the names patched code calls in its ``__all__``."""
    import ast

    repo, sources = _product_sources()
    wrong = []
    for path in sources:
        text = path.read_text()
        where = path.relative_to(repo).as_posix()
        wrong += [f"{where}:{n}" for n, line in enumerate(text.splitlines(), 1) if "noqa: F401" in line]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                wrong += [f"{where}:{node.lineno} imports {a.name} as itself" for a in node.names
                          if a.asname is not None and a.asname == a.name.rpartition(".")[2]]
    assert wrong == []


def test_each_package_is_one_layer():
    """Every module of a package of toolkit/ is in the package's own layer (issue 59: engine/ held the
    patch engine and eight modules of the base below it); the kit's package is the one that spans two,
    by nature, and LAYERS names its two base modules one by one."""
    split = {"toolkit.kit": {"toolkit.kit._declare", "toolkit.kit._codemod"}}
    wrong = []
    for module in sorted(edges()):
        parts = module.split(".")
        if parts[0] != "toolkit" or len(parts) < 3 or parts[1] in ("patches", "verify", "kernels"):
            continue
        package = ".".join(parts[:2])
        if module in split.get(package, ()):
            continue
        if layer_of(module) != layer_of(package):
            wrong.append(f"{module} is {layer_of(module)[0]}, its package {package} {layer_of(package)[0]}")
    assert wrong == []
    assert all(layer_of(module)[0] == "base" for module in split["toolkit.kit"])


FACES_OF_THE_KIT = ("toolkit.declare", "toolkit.codemod", "toolkit.testing", "toolkit.releases", "toolkit.matrix")
OTHER_FACES = ("toolkit.ray", "toolkit.start_check", "toolkit.patch_study")


def test_product_code_imports_owners_not_faces():
    """A face is for users and patch packages: toolkit/ and verify/ import the module that holds the code
    (toolkit.kit._declare, not toolkit.declare), and never the kit's package itself (a circle through its
    lazy names). Patches are kit users and keep the faces (docs/architecture.md, "Where a new patch goes")."""
    faces = set(FACES_OF_THE_KIT + OTHER_FACES + ("toolkit.kit",))
    wrong = [f"{module}:{line} imports {target}" for module, targets in sorted(edges().items())
             if not module.startswith(("toolkit.patches", "toolkit.kernels")) and module not in faces
             for target, line in targets.items() if target in faces]
    assert wrong == []
