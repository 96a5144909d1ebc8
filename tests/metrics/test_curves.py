"""curves.png: which panels a run's setting can move, the smoothing, the held-out points."""

import math

import pytest

from grpokit.metrics.curves import curve_panels, plot_curves, smooth


def _rows(n=4, evals=()):
    rows = []
    for s in range(1, n + 1):
        r = {
            "step": s,
            "rewards/math_correct": 0.1 * s,
            "rewards/format": 1.0,
            "reward_mean": 0.1 * s + 1,
            "truncated_frac": 0.5,
            "frac_zero_std": 0.25,
            "entropy": 1.0 / s,
            "completion_len_mean": 10.0 + s,
            "kl": 0.01 * s,
            "clip_frac_low": 0.0,
            "clip_frac_high": 0.0,
            "train_minutes": 0.5 * s,
        }
        if s in evals:
            r.update({"eval/greedy": 0.2 + 0.1 * s, "eval/greedy_lo": 0.1 + 0.1 * s, "eval/greedy_hi": 0.3 + 0.1 * s})
        rows.append(r)
    return rows


def test_smooth_hand_values():
    # m1 = 0.5*0 + 0.5*1 = 0.5 -> /(1-0.5) = 1; m2 = 0.25 + 0 -> /(1-0.25) = 1/3; None skipped:
    # m3 = 0.125 + 0.5*4 = 2.125 -> /(1-0.125) = 2.428571...
    out = smooth([1.0, 0.0, None, 4.0], 0.5)
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx(1 / 3)
    assert math.isnan(out[2]) and out[3] == pytest.approx(2.125 / 0.875)
    assert smooth([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])  # bias-corrected: a constant stays put
    with pytest.raises(ValueError, match="weight"):
        smooth([1.0], 1.0)


def test_panels_that_cannot_move_are_left_out():
    titles = [p["title"] for p in curve_panels(_rows(), beta=0.0, num_iterations=1)]
    assert titles == ["reward functions", "fractions", "entropy", "completion length"]
    titles = [p["title"] for p in curve_panels(_rows(), beta=0.04, num_iterations=2)]
    assert "KL to the reference (k3)" in titles and "clip fraction" in titles


def test_each_reward_function_raw_and_smoothed():
    (rew,) = [p for p in curve_panels(_rows(), beta=0, num_iterations=1) if p["title"] == "reward functions"]
    labels = [ln["label"] for ln in rew["lines"]]
    assert labels == ["format", "format (smoothed)", "math_correct", "math_correct (smoothed)"]
    raw, sm = rew["lines"][2], rew["lines"][3]
    assert raw["y"] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert sm["y"] == pytest.approx(smooth([0.1, 0.2, 0.3, 0.4]))


def test_process_runs_also_draw_the_step_reward():
    rows = _rows()
    for r in rows:
        r["step_reward_mean"] = 0.5
    (rew,) = [p for p in curve_panels(rows, beta=0, num_iterations=1) if p["title"] == "reward functions"]
    assert [ln["label"] for ln in rew["lines"]][-2:] == ["step reward (process)", "step reward (process, smoothed)"]
    assert rew["lines"][-1]["y"] == pytest.approx([0.5] * 4)
    (fr,) = [p for p in curve_panels(_rows(), beta=0, num_iterations=1) if p["title"] == "fractions"]
    assert len(fr["lines"]) == 2  # an outcome run has no step rewards
    for i, r in enumerate(rows):
        r["step_frac_zero_std"] = 0.25 * i
    (fr,) = [p for p in curve_panels(rows, beta=0, num_iterations=1) if p["title"] == "fractions"]
    assert fr["lines"][-1]["label"] == "groups with zero step-reward variance"
    assert fr["lines"][-1]["y"] == pytest.approx([0.0, 0.25, 0.5, 0.75])


def test_held_out_points_with_before_at_step_zero():
    # as eval_before.json holds it (Setup.run_eval: evaluate()'s result, metrics from evalstats.summarize)
    before = {
        "accuracy": 0.05,
        "metrics": {"n_problems": 100, "k": 0, "metrics": {"greedy": {"value": 0.05, "lo": 0.03, "hi": 0.07}}},
    }
    panels = curve_panels(_rows(4, evals=(2, 4)), beta=0, num_iterations=1, before=before)
    (acc,) = [p for p in panels if p["title"].startswith("held-out accuracy")]
    (ln,) = acc["lines"]
    assert ln["kind"] == "interval" and ln["label"] == "greedy"
    assert ln["x"] == [0, 2, 4] and ln["y"] == pytest.approx([0.05, 0.4, 0.6])
    assert ln["lo"] == pytest.approx([0.03, 0.3, 0.5]) and ln["hi"] == pytest.approx([0.07, 0.5, 0.7])
    assert ln["minutes"] == pytest.approx([0.0, 1.0, 2.0])


def _evaluation(value, lo, hi):  # as eval_before.json / eval_after.json hold it
    return {
        "accuracy": value,
        "metrics": {"n_problems": 10, "k": 0, "metrics": {"greedy": {"value": value, "lo": lo, "hi": hi}}},
    }


def _held_out_line(panels):
    (ln,) = next(p for p in panels if p["title"].startswith("held-out accuracy"))["lines"]
    return ln


def test_held_out_points_include_the_evaluation_after_training():
    """No periodic evaluation: the one before training (step 0) and the one after it (at the last
    step, with that step's training minutes) are both drawn; after a periodic one at the last step
    (the same evaluation) its point is drawn once."""
    before, after = _evaluation(0.05, 0.03, 0.07), _evaluation(0.3, 0.2, 0.4)
    ln = _held_out_line(curve_panels(_rows(3), beta=0, num_iterations=1, before=before, after=after))
    assert ln["x"] == [0, 3] and ln["y"] == pytest.approx([0.05, 0.3])
    assert ln["lo"] == pytest.approx([0.03, 0.2]) and ln["hi"] == pytest.approx([0.07, 0.4])
    assert ln["minutes"] == pytest.approx([0.0, 1.5])  # train_minutes of step 3 = 0.5 * 3
    same = _evaluation(0.6, 0.5, 0.7)  # the periodic evaluation of step 4, given again as the one after
    ln = _held_out_line(curve_panels(_rows(4, evals=(2, 4)), beta=0, num_iterations=1, before=before, after=same))
    assert ln["x"] == [0, 2, 4] and ln["y"] == pytest.approx([0.05, 0.4, 0.6])


def test_loss_gradient_norm_and_learning_rate_panels():
    rows = _rows(3)
    for r in rows:
        s = r["step"]
        r.update(loss=0.1 * s, grad_norm=2.0 * s, lr=1e-3 * (4 - s))
    panels = {p["title"]: p for p in curve_panels(rows, beta=0, num_iterations=1)}
    loss, gn, lr = panels["loss"]["lines"], panels["gradient norm"]["lines"], panels["learning rate"]["lines"]
    assert [ln["kind"] for ln in loss] == ["raw", "smooth"] and loss[0]["x"] == [1, 2, 3]
    assert loss[0]["y"] == pytest.approx([0.1, 0.2, 0.3]) and loss[1]["y"] == pytest.approx(smooth([0.1, 0.2, 0.3]))
    assert gn[0]["y"] == pytest.approx([2.0, 4.0, 6.0]) and gn[1]["y"] == pytest.approx(smooth([2.0, 4.0, 6.0]))
    assert [ln["kind"] for ln in lr] == ["raw"] and lr[0]["y"] == pytest.approx([3e-3, 2e-3, 1e-3])


def test_plot_writes_a_png(tmp_path):
    import json

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(6, evals=(3, 6))))
    plot_curves(
        path,
        tmp_path / "c.png",
        beta=0.04,
        num_iterations=2,
        before={"metrics": {"n_problems": 10, "k": 0, "metrics": {"greedy": {"value": 0.1, "lo": 0.05, "hi": 0.2}}}},
    )
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.curves
@pytest.mark.slow
@pytest.mark.parametrize("every", [2, 0])
def test_a_run_with_evaluations_draws_them(tiny_model_dir, tmp_path, monkeypatch, every):
    """End to end: the before-training evaluation (eval_before.json as the run writes it) and the
    periodic one (``every``: 2) or the one after training (0) reach the held-out panel of the run's
    curves.png."""
    import grpokit.trainer.loop
    from grpokit.metrics import read_metrics
    from grpokit.trainer.loop import train
    from support.helpers import tiny_recipe

    seen = {}
    real = grpokit.trainer.loop.plot_curves

    def spy(metrics_path, out_png, **kw):
        seen["panels"] = curve_panels(
            read_metrics(metrics_path),
            beta=kw["beta"],
            num_iterations=kw["num_iterations"],
            before=kw["before"],
            after=kw.get("after"),
        )
        return real(metrics_path, out_png, **kw)

    monkeypatch.setattr(grpokit.trainer.loop, "plot_curves", spy)
    train(
        tiny_recipe(
            tiny_model_dir,
            tmp_path,
            data={"skip": 4, "limit": 8},
            train={"max_steps": 2},
            eval={"dataset": "mawps", "split": "singleop", "limit": 2, "max_new_tokens": 2, "every_steps": every},
        ),
        progress=False,
    )
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    (acc,) = [p for p in seen["panels"] if p["title"].startswith("held-out accuracy")]
    assert acc["lines"][0]["x"] == [0, 2]


def test_the_png_keeps_every_legend_label_and_ticks_whole_steps(tmp_path, monkeypatch):
    """A reward named ``_private`` keeps its legend entry (matplotlib drops labels starting with ``_``
    when it collects them itself) and a 3-step run has whole-number step ticks only (matplotlib's
    default locator puts ticks at 1.25, 1.5, …)."""
    import json

    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)  # keep the figure plot_curves draws
    rows = _rows(3)
    for r in rows:
        r["rewards/_private"] = r.pop("rewards/format")
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_curves(path, tmp_path / "c.png")
    (fig,) = drawn
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    legend = [t.get_text() for t in axes["reward functions"].get_legend().get_texts()]
    assert legend == ["_private", "_private (smoothed)", "math_correct", "math_correct (smoothed)"]
    for title, ax in axes.items():
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), (title, ticks)
    plt.close("all")
