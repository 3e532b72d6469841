"""ssd.analysis.widgets: explorers run at the defaults at once, re-run on a change, and reject bad controls by name."""
import matplotlib

matplotlib.use("Agg")

import ipywidgets as widgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from ssd.analysis.widgets import budget_explorer, explorer, sd_explorer  # noqa: E402


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return pd.DataFrame([kwargs])


def test_explorer_runs_once_at_defaults_then_on_change():
    calls = []

    def run(k, temperature, strategy):
        calls.append((k, temperature, strategy))
        return k * 10

    ui = explorer(run, k=(1, 8, 1, 4), temperature=(0.0, 1.5, 0.1, 0.7), strategy=["uniform", "geometric"])
    assert calls == [(4, 0.7, "uniform")] and ui.result == 40
    assert isinstance(ui.controls["k"], widgets.IntSlider)
    assert isinstance(ui.controls["temperature"], widgets.FloatSlider)
    assert isinstance(ui.controls["strategy"], widgets.Dropdown)
    assert not ui.controls["k"].continuous_update and not ui.controls["temperature"].continuous_update
    assert ui.controls["k"].description == "K" and ui.run_button is None  # fast: it runs on each change
    ui.controls["k"].value = 6
    assert calls[-1] == (6, 0.7, "uniform") and ui.result == 60 and len(calls) == 2
    ui.controls["strategy"].value = "geometric"
    assert calls[-1] == (6, 0.7, "geometric") and ui.values == {"k": 6, "temperature": 0.7, "strategy": "geometric"}


def test_sd_and_budget_explorers():
    run = Recorder()
    ui = sd_explorer(run)
    assert run.calls == [{"k": 4, "temperature": 0.0}]
    assert (ui.controls["k"].min, ui.controls["k"].max) == (1, 8)
    assert (ui.controls["temperature"].max, ui.controls["temperature"].step) == (1.5, 0.1)
    assert ui.result.equals(pd.DataFrame([{"k": 4, "temperature": 0.0}]))

    run = Recorder()
    ui = budget_explorer(run)
    assert run.calls == [{"budget": 8, "strategy": "uniform"}]
    assert list(ui.controls["budget"].options) == [0, 1, 2, 4, 8, 16, 32]
    assert list(ui.controls["strategy"].options) == ["uniform", "geometric", "calibrated"]
    # A decode per run: a change waits for Run (arrow keys on a slider used to queue one decode per press).
    ui.controls["budget"].value = 0
    ui.controls["budget"].value = 1
    assert len(run.calls) == 1 and "press Run" in ui.status.value
    ui.run_button.click()
    assert run.calls[-1] == {"budget": 1, "strategy": "uniform"} and len(run.calls) == 2
    assert ui.status.value.startswith("ran (budget B 1, fan-out uniform) in ") and not ui.run_button.disabled


def test_the_status_says_what_runs_and_the_button_is_off_meanwhile():
    seen = []

    def run(k, temperature):
        seen.append((ui.status.value, ui.run_button.disabled))
        return k

    ui = sd_explorer(lambda k, temperature: k)  # build first: the run at the defaults happens inside
    ui.fn = run
    ui.run_button.click()
    assert seen == [("running (K 4, temperature 0.0) ...", True)]
    assert ui.status.value.startswith("ran (K 4, temperature 0.0) in ")


def test_figure_results_are_detached_from_pyplot():
    def draw(k):
        fig, ax = plt.subplots()
        ax.plot(range(k))
        return fig

    ui = explorer(draw, k=(1, 4, 1, 2))
    ui.controls["k"].value = 3
    assert isinstance(ui.result, plt.Figure) and plt.get_fignums() == []


@pytest.mark.parametrize("controls, message", [
    ({"k": (1, 8, 1)}, "control 'k'"),
    ({"k": (8, 1, 1, 4)}, "control 'k': min must be below max"),
    ({"k": (1, 8, 0, 4)}, "control 'k': step must be > 0"),
    ({"k": (1, 8, 1, 9)}, r"control 'k': default must lie in \[1, 8\]"),
    ({"k": (1, "8", 1, 4)}, "control 'k'.*numbers"),
    ({"strategy": []}, "control 'strategy'.*at least one option"),
    ({"budget": ([0, 1, 2], 8)}, "control 'budget': default 8 is not one of"),
    ({"budget": {0: 1}}, "control 'budget'"),
    ({"depth": (1, 8, 1, 4)}, "'depth'.*not parameters"),
    ({}, "at least one control"),
])
def test_bad_controls_rejected(controls, message):
    def run(k=1, strategy="uniform", budget=0):
        return None

    with pytest.raises(ValueError, match=message):
        explorer(run, **controls)


def test_error_at_defaults_is_raised():
    def broken(k):
        raise RuntimeError("decode failed")

    with pytest.raises(RuntimeError, match="decode failed"):
        explorer(broken, k=(1, 8, 1, 4))
