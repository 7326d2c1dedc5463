"""Each thing once (issue 52): a command reads the registry once and resolves the patch ids it was given
once, at its edge (``patch_registry.select``); nothing below it reads the registry again or looks an id
up (``Catalog.select``). Counted on the real command line, run in-process on the demo engine tree."""

from __future__ import annotations

import json
import sys

import pytest

from toolkit import cli, patch_registry

from tests.toolkit import demo_patches


@pytest.fixture
def counted(monkeypatch):
    """Counters of registry reads, selections (id resolutions at the edge) and catalog look-ups below it."""
    counts = {"reads": 0, "selects": 0, "lookups": 0}

    def read():
        counts["reads"] += 1
        return [demo_patches.DEMO, demo_patches.SECOND]

    real_select, real_lookup = patch_registry.select, patch_registry.Catalog.select

    def select(*args, **kwargs):
        counts["selects"] += 1
        return real_select(*args, **kwargs)

    def lookup(self, *args, **kwargs):
        counts["lookups"] += 1
        return real_lookup(self, *args, **kwargs)

    monkeypatch.setattr(patch_registry, "registry", read)
    monkeypatch.setattr(patch_registry.Catalog, "select", lookup)
    # every module that imported `select` by name (toolkit.api, toolkit.cli) gets the counting one
    for module in list(sys.modules.values()):
        if module is not None and getattr(module, "__name__", "").startswith("toolkit") \
                and getattr(module, "select", None) is real_select:
            monkeypatch.setattr(module, "select", select)
    return counts


def run(counts, capsys, *argv):
    for key in counts:
        counts[key] = 0
    code = cli.main([*argv, "--json"])
    answer = json.loads(capsys.readouterr().out)
    return code, answer, dict(counts)


def test_every_command_reads_the_registry_once_and_resolves_ids_once(counted, site, capsys):
    once = {"reads": 1, "selects": 1, "lookups": 0}
    steps = [
        ("list",),
        ("apply-patch", "sglang", "--patch", "demo", "--dry-run", "--diff"),  # the diff of what it would do
        ("apply-patch", "sglang", "--patch", "demo"),
        ("status",),
        ("status", "sglang"),
        ("apply-patch",),
        ("revert", "sglang", "--patch", "second"),
        ("revert",),
        ("check", "--source", str(site), "--patch", "demo"),
        ("check", "--source", str(site)),
    ]
    for argv in steps:
        code, answer, counts = run(counted, capsys, *argv)
        assert (code, answer["ok"]) == (0, True), (argv, answer)
        assert counts == once, argv


def test_a_usage_error_reads_the_registry_at_most_once(counted, site, capsys):
    code, answer, counts = run(counted, capsys, "apply-patch", "sglang", "--patch", "nope")
    assert code == 2 and "unknown patch: nope" in answer["error"]
    assert counts == {"reads": 1, "selects": 1, "lookups": 0}


def test_verify_reads_no_registry(counted, tmp_path, capsys):
    """verify's selection is of checks, not patches: the verifier owns its checks and learns which patches
    are applied from the install's manifest (toolkit.engine.applied_ids), so it reads no registry and
    resolves no id (here it stops at an unknown check name, before any model or server)."""
    code, answer, counts = run(counted, capsys, "verify", "--model", str(tmp_path / "no-model"), "--checks", "nope")
    assert code == 2 and "unknown check(s): nope" in answer["error"]
    assert counts == {"reads": 0, "selects": 0, "lookups": 0}


def test_the_counters_count(counted, site, capsys):
    """The counters see a second read and a look-up below the edge, were there one (they can fail)."""
    patch_registry.registry()
    patch_registry.catalog("sglang").select(["demo"])
    assert counted == {"reads": 2, "selects": 0, "lookups": 1}


def test_below_the_edge_only_the_ids_a_manifest_records_meet_a_patch(counted, site, capsys, monkeypatch):
    """The plan works on Patch objects: the one id -> Patch match below the edge is of the ids the manifest
    records (``Catalog.recorded``), once a run; none on a first apply, each recorded id on a revert."""
    matched: list[list[str]] = []
    real = patch_registry.Catalog.recorded

    def recorded(self, patch_ids):
        matched.append(sorted(patch_ids))
        return real(self, patch_ids)

    monkeypatch.setattr(patch_registry.Catalog, "recorded", recorded)
    assert run(counted, capsys, "apply-patch", "sglang", "--patch", "demo")[0] == 0
    assert matched == [[]]
    matched.clear()
    assert run(counted, capsys, "apply-patch", "sglang", "--patch", "second")[0] == 0
    assert matched == [["demo"]]
    matched.clear()
    assert run(counted, capsys, "revert", "sglang", "--patch", "demo")[0] == 0
    assert matched == [["demo", "second"]]
