"""report.html of a training run: the reward curve, where each step's time went, engine-vs-trainer logprobs,
and who waited for whom (with async mode's staleness histogram and queue, and the rollout correction's weights
by version lag).

PNG plots beside the page (matplotlib, Agg backend), the summary as a table, and the per-step metrics.
"""

from __future__ import annotations

import html
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from agentloop_grpc.rollout.report_plots import pyplot as _pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .record import TrainRecord


def _save(plt: ModuleType, fig: Figure, path: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # optimizer steps
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _labels(ax: Axes, ylabel: str, title: str) -> None:
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)


def _rolling(values: list[float], window: int) -> list[float]:
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _reward_curve(steps: list[dict], path: Path) -> None:
    plt = _pyplot()
    x = [s["step"] for s in steps]
    reward = [s["reward_mean"] for s in steps]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.plot(x, reward, "o-", alpha=0.45, label="mean reward (per step)")
    ax.plot(x, _rolling(reward, 5), "-", linewidth=2.5, label="mean reward (5-step rolling)")
    ax.plot(x, [s["valid_call_rate"] for s in steps], "--", alpha=0.7, label="valid tool-call rate")
    ax.set_xlabel("optimizer step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Reward curve (scorable trajectories of each step's rollout)")
    ax.legend(loc="upper left", fontsize=8)
    _save(plt, fig, path)


def _time_split(steps: list[dict], path: Path) -> None:
    plt = _pyplot()
    x = [s["step"] for s in steps]
    rollout = [s["rollout_s"] for s in steps]
    train = [s["train_s"] for s in steps]
    sync = [s["weight_sync_s"] for s in steps]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.bar(x, rollout, label="rollout", color="#1f77b4")
    ax.bar(x, train, bottom=rollout, label="train (logprobs, loss, backward, optimizer)", color="#ff7f0e")
    ax.bar(x, sync, bottom=[a + b for a, b in zip(rollout, train, strict=True)], label="weight sync",
           color="#2ca02c")
    _labels(ax, "seconds", "Time per step")
    _save(plt, fig, path)


def _logprobs(steps: list[dict], path: Path) -> bool:
    measured = [s for s in steps if "logprob_diff_sampler_max" in s]
    if not measured:
        return False
    plt = _pyplot()
    x = [s["step"] for s in measured]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for key, label in (("logprob_diff_sampler_max", "sampler (grammar replayed): max"),
                       ("logprob_diff_sampler_mean", "sampler: mean"),
                       ("logprob_diff_policy_mean", "policy (no grammar): mean")):
        ax.semilogy(x, [max(s[key], 1e-9) for s in measured], "o-", label=label)
    _labels(ax, "|engine - trainer| logprob", "Engine logprobs against the trainer's recompute under the same weights")
    _save(plt, fig, path)
    return True


def _pipeline(steps: list[dict], path: Path) -> bool:
    """Async mode: each step's staleness histogram and queue; both modes: who waited for whom; with the rollout
    correction on: its weights by version lag."""
    if not steps or "trainer_idle_s" not in steps[0]:
        return False
    plt = _pyplot()
    x = [s["step"] for s in steps]
    histogram = sorted((k for k in steps[0] if k.startswith("staleness_") and k[10:].isdigit()),
                       key=lambda k: int(k[10:]))
    lags = _correction_lags(steps)
    panels = 1 + bool(histogram) + bool(lags)
    fig, axes = plt.subplots(panels, 1, figsize=(9, 3.2 * panels), squeeze=False)
    if histogram:
        ax, bottom = axes[0][0], [0.0] * len(steps)
        for key in histogram:
            counts = [s.get(key, 0.0) for s in steps]
            ax.bar(x, counts, bottom=bottom, label=f"{key[10:]} version(s) behind")
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        queue = ax.twinx()
        queue.plot(x, [s.get("queue_groups", 0.0) for s in steps], "k.--", label="finished groups waiting")
        queue.set_ylabel("groups waiting")
        ax.set_ylabel("trajectories trained")
        ax.set_title("Staleness: trained version minus the oldest token's version")
        ax.legend(loc="upper left", fontsize=8)
        queue.legend(loc="upper right", fontsize=8)
    if lags:
        _correction_panel(axes[1 if histogram else 0][0], steps, lags)
    ax = axes[-1][0]
    ax.plot(x, [s["trainer_idle_s"] for s in steps], "o-", label="trainer idle (waiting for rollouts)")
    ax.plot(x, [s["engine_idle_s"] for s in steps], "s-", label="engines idle (no group in flight)")
    _labels(ax, "seconds", "Who waited for whom")
    _save(plt, fig, path)
    return True


def _correction_lags(steps: list[dict]) -> list[int]:
    """The version lags the rollout correction weighed tokens at, over the run (empty: the correction was off)."""
    return sorted({int(k.split("/")[1][4:]) for s in steps for k in s
                   if k.startswith("correction/lag_") and k.endswith("/ratio_mean")})


def _correction_panel(ax: Axes, steps: list[dict], lags: list[int]) -> None:
    """Each lag's mean importance weight with its min..max band, and the share the bounds truncated or masked."""
    for lag in lags:
        measured = [s for s in steps if f"correction/lag_{lag}/ratio_mean" in s]
        x = [s["step"] for s in measured]
        line = ax.plot(x, [s[f"correction/lag_{lag}/ratio_mean"] for s in measured], "o-",
                       label=f"{lag} version(s) behind: mean weight")[0]
        ax.fill_between(x, [s[f"correction/lag_{lag}/ratio_min"] for s in measured],
                        [s[f"correction/lag_{lag}/ratio_max"] for s in measured], alpha=0.15,
                        color=line.get_color())
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    share = ax.twinx()
    share.plot([s["step"] for s in steps],
               [s.get("correction/truncated_share", s.get("correction/masked_share", 0.0)) for s in steps],
               "k.--", label="share truncated or masked")
    share.set_ylabel("share of tokens")
    ax.set_ylabel("trainer / engine probability")
    ax.set_title("Rollout correction: importance weights by version lag (band: min..max)")
    ax.legend(loc="upper left", fontsize=8)
    share.legend(loc="upper right", fontsize=8)


def write_report(record: TrainRecord, path: Path) -> None:
    steps, summary = record.steps, record.summary
    folder = path.parent
    images = []
    if steps:
        _reward_curve(steps, folder / "reward_curve.png")
        _time_split(steps, folder / "time_per_step.png")
        images = ["reward_curve.png", "time_per_step.png"]
        if _logprobs(steps, folder / "logprob_diff.png"):
            images.append("logprob_diff.png")
        if _pipeline(steps, folder / "pipeline.png"):
            images.append("pipeline.png")
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in summary.items())
    columns = ["step", "reward_mean", "correct_rate", "valid_call_rate", "frac_groups_zero_std", "rollout_s",
               "train_s", "weight_sync_s", "trainer_idle_s", "engine_idle_s", "staleness_max", "queue_groups",
               "logprob_diff_sampler_max", "logprob_diff_policy_mean", "correction/ratio_mean",
               "correction/ratio_max", "policy_ratio_mean", "loss",
               "grad_norm"]
    head = "".join(f"<th>{c}</th>" for c in columns)
    trainer = "AsyncGRPOTrainer" if summary.get("trainer") == "trl_async" else "GRPOTrainer"
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(s.get(c))}</td>" for c in columns) + "</tr>" for s in steps
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>agentloop train</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}th{{background:#f4f4f4}}</style></head><body>
<h1>GRPO training run</h1>
<p>TRL {trainer} learning from agentloop-grpc rollouts. The ratio compares the mean reward of the last steps
with the first steps.</p>
<table>{rows}</table>
{''.join(f'<p><img src="{name}" alt="{name}"></p>' for name in images)}
<h2>Per step</h2><table><tr>{head}</tr>{body}</table>
</body></html>
"""
    path.write_text(page)


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    return html.escape(str(value))
