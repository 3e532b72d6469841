"""The checks of the values a user gives (the configs' fields, the command line's arguments, the bench's method
variants): each returns the value or raises a one-line ValueError naming the parameter and what it allows.

Free of torch (it imports only ssd.names), so the command line runs the same checks as the configs before the kit
loads: every argument error answers at once.
"""
from __future__ import annotations

from .names import (AUTO, BACKUPS, DRAFT_ONLY_PRECISIONS, ENGINE_AR, METHOD_NAMES, PAIR_NAMES, PRECISION_CHOICES,
                    PRECISIONS, STRATEGIES)


def is_auto(value) -> bool:
    return isinstance(value, str) and value == AUTO


def check_choice(value, name: str, allowed) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value


def check_strategy(strategy: str) -> str:
    return check_choice(strategy, "fan_out_strategy", STRATEGIES)


def check_backup(backup: str) -> str:
    return check_choice(backup, "backup", BACKUPS)


def check_method(name: str) -> str:
    return check_choice(name, "method", METHOD_NAMES)


def check_precision_name(value, parameter: str = "dtype", allow_auto: bool = True) -> str:
    return check_choice(value, parameter, PRECISION_CHOICES if allow_auto else PRECISIONS)


def check_target_precision(value: str, parameter: str = "target_dtype") -> str:
    """A target's precision (a name check_precision_name accepts): a draft's only one fails, saying why."""
    if value in DRAFT_ONLY_PRECISIONS:
        allowed = ", ".join(p for p in PRECISION_CHOICES if p not in DRAFT_ONLY_PRECISIONS)
        raise ValueError(f"{parameter}={value} is a draft's precision only: it rounds a verify pass's tokens on one "
                         f"scale they share, so no method could reproduce the target's own AR; use {allowed}")
    return value


def check_at_least(value, name: str, least: int = 1) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def check_k(k):
    if not (is_auto(k) or (isinstance(k, int) and k >= 1)):
        raise ValueError(f"k (the draft length K) must be an integer >= 1 or 'auto', got {k!r}")
    return k


def check_unit(value, name: str) -> float:
    """A rate or probability: a number in [0, 1]."""
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def check_temperature(temperature: float) -> float:
    if not (isinstance(temperature, (int, float)) and temperature >= 0 and temperature == temperature):
        raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {temperature!r}")
    return float(temperature)


def check_budget(budget: int) -> int:
    if not (isinstance(budget, int) and budget >= 0):
        raise ValueError(f"budget (B, the number of cached outcomes) must be an integer >= 0, got {budget!r}")
    return budget


def check_budget_or_auto(budget):
    """A config's or a variant's B: 'auto' (chosen with K, ssd.core.tuning) or an integer >= 0."""
    return budget if is_auto(budget) else check_budget(budget)


def check_saguaro_c(c: float) -> float:
    if not (isinstance(c, (int, float)) and 0.0 <= c <= 1.0):
        raise ValueError(f"saguaro_c (C) must lie in [0, 1] (1 = plain sampling), got {c!r}")
    return float(c)


def check_r(r: float) -> float:
    if not (isinstance(r, (int, float)) and r > 0):
        raise ValueError(f"r must be > 0, got {r!r}")
    return r


# ---- a config's fields: DecodeConfig and SSDConfig check them, and the command line before the kit loads --------------


def check_decoding(k, a_p, temperature, max_new_tokens) -> None:
    """DecodeConfig's fields."""
    check_k(k)
    check_unit(a_p, "a_p")
    check_temperature(temperature)
    check_at_least(max_new_tokens, "max_new_tokens")


def check_ssd(budget, fan_out_strategy, saguaro_c, backup, r) -> None:
    """SSDConfig's own fields that the command line sets too (budget may be 'auto')."""
    check_budget_or_auto(budget)
    check_strategy(fan_out_strategy)
    check_saguaro_c(saguaro_c)
    check_backup(backup)
    check_r(r)


# ---- the bench's method variants -------------------------------------------------------------------------------------

# A variant's fields and the checks the configs run on them (DecodeConfig's and SSDConfig's): a variant the bench
# would refuse only once the pair is loaded is refused as the command line reads it.
VARIANT_CHECKS = {
    "k": check_k,
    "budget": check_budget_or_auto,
    "batch_size": lambda value: check_at_least(value, "batch_size"),
    "backup": check_backup,
}
VARIANT_FIELDS = tuple(VARIANT_CHECKS)


def parse_variant(spec: str) -> tuple[str, dict]:
    """'sd:k=2' -> ('sd', {'k': 2}); 'ssd:k=auto' -> ('ssd', {'k': 'auto'}); a plain name -> (name, {}). Each value is
    checked as the config checks it, in one line that names the variant: 'ar:batch_size=0' fails here."""
    name, *settings = spec.split(":")
    check_method(name)
    overrides = {}
    for setting in settings:
        field, _, text = setting.partition("=")
        if field not in VARIANT_FIELDS or not text:
            raise ValueError(f"method variant {spec!r}: each setting after the method must be FIELD=VALUE with FIELD "
                             f"one of {', '.join(VARIANT_FIELDS)}; got {setting!r}")
        value = _variant_value(field, text, spec)
        try:
            overrides[field] = VARIANT_CHECKS[field](value)
        except ValueError as e:
            raise ValueError(f"method variant {spec!r}: {e}") from None
    return name, overrides


def _variant_value(field: str, text: str, spec: str):
    """The value a setting's text stands for: backup's name as it is, else 'auto' or an integer."""
    if field == "backup":
        return text
    if text == AUTO:
        if field == "batch_size":
            raise ValueError(f"method variant {spec!r}: batch_size is an integer >= 1, not 'auto'")
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"method variant {spec!r}: {text!r} is neither an integer nor 'auto'") from None


def parse_methods(spec: str) -> list[str]:
    """'ar,sd,sd:k=2' -> ['ar', 'sd', 'sd:k=2'], each checked."""
    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise ValueError("methods is empty: give a comma-separated list such as ar,sd")
    for name in names:
        parse_variant(name)
    if len(set(names)) < len(names):
        raise ValueError(f"methods names one twice: {spec!r}")
    return names


def check_gguf_pair(pair: str, who: str) -> None:
    """llama.cpp (``who``: a method or a command) runs the GGUF files of a registered offline pair, nothing else."""
    if pair not in PAIR_NAMES:
        raise ValueError(f"pair={pair!r}: {who} runs the GGUF files of a registered offline pair "
                         f"({', '.join(PAIR_NAMES)}), not a hub pair or the tiny one")


def check_engine_methods(methods: list[str], pair: str, temperature: float, batch_size: int) -> None:
    """llama.cpp's methods (ENGINE_AR) run a registered pair's GGUF files, greedy, one prompt a call: say so before
    anything loads."""
    names = [m for m in methods if parse_variant(m)[0] in ENGINE_AR]
    if not names:
        return
    check_gguf_pair(pair, names[0])
    if temperature != 0:
        raise ValueError(f"temperature={temperature}: {names[0]} runs greedy only (temperature 0)")
    for name in names:
        if parse_variant(name)[1].get("batch_size", batch_size) != 1:
            raise ValueError(f"batch_size: {name} takes one prompt a call (batch_size 1)")


def parse_budgets(spec: str) -> list[int]:
    """hit-rates' '0,1,2,4' -> [0, 1, 2, 4]: the budgets read off one run, each an integer >= 0."""
    try:
        budgets = sorted({int(b) for b in spec.split(",")})
    except ValueError:
        raise ValueError(f"budgets must be comma-separated integers >= 0 such as 0,1,2,4; got {spec!r}") from None
    for budget in budgets:
        check_budget(budget)
    return budgets


def parse_strategies(spec: str) -> list[str]:
    """hit-rates' 'uniform,geometric' -> ['uniform', 'geometric'], each one of STRATEGIES."""
    return [check_strategy(s.strip()) for s in spec.split(",")]
