"""The one line ``agentloop train`` prints per optimizer step: what a user reads while the run goes.

Every figure is a number or a word, never ``nan``: the engine-vs-trainer logprob check compares only tokens the
trainer's current weights made, so in async mode, where a step's tokens are usually a version old, it says
``stale`` (the rollout correction's weights, ``IS``, then say how far those tokens are from the trainer's policy).
"""

from __future__ import annotations


def logprob_word(entry: dict, checked: bool) -> str:
    """``|dlogp|``: the check's largest difference, or why there is none (``off``: not asked; ``stale``: no token
    of the trainer's version; ``-``: no scorable trajectory)."""
    if "logprob_diff_sampler_max" in entry:
        return f"{entry['logprob_diff_sampler_max']:.1e}"
    if not checked:
        return "off"
    return "stale" if entry.get("staleness_max", 0) > 0 else "-"


def progress_line(step: int, max_steps: int, entry: dict, checked: bool) -> str:
    """One step's line from its metrics ``entry`` (``checked``: the logprob check is on)."""
    line = (
        f"step {step:3d}/{max_steps}  reward {entry['reward_mean']:.3f}  correct {entry['correct_rate']:.0%}"
        f"  valid calls {entry['valid_call_rate']:.0%}  rollout {entry['rollout_s']:.1f}s"
        f"  train {entry['train_s']:.1f}s  sync {entry['weight_sync_s']:.1f}s"
        f"  |dlogp| {logprob_word(entry, checked)}"
    )
    if "staleness_max" in entry:
        line += f"  staleness<={entry['staleness_max']:.0f}  queue {entry['queue_groups']:.0f}"
    if "correction/ratio_mean" in entry:
        cut = entry.get("correction/truncated_share", entry.get("correction/masked_share", 0.0))
        line += (f"  IS {entry['correction/ratio_mean']:.2f} [{entry['correction/ratio_min']:.2f}, "
                 f"{entry['correction/ratio_max']:.2f}] cut {cut:.0%}")
    elif "policy_ratio_mean" in entry:  # AsyncGRPOTrainer: no correction, its loss clips this ratio
        line += f"  IS trainer's clip, ratio {entry['policy_ratio_mean']:.2f}"
    elif entry.get("correction/excluded_constrained_tokens", 0) > 0:
        line += "  IS constrained"  # the correction is on, but every model token was a constrained trajectory's
    return line
