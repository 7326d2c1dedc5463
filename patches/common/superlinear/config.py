"""Superlinear-attention backend configuration: environment and engine config, validated at start-up.

Turned on by ``TOOLKIT_ATTENTION_BACKEND=superlinear`` (unset, empty or ``dense``: the engine is
stock). Parameters, each optional (defaults: the kernels' ``SuperlinearParams``):

=================================  =======================  ========================================
environment                         config key               meaning
=================================  =======================  ========================================
TOOLKIT_SUPERLINEAR_SW_INDEX        ``sw_index``             window ``W = F(sw_index + 1) - 1`` (0: none)
TOOLKIT_SUPERLINEAR_TOPK            ``topk``                 spans per query (1..16)
TOOLKIT_SUPERLINEAR_BACKWARD_FACTOR ``backward_factor``      span extent behind its anchor ``ceil(bf t^sp)``
TOOLKIT_SUPERLINEAR_FORWARD_FACTOR  ``forward_factor``       span extent after its anchor ``ceil(ff t^sp)``
TOOLKIT_SUPERLINEAR_SPAN_POWER      ``span_power``           ``sp`` in (0, 1)
TOOLKIT_SUPERLINEAR_SEARCH_POWER    ``search_power``         ``p`` in (0, 1) (stripes ``F(i) = i^(1/p)``)
TOOLKIT_SUPERLINEAR_INV_SEARCH_POWER ``inv_search_power_int`` n in 2..6, ``p = 1/n`` (not with the above)
TOOLKIT_SUPERLINEAR_IMPL            ``impl``                 ``auto`` (Triton on CUDA, else gather), ``gather``, ``triton``, ``naive``
TOOLKIT_SUPERLINEAR_CONFIG          (all of them)            one JSON object with the keys above
=================================  =======================  ========================================

Precedence, lowest first: defaults, ``TOOLKIT_SUPERLINEAR_CONFIG``, the single variables, the engine's
own config (vLLM: ``--additional-config '{"superlinear": {...}}'``). Any bad name or value raises
:class:`SuperlinearConfigError` with one sentence saying what to change.

Imports the kernels' parameter class (torch) only: no engine, no libcst.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from toolkit.kernels.superlinear.attention_spans import SuperlinearParams
from toolkit.patches.common.superlinear.switch import SuperlinearConfigError

CONFIG_ENV = "TOOLKIT_SUPERLINEAR_CONFIG"
ENV_PREFIX = "TOOLKIT_SUPERLINEAR_"
IMPLS = ("auto", "gather", "triton", "naive")

# config key -> (environment variable, parser)
_KEYS: dict[str, tuple[str, type]] = {
    "sw_index": ("TOOLKIT_SUPERLINEAR_SW_INDEX", int),
    "topk": ("TOOLKIT_SUPERLINEAR_TOPK", int),
    "backward_factor": ("TOOLKIT_SUPERLINEAR_BACKWARD_FACTOR", float),
    "forward_factor": ("TOOLKIT_SUPERLINEAR_FORWARD_FACTOR", float),
    "span_power": ("TOOLKIT_SUPERLINEAR_SPAN_POWER", float),
    "search_power": ("TOOLKIT_SUPERLINEAR_SEARCH_POWER", float),
    "inv_search_power_int": ("TOOLKIT_SUPERLINEAR_INV_SEARCH_POWER", int),
    "impl": ("TOOLKIT_SUPERLINEAR_IMPL", str),
}


@dataclass(frozen=True)
class SuperlinearConfig(SuperlinearParams):
    """The kernels' parameters (validated on construction) plus the implementation to run."""

    impl: str = "auto"

    def kernel_kwargs(self) -> dict:
        """Keyword arguments of ``toolkit.kernels.superlinear.dispatch`` (all but ``impl``)."""
        out = asdict(self)
        out.pop("impl")
        return out

    def params(self) -> SuperlinearParams:
        return SuperlinearParams(**self.kernel_kwargs())

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self).items() if v is not None)


def _parse(key: str, raw, source: str):
    kind = _KEYS[key][1]
    if raw is None and key in ("search_power", "inv_search_power_int"):
        return None
    if kind is str:
        if not isinstance(raw, str):
            raise SuperlinearConfigError(f"{source}: {key} must be a string, got {raw!r}")
        return raw.strip().lower()
    if isinstance(raw, bool):
        raise SuperlinearConfigError(f"{source}: {key} must be a number, got {raw!r}")
    try:
        if kind is int:
            if isinstance(raw, float):
                if not raw.is_integer():
                    raise ValueError
                raw = int(raw)
            return int(str(raw).strip(), 10) if isinstance(raw, str) else int(raw)
        return float(raw)
    except (TypeError, ValueError):
        want = "an integer" if kind is int else "a number"
        raise SuperlinearConfigError(f"{source}: {key} must be {want}, got {raw!r}") from None


def _from_mapping(data, source: str) -> dict:
    if not isinstance(data, Mapping):
        raise SuperlinearConfigError(f"{source} must be a JSON object of superlinear settings, got {data!r}")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise SuperlinearConfigError(
            f"{source}: unknown setting(s) {', '.join(map(repr, unknown))}; known: {', '.join(_KEYS)}")
    return {key: _parse(key, value, source) for key, value in data.items()}


def load_config(environ: Mapping[str, str] | None = None, engine_config: Mapping | None = None,
                engine_source: str = "engine config") -> SuperlinearConfig:
    """The configuration from the environment and the engine's config, validated (raises on error)."""
    environ = os.environ if environ is None else environ
    values: dict = {}
    raw_json = environ.get(CONFIG_ENV, "").strip()
    if raw_json:
        try:
            data = json.loads(raw_json)
        except ValueError as exc:
            raise SuperlinearConfigError(f"{CONFIG_ENV} is not valid JSON ({exc})") from None
        values.update(_from_mapping(data, CONFIG_ENV))
    known_env = {env for env, _ in _KEYS.values()} | {CONFIG_ENV}
    stray = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known_env)
    if stray:
        raise SuperlinearConfigError(
            f"unknown environment variable(s) {', '.join(stray)}; known: {', '.join(sorted(known_env))}")
    for key, (env, _) in _KEYS.items():
        if environ.get(env, "").strip():
            values[key] = _parse(key, environ[env], env)
    if engine_config:
        values.update(_from_mapping(engine_config, engine_source))
    if values.get("impl", "auto") not in IMPLS:
        raise SuperlinearConfigError(f"impl must be one of {', '.join(IMPLS)}, got {values['impl']!r}")
    try:
        return SuperlinearConfig(**values)
    except ValueError as exc:
        raise SuperlinearConfigError(f"superlinear attention: {exc}") from None


def covering_length(config: SuperlinearConfig, limit: int = 1 << 16) -> int:
    """Largest token count ``n`` such that every query at a position ``< n`` attends all its keys.

    A query covers when each candidate span, joined with the window, is the whole prefix ``[0, q]``
    (then any top-k choice and any gate give plain causal attention). Up to ``n`` tokens the backend
    equals dense attention up to float rounding. Returns ``limit`` if nothing fails below it.
    """
    from toolkit.kernels.superlinear.attention_spans import ceil_scaled_power, stripe_distance

    params = config.params()
    root, window = params.stripe_root, params.window
    bf, ff, sp = params.backward_factor, params.forward_factor, params.span_power
    for q in range(limit):
        t = q + 1
        last = q - window  # the last key before the window; spans end at most here
        if last < 0:
            continue  # the window alone holds every key
        back, fwd = ceil_scaled_power(bf, t, sp), ceil_scaled_power(ff, t, sp)
        i = params.sw_index + 1
        while True:
            anchor = q + 1 - stripe_distance(i, root)
            if anchor < 0:
                break
            if anchor - back > 0 or min(anchor + fwd, last) < last:
                return q
            i += 1
    return limit
