"""The report's PNG plots (matplotlib, Agg backend: no display needed): latency distributions of generate calls
and tool phases, rewards and terminations, per-server in-flight requests with the router's routing decisions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from agentloop_grpc.agent import Trajectory

MODEL_COLOUR, CONTEXT_COLOUR, TOOL_COLOUR = "#1f77b4", "#ff7f0e", "#2ca02c"


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_plot(trace: list[dict], path: Path) -> None:
    plt = pyplot()
    generate = [e["seconds"] for e in trace if e["kind"] == "assistant"]
    tools = [e["seconds"] for e in trace if e["kind"] in ("tool", "user")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, values, title, colour in ((axes[0], generate, "generate calls (s)", MODEL_COLOUR),
                                      (axes[1], tools, "tool phases (s)", TOOL_COLOUR)):
        if values:
            ax.hist(values, bins=min(30, max(5, len(values) // 2)), color=colour)
        ax.set_title(f"{title}, n={len(values)}")
        ax.set_ylabel("count")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def rewards_plot(trajectories: list[Trajectory], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    rewards = Counter(round(t.reward, 3) for t in trajectories if not t.failed)
    axes[0].bar([str(k) for k in sorted(rewards)], [rewards[k] for k in sorted(rewards)], color=MODEL_COLOUR)
    axes[0].set_title("reward (trajectories that did not fail)")
    terminations = Counter(t.termination.value for t in trajectories)
    axes[1].bar(list(terminations), list(terminations.values()), color=CONTEXT_COLOUR)
    axes[1].set_title("terminations")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def servers_plot(record, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), gridspec_kw={"width_ratios": [3, 1]})
    if record.load:
        origin = min(s.time for s in record.load)
        for server in record.servers:
            points = [(s.time - origin, s.in_flight) for s in record.load if s.server == server]
            axes[0].step([p[0] for p in points], [p[1] for p in points], where="post", label=server)
        axes[0].legend(fontsize=8)
    axes[0].set_title("in-flight generate calls per server")
    axes[0].set_xlabel("seconds")
    names = ["new", "sticky", "moved"]
    axes[1].bar(names, [record.decisions.get(n, 0) for n in names], color=[CONTEXT_COLOUR, MODEL_COLOUR, "#d62728"])
    axes[1].set_title("routing decisions")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
