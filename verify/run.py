"""One verify run: find out what the target engine has, launch it (or use --url), run the checks,
always stop what was launched, and return a report a machine can gate on."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence, cast

from toolkit.base.engines import titles
from toolkit.errors import UsageError
from toolkit.base.extras import require

require("verify", ("httpx", "psutil"), "toolkit verify")
import httpx  # noqa: E402

from toolkit.verify.checks.check_types import ERROR, FAIL, PASS, SKIP, CheckResult, Target  # noqa: E402
from toolkit.verify.checks.suite import missing_patches, run_checks, select_checks, skips_before_serving  # noqa: E402
from toolkit.verify.family_flags import family_args, family_of, parsers_in  # noqa: E402


# The `tools` check needs a tool-call parser: a model of a known family gets its usual ones (family_flags);
# for any other, Hermes-style <tool_call> markup is the common default. Pass your model's own with
# --server-arg=--tool-call-parser=NAME.
DEFAULT_TOOL_ARGS = {
    "vllm": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    "sglang": ["--tool-call-parser", "hermes"],
}

@dataclass
class VerifyReport:
    engine: str
    engine_version: str
    model: str
    base_url: str
    applied_patches: list[str]
    results: list[CheckResult] = field(default_factory=list)
    launched: bool = False
    seconds: float = 0.0
    startup_seconds: float = 0.0
    error: str = ""
    log_tail: str = ""
    apply_first: list[str] = field(default_factory=list)
    family: str = ""  # the model family read from its config and chat template ('' when none is known)
    family_args: list[str] = field(default_factory=list)  # the server flags added for that family
    server_pids: list[int] = field(default_factory=list)  # every process of the launched server
    server_temp_dir: str = ""

    @property
    def ran(self) -> list[CheckResult]:
        return [r for r in self.results if r.status != SKIP]

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.ran) and all(r.status == PASS for r in self.ran)

    @property
    def verdict(self) -> str:
        if self.error:
            return "error"
        if not self.ran:
            return "nothing verified"
        return "pass" if self.ok else "fail"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ok=self.ok, verdict=self.verdict)
        return data


def served_model_name(base_url: str, timeout: float = 10.0) -> str:
    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=timeout)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def load_tokenizer(model: str) -> Any:
    # jinja2: transformers renders chat templates with it, yet does not require it
    require("verify", ("transformers", "jinja2"), "toolkit verify")
    from transformers import AutoTokenizer

    if not Path(model).expanduser().exists() and (model.startswith((".", "/", "~")) or model.count("/") > 1):
        # a path that is not there (a hub id is "org/name"): say so before transformers reads it as an id
        raise UsageError(f"model {model!r} not found: pass a model folder or a Hugging Face model id")
    try:
        return AutoTokenizer.from_pretrained(model)
    except OSError as exc:  # not found on the hub, offline, no tokenizer files: transformers says which
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot load the tokenizer of {model!r}: {first}") from None
    except ValueError as exc:  # huggingface_hub's HFValidationError: a string that is no repo id
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"model {model!r} is neither a folder nor a Hugging Face model id ({first})") from None


def engine_install(engine: str | None, python: str | None):
    from toolkit.engine.discovery import find_engines

    installed = [e for e in find_engines(python) if engine in (None, e.engine)]
    return installed[0] if installed else None


def verify(
    model: str,
    *,
    engine: str | None = None,
    python: str | None = None,
    server_args: Sequence[str] = (),
    url: str | None = None,
    checks: Sequence[str] | None = None,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> VerifyReport:
    """Verify a served engine. Launches one unless ``url`` is given; never leaves a process behind."""
    from toolkit.engine import patching as patch_engine
    from toolkit.engine.discovery import interpreter

    started = time.monotonic()
    chosen = select_checks(checks)  # the names resolved once: Check objects from here on
    say = on_phase or (lambda message: None)
    python = interpreter(python)  # relative, or a venv's folder: the absolute bin/python the server runs
    installed = engine_install(engine, python)
    if installed is None and url is None:
        raise UsageError(f"{engine or titles()} is not installed for {python or 'this interpreter'}")
    engine_name = engine or (installed.engine if installed else "vllm")
    applied = set(patch_engine.applied_ids(installed)) if installed else set()
    report = VerifyReport(engine_name, installed.version if installed else "unknown", model, url or "",
                          sorted(applied))
    # patch_skip and missing_patches read only these two attributes of a Target: an install will do
    install = cast(Target, SimpleNamespace(engine=engine_name, applied_patches=applied))
    say("loading the model's tokenizer")
    tokenizer = load_tokenizer(model)
    if url is None:
        # Nothing to check without the patches the checks need (unpatched SGLang): say so at once instead of
        # starting a server (minutes for a large model) that no check would ask anything. After the tokenizer:
        # a model that cannot be read is still said first, as when a server is started.
        skips = skips_before_serving(install, None, chosen)
        if skips is not None:
            report.apply_first = missing_patches(install)
            report.results = skips
            for result in skips:
                if on_result:
                    on_result(result)
            say("no check can run on this install: nothing launched")
            report.seconds = time.monotonic() - started
            return report

    def run_against(base_url: str, parsers: tuple[str, ...] | None) -> None:
        report.base_url = base_url
        target = Target(base_url, served_model_name(base_url), engine_name, tokenizer, applied, parsers)
        report.apply_first = missing_patches(target)
        try:
            report.results = run_checks(target, None, on_result, chosen)
        finally:
            target.client.close()

    family = family_of(model, getattr(tokenizer, "chat_template", None))
    report.family = family.name if family else ""
    if url is not None:
        run_against(url, None)  # the server's parsers are unknown: the accounting allows any known parser's
    else:
        from toolkit.verify.server import EngineServer, ServerStartError

        say(f"starting {installed.distribution} {installed.version} with {model}")
        # CPU defaults (dtype, context and KV sizes for a small machine) only where there is no GPU.
        cpu = not Path("/dev/nvidia0").exists()
        server_args = list(server_args)
        report.family_args = family_args(family, engine_name, server_args)  # the user's own parsers win
        server_args += report.family_args
        if "--tool-call-parser" not in " ".join(server_args):
            server_args += DEFAULT_TOOL_ARGS[engine_name]
        env = dict(env or {})
        # A check that needs a switch on (patch-sweep's routes) declares it (Check.env), and it is set when
        # the check will run (its patch applied); the caller's own setting of the switch wins.
        for check in chosen:
            for name, value in check.env if check.missing_patch(install) is None else ():
                if name not in env and name not in os.environ:
                    env[name] = value
        # The interpreter the user named (a venv's bin/python), not the one it resolves to.
        server = EngineServer(engine_name, python or installed.python, model, server_args=server_args, env=env,
                              timeout=timeout, cpu=cpu)
        report.launched = True
        try:
            with server:
                report.startup_seconds = time.monotonic() - started
                say(f"server healthy at {server.base_url} after {report.startup_seconds:.0f}s; running checks")
                try:
                    run_against(server.base_url, parsers_in(server_args))
                finally:
                    if any(r.status in (FAIL, ERROR) for r in report.results):
                        report.log_tail = server.log_tail(40)
        except ServerStartError as exc:
            report.error = str(exc).split("\n")[0]
            report.log_tail = exc.log_tail
        finally:
            report.server_pids = sorted(server.seen_pids)
            report.server_temp_dir = str(server.tmp_dir or "")
    report.seconds = time.monotonic() - started
    return report


__all__ = ["verify", "VerifyReport", "PASS", "FAIL", "SKIP", "ERROR"]
