"""Thin ipywidgets front ends: a slider or dropdown per parameter over a function the notebook already runs.

Never the only way to run anything: the function is plain Python (a lambda over `ssd.analysis.experiments`), called once
at the defaults as soon as the explorer is built, so a headless run (papermill, nbval) computes the default result and
`.result` holds it for a plain cell after the widget cell to check. Sliders do not re-run while dragged
(continuous_update=False): one run per release, not one per pixel.

A slow function (a decode: seconds a run on the real pair) gets a Run button instead (run_button=True, the SD and
budget explorers): a slider's arrow keys change its value once per press, and re-running on every change queued one
decode per press. Then a change only marks the result stale, and Run runs once. A status line says what is running
and, after, how long it took.

A control is one of
- (min, max, step, default): a slider, IntSlider when all four are integers, else FloatSlider;
- [option, ...]: a dropdown, the first option the default;
- ([option, ...], default): a dropdown with another default.
"""
from __future__ import annotations

import inspect
import numbers
import time

import ipywidgets as widgets

# How the keys are shown: the DESIGN words.
LABELS = {"k": "K", "temperature": "temperature", "budget": "budget B", "strategy": "fan-out", "a_p": "a_p",
          "saguaro_c": "Saguaro C", "max_new_tokens": "max new tokens", "seed": "seed"}

SD_CONTROLS = {"k": (1, 8, 1, 4), "temperature": (0.0, 1.5, 0.1, 0.0)}
BUDGET_CONTROLS = {"budget": ([0, 1, 2, 4, 8, 16, 32], 8), "strategy": ["uniform", "geometric", "calibrated"]}

_ALLOWED = ("a (min, max, step, default) tuple for a slider, a non-empty list of options for a dropdown (first = "
            "default), or an (options list, default) pair")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _slider(name: str, spec: tuple):
    if not all(_is_number(v) for v in spec):
        raise ValueError(f"control {name!r}: a slider's (min, max, step, default) must all be numbers, got {spec!r}")
    lo, hi, step, default = spec
    if not lo < hi:
        raise ValueError(f"control {name!r}: min must be below max, got min={lo}, max={hi}")
    if not step > 0:
        raise ValueError(f"control {name!r}: step must be > 0, got {step}")
    if not lo <= default <= hi:
        raise ValueError(f"control {name!r}: default must lie in [{lo}, {hi}], got {default}")
    kind = widgets.IntSlider if all(isinstance(v, numbers.Integral) for v in spec) else widgets.FloatSlider
    return kind(value=default, min=lo, max=hi, step=step, description=LABELS.get(name, name),
                continuous_update=False, style={"description_width": "initial"})


def _dropdown(name: str, options: list, default):
    if not options:
        raise ValueError(f"control {name!r}: a dropdown needs at least one option")
    if default not in options:
        raise ValueError(f"control {name!r}: default {default!r} is not one of the options {options!r}")
    return widgets.Dropdown(options=list(options), value=default, description=LABELS.get(name, name),
                            style={"description_width": "initial"})


def control(name: str, spec):
    """The widget for one control spec (see the module docstring); ValueError naming the control otherwise."""
    if isinstance(spec, list):
        return _dropdown(name, spec, spec[0] if spec else None)
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], list):
        return _dropdown(name, spec[0], spec[1])
    if isinstance(spec, tuple) and len(spec) == 4:
        return _slider(name, spec)
    raise ValueError(f"control {name!r}: expected {_ALLOWED}; got {spec!r}")


def _check_accepts(fn, names) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = [n for n in names if n not in named]
    if unknown:
        raise ValueError(f"control(s) {unknown} are not parameters of {getattr(fn, '__name__', fn)!r}; "
                         f"it takes {sorted(named)}")


class Explorer(widgets.interactive):
    """ipywidgets.interactive that runs fn at the defaults now, keeps `.result`, and shows a Figure result once.

    `.controls` maps each key to its widget; setting a widget's value re-runs fn. An exception at the defaults is
    raised (interactive alone would only log it, and a headless run would silently show nothing); later exceptions
    are shown in the widget's output, as interactive does, and kept in `.error`.
    """

    def __init__(self, fn, controls: dict, run_button: bool = False):
        if not callable(fn):
            raise ValueError(f"fn must be callable, got {type(fn).__name__}")
        if not controls:
            raise ValueError(f"explorer needs at least one control: {_ALLOWED}")
        _check_accepts(fn, controls)
        built = {name: control(name, spec) for name, spec in controls.items()}
        self.fn = fn
        self.error: BaseException | None = None
        self.calls = 0
        self.status = widgets.Label()  # before interactive's first run, which writes to it
        super().__init__(self._call, {"manual": run_button, "manual_name": "Run", "auto_display": True}, **built)
        self.controls = {w._kwarg: w for w in self.kwargs_widgets}
        self.children = (*self.children[:-1], self.status, self.children[-1])  # above the output
        if run_button:
            for w in self.kwargs_widgets:
                w.observe(self._stale, names="value")
            self.update()  # interactive runs a manual one only on a click; the result at the defaults is wanted now
        if self.error is not None:
            raise self.error

    @property
    def run_button(self) -> widgets.Button | None:
        return getattr(self, "manual_button", None)

    def _stale(self, change) -> None:
        self.status.value = "settings changed: press Run to run with them"

    def _call(self, **kwargs):
        self.calls += 1
        self.error = None
        shown = ", ".join(f"{LABELS.get(k, k)} {v}" for k, v in kwargs.items())
        self.status.value = f"running ({shown}) ..."
        if self.run_button is not None:
            self.run_button.disabled = True  # greyed out while it runs: further clicks start no queued runs
        start = time.perf_counter()
        try:
            result = self.fn(**kwargs)
        except BaseException as e:
            self.error = e
            self.status.value = f"failed ({shown}): {type(e).__name__}"
            raise
        finally:
            if self.run_button is not None:
                self.run_button.disabled = False
        self.status.value = f"ran ({shown}) in {time.perf_counter() - start:.1f} s"
        # A pyplot figure would be drawn twice under the inline backend (flushed, then displayed as the result);
        # detached from pyplot it is displayed once, and a re-run does not pile up open figures.
        _detach_figure(result)
        return result

    @property
    def values(self) -> dict:
        return {name: w.value for name, w in self.controls.items()}


def _detach_figure(result) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - matplotlib is a dependency
        return
    if isinstance(result, Figure):
        import matplotlib.pyplot as plt

        plt.close(result)


def explorer(fn, run_button: bool = False, **controls) -> Explorer:
    """Widgets over fn(**values): one control per keyword (see the module docstring), fn run at the defaults now;
    run_button=True for a slow fn (a change then waits for a click on Run)."""
    return Explorer(fn, controls, run_button)


def sd_explorer(run) -> Explorer:
    """run(k=..., temperature=...): K from 1 to 8 (default 4), temperature 0 to 1.5 in steps of 0.1 (default 0).
    A decode per run: behind a Run button."""
    return Explorer(run, dict(SD_CONTROLS), run_button=True)


def budget_explorer(run) -> Explorer:
    """run(budget=..., strategy=...): budget B in 0, 1, 2, 4, ..., 32 (default 8), strategy uniform / geometric /
    calibrated (default uniform). A decode per run: behind a Run button."""
    return Explorer(run, dict(BUDGET_CONTROLS), run_button=True)
