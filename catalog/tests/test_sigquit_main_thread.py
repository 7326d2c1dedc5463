"""The edit on a snippet in SGLang 0.5.9's shape (the real file is the conformance test's). Runs
without SGLang: toolkit.testing.assert_codemod transforms the snippet."""

from __future__ import annotations

import pytest

from toolkit_catalog.sglang.sigquit_main_thread.codemods import EngineTransformer
from toolkit.releases import releases_of
from toolkit.testing import assert_codemod
from toolkit_catalog.sglang.sigquit_main_thread.patch import PATCH

RELPATH = "srt/entrypoints/engine.py"
PATCH_ID = "sigquit-main-thread"

BEFORE = '''
import os
import signal
import threading

logger = logging.getLogger(__name__)


def _set_envs_and_config(server_args: ServerArgs):
    # Set ulimit
    set_ulimit()

    if server_args.custom_sigquit_handler is None:
        # Register the signal handler.
        def launch_phase_sigquit_handler(signum, frame):
            kill_process_tree(os.getpid())

        signal.signal(signal.SIGQUIT, launch_phase_sigquit_handler)
    else:
        signal.signal(signal.SIGQUIT, server_args.custom_sigquit_handler)

    # Set mp start method
    mp.set_start_method("spawn", force=True)


class Engine:
    def shutdown(self):
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
'''

AFTER = '''
import os
import signal
import threading

logger = logging.getLogger(__name__)


def _set_envs_and_config(server_args: ServerArgs):
    # Set ulimit
    set_ulimit()

    if threading.current_thread() is threading.main_thread():  # toolkit:sigquit-main-thread
        if server_args.custom_sigquit_handler is None:
            # Register the signal handler.
            def launch_phase_sigquit_handler(signum, frame):
                kill_process_tree(os.getpid())

            signal.signal(signal.SIGQUIT, launch_phase_sigquit_handler)
        else:
            signal.signal(signal.SIGQUIT, server_args.custom_sigquit_handler)
    else:
        logger.warning(
            "SIGQUIT handler not registered: the engine is not launched from the main thread, so a "
            "failing child process will not take down the process tree"
        )

    # Set mp start method
    mp.set_start_method("spawn", force=True)


class Engine:
    def shutdown(self):
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
'''


def test_the_statement_that_registers_the_handler_runs_on_the_main_thread_only():
    # the class's own signal.signal is not in the function: untouched
    assert_codemod(EngineTransformer, BEFORE, AFTER, engine="sglang", engine_version="0.5.9", relpath=RELPATH,
                   patch_id=PATCH_ID)


def test_two_statements_that_register_handlers_are_an_ambiguous_anchor():
    before = BEFORE.replace("    # Set mp start method\n",
                            "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n    # Set mp start method\n")
    with pytest.raises(AssertionError, match="sigquit"):
        assert_codemod(EngineTransformer, before, before, engine="sglang", relpath=RELPATH, patch_id=PATCH_ID)


def test_a_module_without_import_threading_fails_on_its_anchor():
    before = BEFORE.replace("import threading\n", "")
    with pytest.raises(AssertionError, match="import-threading"):
        assert_codemod(EngineTransformer, before, before, engine="sglang", relpath=RELPATH, patch_id=PATCH_ID)


def test_the_fixed_shape_of_sglang_0_5_10_is_not_guarded_twice():
    """0.5.10 registers the handler under its own main-thread check: the codemod finds no unguarded
    statement (the anchor fails) instead of nesting a second guard; `not_needed` says why."""
    fixed = AFTER.replace("  # toolkit:sigquit-main-thread", "")
    with pytest.raises(AssertionError, match="sigquit .*not found"):
        assert_codemod(EngineTransformer, fixed, fixed, engine="sglang", engine_version="0.5.10", relpath=RELPATH,
                       patch_id=PATCH_ID)


def test_it_declares_sglang_0_5_9_and_is_not_needed_from_0_5_10():
    assert releases_of(PATCH.engine, PATCH.versions) == [("sglang", "0.5.9")]
    assert PATCH.not_needed_on("0.5.9") == ""
    assert all(PATCH.not_needed_on(version) for _, version in releases_of("sglang", ">=0.5.10"))



def test_upstream_fix_in_0_5_10_is_why_it_is_not_needed_there():
    """The release that carries the guard itself (the real file has the main-thread check): the patch
    stops at 0.5.9, and its codemod finds nothing to guard there."""
    from toolkit import releases

    from toolkit.testing import anchor_problems

    tree = releases.release_tree("sglang", "0.5.10", ["srt/entrypoints/engine.py"])
    assert b"threading.current_thread() is threading.main_thread()" in tree.read("srt/entrypoints/engine.py")
    # and the codemod recognises the fixed shape: no unguarded statement, so nothing would be written
    _, _, problems = anchor_problems(tree, PATCH)
    assert problems == ["srt/entrypoints/engine.py: sigquit (not found)"]
