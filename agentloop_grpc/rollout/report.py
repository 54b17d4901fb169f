"""report.html: the run at a glance, with PNG plots next to it (matplotlib, Agg backend: no display needed).

Plots: a timeline of every trajectory (generating vs tools vs waiting, from the turn trace), latency
distributions (generate calls, tool phases), the reward distribution and terminations, per-server in-flight
requests over time with the router's routing decisions (new / sticky / moved); the token drift per kind with
one example each (where the recorded tokens depart from a fresh render of the conversation, and whether that is
harmless); then one trajectory rendered token by token with its response mask (model tokens and tool/template
tokens in two colours).
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.agent.tracing import read_trace
from agentloop_grpc.agent.trajectory import DRIFT_MEANING

MODEL_COLOUR, CONTEXT_COLOUR, WAIT_COLOUR, TOOL_COLOUR = "#1f77b4", "#ff7f0e", "#dddddd", "#2ca02c"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _timeline(trajectories: list[Trajectory], trace: list[dict], path: Path) -> None:
    plt = _pyplot()
    order = sorted(trajectories, key=lambda t: t.timings.started_at)
    origin = min(t.timings.started_at for t in order)
    rows = {t.sample_id: i for i, t in enumerate(order)}
    fig, ax = plt.subplots(figsize=(10, max(3, 0.18 * len(order) + 1.5)))
    for t in order:
        ax.barh(rows[t.sample_id], t.timings.total_s, left=t.timings.started_at - origin, color=WAIT_COLOUR,
                height=0.8)
    for event in trace:
        if event["sample_id"] not in rows or event["kind"] not in ("assistant", "tool", "user"):
            continue
        colour = MODEL_COLOUR if event["kind"] == "assistant" else TOOL_COLOUR
        ax.barh(rows[event["sample_id"]], event["seconds"], left=event["time"] - event["seconds"] - origin,
                color=colour, height=0.8)
    ax.set_xlabel("seconds since the first trajectory started")
    ax.set_ylabel("trajectory")
    ax.set_yticks([])
    ax.set_title("Timeline: generating (blue), tools / user (green), waiting (grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _latency(trace: list[dict], path: Path) -> None:
    plt = _pyplot()
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


def _rewards(trajectories: list[Trajectory], path: Path) -> None:
    plt = _pyplot()
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


def _servers(record, path: Path) -> None:
    plt = _pyplot()
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


def render_tokens(trajectory: Trajectory, codec: ChatCodec) -> str:
    """The trajectory's prompt (grey) and response token by token: model tokens and context tokens coloured."""
    parts = [f'<span class="prompt">{html.escape(codec.decode(trajectory.prompt_ids))}</span>']
    for token, mask, logprob in zip(trajectory.response_ids, trajectory.response_mask, trajectory.response_logprobs,
                                    strict=True):
        text = html.escape(codec.decode([token]))
        if mask:
            parts.append(f'<span class="model" title="id {token}, logprob {logprob:.3f}">{text}</span>')
        else:
            parts.append(f'<span class="context" title="id {token}">{text}</span>')
    return "".join(parts)


def _token(codec: ChatCodec, token_id: int | None) -> str:
    if token_id is None:
        return "nothing (past the end)"
    return f"id {token_id} {html.escape(repr(codec.decode([token_id])))}"


def drift_section(summary: dict, codec: ChatCodec) -> str:
    """The drift table: per kind, how many trajectories, what it means, and its first example with the token
    where the recorded ids depart from a fresh render and both texts around that place."""
    rows = []
    for kind, entry in summary.get("drift", {}).items():
        example = entry["example"]
        if example is None:
            shown = "none"
        else:
            shown = (f"{html.escape(example['sample_id'])}, token {example['position']}: recorded "
                     f"{_token(codec, example['recorded'])}, rendered {_token(codec, example['rendered'])}"
                     f"<pre>recorded: {html.escape(repr(example['recorded_text']))}\n"
                     f"rendered: {html.escape(repr(example['rendered_text']))}</pre>")
        rows.append(f"<tr><th>{kind}</th><td>{entry['count']}</td><td>{html.escape(DRIFT_MEANING[kind])}</td>"
                    f"<td>{shown}</td></tr>")
    return ("<p>Trajectories whose recorded tokens (what the engine saw and produced) depart from a fresh render "
            "of their conversation by the chat template, at the first place they part.</p>"
            f"<table><tr><th>kind</th><th>trajectories</th><th>meaning</th><th>first example</th></tr>"
            f"{''.join(rows)}</table>")


def _example(trajectories: list[Trajectory]) -> Trajectory | None:
    candidates = [t for t in trajectories if not t.failed] or trajectories
    return max(candidates, key=lambda t: (t.reward, t.assistant_turns, -len(t.response_ids)), default=None)


def write_report(record, summary: dict, codec: ChatCodec, path: Path) -> Path:
    out = path.parent
    trajectories = record.trajectories
    trace_path = out / "trace.jsonl"
    trace = read_trace(trace_path) if trace_path.exists() else []
    _timeline(trajectories, trace, out / "timeline.png")
    _latency(trace, out / "latency.png")
    _rewards(trajectories, out / "rewards.png")
    _servers(record, out / "servers.png")
    example = _example(trajectories)
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(v))}</td></tr>"
                   for k, v in summary.items() if k != "drift")  # drift has its own section
    tokens = render_tokens(example, codec) if example is not None else ""
    example_title = (f"{html.escape(example.sample_id)}: reward {example.reward}, {example.assistant_turns} assistant "
                     f"turns, {example.termination.value}" if example is not None else "")
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>agentloop rollout report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1100px; }}
table {{ border-collapse: collapse; }} th, td {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
.tokens {{ font-family: monospace; white-space: pre-wrap; border: 1px solid #ccc; padding: 1em; line-height: 1.6; }}
.prompt {{ color: #888; }}
.model {{ background: #cfe2f3; border-right: 1px solid #9fc5e8; }}
.context {{ background: #fce5cd; border-right: 1px solid #f9cb9c; }}
pre {{ white-space: pre-wrap; margin: 4px 0; }}
</style></head><body>
<h1>Rollout report</h1>
<p>{len(trajectories)} trajectories{" (interrupted: the ones finished before Ctrl-C)" if record.interrupted else ""},
written to <code>{html.escape(str(out))}</code>. Rates are measured as they came out: nothing is filtered.</p>
<table>{rows}</table>
<h2>Token drift</h2>{drift_section(summary, codec)}
<h2>Timeline</h2><img src="timeline.png" alt="timeline">
<h2>Latencies</h2><img src="latency.png" alt="latency distributions">
<h2>Rewards and terminations</h2><img src="rewards.png" alt="reward distribution">
<h2>Servers</h2><img src="servers.png" alt="per-server load and routing decisions">
<h2>One trajectory, token by token</h2>
<p>{example_title}. Legend: <span class="model">model token (mask 1)</span>
<span class="context">tool / template token (mask 0)</span> <span class="prompt">prompt</span>.
Hover a token for its id and logprob.</p>
<div class="tokens">{tokens}</div>
</body></html>
""")
    return path
