"""tests/harness/forks.py: a driver run as a fork of a preloaded interpreter gives what a subprocess
gives (exit code, logs, result, environment), and reads the engine's files fresh at every run."""

from __future__ import annotations

import os
import sys
import textwrap

from tests.harness.forks import ForkServer

DRIVER = textwrap.dedent('''\
    import json, os, sys
    sys.path.insert(0, os.environ["ENGINE_DIR"])
    import sglang.serving as serving  # "the engine": never preloaded, read from the disk at each run
    import json.decoder  # a library: preloaded once listed
    from tests_channel import write_result
    mode = sys.argv[1]
    print("log line")
    print("to stderr", file=sys.stderr)
    if mode == "fail":
        raise RuntimeError("driver failed")
    if mode == "exit":
        sys.exit(3)
    write_result({"answer": serving.ANSWER, "env": os.environ.get("FORK_TEST"), "argv": sys.argv[1:],
                  "preloaded_json": "json.decoder" in sys.modules})
''')


def _setup(tmp_path):
    engine = tmp_path / "engine"
    (engine / "sglang").mkdir(parents=True)
    (engine / "sglang" / "__init__.py").write_text("")
    (engine / "sglang" / "serving.py").write_text("ANSWER = 1\n")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    channel = tmp_path / "tests_channel.py"
    from tests.harness import channel as real

    channel.write_text(open(real.__file__).read())
    env = {**os.environ, "ENGINE_DIR": str(engine), "FORK_TEST": "yes", "PYTHONDONTWRITEBYTECODE": "1"}
    return engine, driver, env


def test_runs_like_a_subprocess_and_sees_each_edit(tmp_path):
    engine, driver, env = _setup(tmp_path)
    cache = tmp_path / "cache"
    with ForkServer(sys.executable, env=env, key="demo", cache_dir=cache) as forks:
        first = forks.run([driver, "ok"])
        assert first.returncode == 0 and first.result["answer"] == 1, first.stderr
        assert first.result["env"] == "yes" and first.result["argv"] == ["ok"]
        assert "log line" in first.stdout and "to stderr" in first.stderr
        listed = (cache / "driver-preload" / "demo.txt").read_text().split()
        assert "json.decoder" in listed and not any(n.split(".")[0] in ("sglang", "tests") for n in listed)
        (engine / "sglang" / "serving.py").write_text("ANSWER = 2  # patched\n")
        second = forks.run([driver, "ok"])
        assert second.result["answer"] == 2  # the edit is seen: the engine was not preloaded
        failed = forks.run([driver, "fail"])
        assert failed.returncode == 1 and failed.result is None and "RuntimeError: driver failed" in failed.stderr
        exited = forks.run([driver, "exit"])
        assert exited.returncode == 3 and exited.result is None
        after = forks.run([driver, "ok"])  # the server outlives its children's failures
        assert after.returncode == 0 and after.result["answer"] == 2
    with ForkServer(sys.executable, env=env, key="demo", cache_dir=cache) as forks:  # a list kept: preloaded
        assert forks.preloaded
        assert forks.run([driver, "ok"]).result["answer"] == 2


def test_a_run_unsets_and_sets_variables_of_its_own(tmp_path):
    """``run(env=, unset=)``: the fork's environment is the server's without ``unset``, with ``env``; the
    next run starts from the server's again."""
    engine, driver, env = _setup(tmp_path)
    with ForkServer(sys.executable, env=env, key="demo", cache_dir=tmp_path / "cache") as forks:
        assert forks.run([driver, "ok"], unset=["FORK_TEST"]).result["env"] is None
        assert forks.run([driver, "ok"], unset=["FORK_TEST"], env={"FORK_TEST": "own"}).result["env"] == "own"
        assert forks.run([driver, "ok"]).result["env"] == "yes"


def test_a_stale_module_list_costs_nothing_but_a_skip(tmp_path):
    engine, driver, env = _setup(tmp_path)
    cache = tmp_path / "cache"
    (cache / "driver-preload").mkdir(parents=True)
    (cache / "driver-preload" / "demo.txt").write_text("no_such_module_anywhere\nsglang.serving\njson.decoder\n")
    with ForkServer(sys.executable, env=env, key="demo", cache_dir=cache) as forks:
        (engine / "sglang" / "serving.py").write_text("ANSWER = 7\n")
        run = forks.run([driver, "ok"])
        assert run.returncode == 0 and run.result["answer"] == 7 and run.result["preloaded_json"]


def test_a_killed_server_is_one_clear_failure(tmp_path):
    import pytest

    _, driver, env = _setup(tmp_path)
    forks = ForkServer(sys.executable, env=env, key="demo", cache_dir=tmp_path / "cache")
    forks.start()
    forks.process.kill()
    with pytest.raises(AssertionError, match="fork server died"):
        forks.run([driver, "ok"])
    forks.close()



def test_a_run_imports_from_its_own_pythonpath_in_place_of_the_servers(tmp_path):
    """``run(pythonpath=)`` (one server for several engine copies over the same libraries,
    tests/patches/sglang/group_runs.py): the fork imports the engine from that path, not from the server's
    own PYTHONPATH, which leaves its ``sys.path``, and its subprocesses get that PYTHONPATH."""
    _, _, env = _setup(tmp_path)
    copies = {}
    for name, answer in (("first", 1), ("second", 2)):
        copies[name] = tmp_path / name
        (copies[name] / "sglang").mkdir(parents=True)
        (copies[name] / "sglang" / "__init__.py").write_text("")
        (copies[name] / "sglang" / "serving.py").write_text(f"ANSWER = {answer}\n")
    driver = tmp_path / "path_driver.py"
    driver.write_text(textwrap.dedent('''\
        import os, subprocess, sys
        import sglang.serving as serving
        from tests_channel import write_result
        child = subprocess.run([sys.executable, "-c", "import sglang.serving as s; print(s.ANSWER)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        write_result({"answer": serving.ANSWER, "child": int(child), "pythonpath": os.environ["PYTHONPATH"],
                      "first_on_path": str(os.environ["FIRST"]) in sys.path})
    '''))
    env = {**env, "PYTHONPATH": str(copies["first"]), "FIRST": str(copies["first"])}
    with ForkServer(sys.executable, env=env, key="demo", cache_dir=tmp_path / "cache") as forks:
        own = forks.run([driver]).result
        assert (own["answer"], own["child"], own["first_on_path"]) == (1, 1, True)
        other = forks.run([driver], pythonpath=str(copies["second"])).result
        assert (other["answer"], other["child"], other["first_on_path"]) == (2, 2, False)
        assert other["pythonpath"] == str(copies["second"])
        assert forks.run([driver]).result["answer"] == 1  # the next run starts from the server's path again
