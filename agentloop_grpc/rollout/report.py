"""report.html: the run at a glance, self-contained (the data embedded as JSON, a vanilla-JS page: no network).

Sections: a summary (what ran, counts, reward, failure share, tokens/s); every trajectory in a table with filters
(reward, termination, error, group, id) and the selected one token by token with its response mask (model tokens
and tool/template tokens in two colours), its messages, reward and error; GRPO group statistics; the errors by
cause (infrastructure told apart from the sample's or model's); the token drift per kind; a timeline with one
labelled row per trajectory (generating, tools, interaction, waiting; short phases kept visible, a shared or a
per-trajectory scale); PNG plots beside the page (report_plots.py). docs/report.md describes the sections.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from urllib.parse import quote, urlencode

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.agent.chat import ChatCodec
from agentloop_grpc.agent.tracing import read_trace
from agentloop_grpc.agent.trajectory import DRIFT_MEANING

from .report_data import MAX_DETAIL_CHARS, report_data, to_script_json
from .report_plots import latency_plot, rewards_plot, servers_plot
from .report_script import SCRIPT, STYLE

#: Groups listed in the page's table (the statistics above it count every group).
MAX_GROUP_ROWS = 2000


def _e(value) -> str:
    return html.escape(str(value))


def _fact(label: str, value, note: str = "") -> str:
    return f'<div id="fact-{label.replace(" ", "-")}">{_e(label)}<b>{_e(value)}</b>{_e(note)}</div>'


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"


def summary_section(record, summary: dict, data: dict) -> str:
    """What ran and how it went, in a few figures; summary.json beside the page has every figure."""
    ts: list[Trajectory] = record.trajectories
    failed = sum(t.failed for t in ts)
    infra = sum(t.infrastructure_failure for t in ts)
    groups = data["groups"]
    loops = ", ".join(f"{name} ({count})" for name, count in Counter(t.loop for t in ts).most_common())
    terminations = ", ".join(f"{k}: {v}" for k, v in Counter(t.termination.value for t in ts).most_common())
    servers = ", ".join(record.servers) or "none recorded"
    facts = "".join([
        _fact("trajectories", len(ts), " (interrupted: finished before Ctrl-C)" if record.interrupted else ""),
        _fact("failed", f"{failed} ({_percent(failed / len(ts) if ts else None)})",
              f"{infra} infrastructure" + _by_cause(summary) if failed else ""),
        _fact("mean reward", summary.get("mean_reward", "n/a"), " of the trajectories that did not fail"),
        _fact("correct rate", _percent(summary.get("correct_answers_rate")), " reward 1.0"),
        _fact("model tokens/s", summary.get("model_tokens_per_s", "n/a"), f" {summary.get('model_tokens', 0)} tokens"),
        _fact("wall time", f"{summary.get('wall_s', 0)} s"),
        _fact("assistant turns", summary.get("mean_assistant_turns", "n/a"), " mean"),
        _fact("tool calls", summary.get("tool_call_attempts", 0),
              f" {_percent(summary.get('valid_tool_calls_rate'))} valid"),
        _fact("groups", len(groups["groups"]), f" {_percent(groups['zero_variance_share'])} zero variance"),
        _fact("drifted", summary.get("drifted_trajectories", 0)),
        _routing_fact(summary.get("routed_experts") or {}),
    ])
    return (f"<p>Loops: {_e(loops)}. Engine servers: {_e(servers)}. Terminations: {_e(terminations)}. "
            f"Every figure is in <code>summary.json</code> beside this page; nothing is filtered.</p>"
            f'<div class="facts">{facts}</div>')


def _routing_fact(routing: dict) -> str:
    """The routed experts recorded for routing replay; nothing where none were asked for."""
    if not routing.get("trajectories"):
        return ""
    return _fact("routed experts", f"{_percent(routing['covered_share'])} of positions",
                 f" {routing['bytes_per_token']} bytes/token, {routing['trajectories']} trajectories")


def _by_cause(summary: dict) -> str:
    causes = summary.get("infrastructure_causes") or {}
    return " (" + ", ".join(f"{cause} {n}" for cause, n in causes.items()) + ")" if causes else ""


def groups_section(groups: dict) -> str:
    """Per GRPO group (samples of one prompt): size, reward mean and std of the scored members, zero variance,
    completeness."""
    if not groups["groups"]:
        return "<p>No trajectory records a group id: no GRPO groups.</p>"
    rows = "".join(
        f'<tr data-group="{_e(g["group"])}"><td><a href="#group={_e(g["group"])}">{_e(g["group"])}</a></td>'
        f'<td class="n">{g["n"]}</td><td class="failed">{g["failed"]}</td>'
        f'<td class="mean">{"" if g["mean"] is None else g["mean"]}</td>'
        f'<td class="std">{"" if g["std"] is None else g["std"]}</td>'
        f'<td class="zero">{"yes" if g["zero_variance"] else "no"}</td>'
        f'<td class="complete">{"yes" if g["complete"] else "no"}</td></tr>'
        for g in groups["groups"][:MAX_GROUP_ROWS])
    more = (f"<p class=\"note\">The table lists the first {MAX_GROUP_ROWS} of {len(groups['groups'])} groups.</p>"
            if len(groups["groups"]) > MAX_GROUP_ROWS else "")
    without = (f" {groups['without_group']} trajectories have no group id and are left out."
               if groups["without_group"] else "")
    return (f'<p><span id="zero-variance-share">{_percent(groups["zero_variance_share"])}</span> of the groups with '
            f"a scored member have zero reward variance: every member has the same reward, so GRPO's advantage is "
            f'zero and they teach nothing. <span id="complete-share">{_percent(groups["complete_share"])}</span> of '
            f"the groups are complete (as large as the largest group, {groups['expected_size']}, and nothing failed)."
            f"{without} Mean and std (population) are over the members that did not fail; a group's link filters "
            f"the trajectory table.</p>{more}"
            f'<div class="scroll"><table id="groups"><tr><th>group</th><th>n</th><th>failed</th><th>reward mean</th>'
            f"<th>reward std</th><th>zero variance</th><th>complete</th></tr>{rows}</table></div>")


def _side(cause: dict) -> str:
    return f"infrastructure: {_e(cause['what_failed'])}" if cause["infrastructure"] else "sample / model"


def errors_section(data: dict) -> str:
    """Failed trajectories by cause, infrastructure told apart; failed tool calls inside finished trajectories."""
    if data["errors"]:
        rows = "".join(
            f'<tr><td class="cause"><a href="#{_e(urlencode({"cause": c["cause"]}, quote_via=quote))}">'
            f'{_e(c["cause"])}</a></td>'
            f'<td class="side">{_side(c)}</td>'
            f'<td class="count">{c["count"]}</td><td>'
            + ", ".join(f'<a href="#select={_e(s)}">{_e(s)}</a>' for s in c["samples"]) + "</td></tr>"
            for c in data["errors"])
        failed = (f'<table id="errors"><tr><th>cause (first line)</th><th>side</th><th>trajectories</th>'
                  f"<th>first samples</th></tr>{rows}</table>"
                  "<p>A cause's link filters the trajectory table to it. Infrastructure failures (a dead engine or "
                  "tool server, a deadline) are not the model's doing: drop them rather than train on them as bad "
                  "answers.</p>")
    else:
        failed = '<p id="errors">No trajectory failed.</p>'
    if data["tool_errors"]:
        rows = "".join(f"<tr><td>{_e(t['tool'])}</td><td>{_e(t['error'])}</td><td>{t['count']}</td></tr>"
                       for t in data["tool_errors"])
        tools = (f"<p>Failed tool calls inside trajectories (the tool's error went back to the model):</p>"
                 f'<table id="tool-errors"><tr><th>tool</th><th>error kind</th><th>calls</th></tr>{rows}</table>')
    else:
        tools = "<p>No tool call failed.</p>"
    return failed + tools


def _options(values) -> str:
    return "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)


def trajectories_section(data: dict, max_detail_chars: int) -> str:
    rows = data["rows"]
    terminations = sorted({r["termination"] for r in rows})
    missing = len(rows) - len(data["details"])
    capped = (f'<p class="note" id="capped">Token views are embedded for the first {len(data["details"])} of '
              f"{len(rows)} trajectories (the page keeps them under {max_detail_chars:,} characters); "
              f"trajectories.parquet has all {len(rows)}.</p>" if missing else "")
    return f"""<div class="filters">
<label>reward from <input type="number" step="any" id="f-reward-min"></label>
<label>to <input type="number" step="any" id="f-reward-max"></label>
<label>termination <select id="f-termination"><option value="">any</option>{_options(terminations)}</select></label>
<label>error <select id="f-error"><option value="">any</option><option value="ok">none</option>
<option value="failed">failed</option><option value="infrastructure">infrastructure failure</option>
<option value="model">sample / model failure</option></select></label>
<label>group <input type="text" id="f-group" size="12"></label>
<label>id contains <input type="text" id="f-id" size="12"></label>
<span id="match-count"></span></div>{capped}
<div class="scroll"><table><thead><tr><th>sample</th><th>group</th><th>reward</th><th>termination</th><th>turns</th>
<th>tool calls</th><th>model / all response tokens</th><th>seconds</th><th>drift</th><th>error</th></tr></thead>
<tbody id="rows"></tbody></table></div>
<div id="selected" hidden><h3 id="sel-title"></h3><p id="sel-facts"></p><p class="error" id="sel-error"></p>
<p>Legend: <span class="model">model token (mask 1)</span> <span class="context">tool / template token
(mask 0)</span> <span class="prompt">prompt</span>. Hover a token for its id and logprob.
<span id="sel-counts"></span></p>
<div class="tokens" id="tokens"></div><h4>Messages</h4><div class="messages" id="messages"></div></div>"""


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


def write_report(record, summary: dict, codec: ChatCodec, path: Path,
                 max_detail_chars: int = MAX_DETAIL_CHARS) -> Path:
    """report.html at ``path`` and its PNG plots beside it, from the run's record, its summary and trace.jsonl."""
    out = path.parent
    trajectories = record.trajectories
    trace_path = out / "trace.jsonl"
    trace = read_trace(trace_path) if trace_path.exists() else []
    latency_plot(trace, out / "latency.png")
    rewards_plot(trajectories, out / "rewards.png")
    servers_plot(record, out / "servers.png")
    data = report_data(trajectories, trace, codec, max_detail_chars)
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>agentloop rollout report</title>
<style>{STYLE}</style></head><body>
<h1>Rollout report</h1>
<p>Written to <code>{_e(out)}</code>.</p>
<h2 id="summary">Summary</h2>{summary_section(record, summary, data)}
<h2 id="trajectories">Trajectories</h2>{trajectories_section(data, max_detail_chars)}
<h2 id="grpo-groups">GRPO groups</h2>{groups_section(data["groups"])}
<h2 id="errors-section">Errors</h2>{errors_section(data)}
<h2 id="drift">Token drift</h2>{drift_section(summary, codec)}
<h2 id="timeline-section">Timeline</h2>
<p>One row per trajectory (the table's filters apply; click a label to select it): <span class="swatch generating">
</span>generating <span class="swatch tools"></span>tools <span class="swatch interaction"></span>interaction (user
turns) <span class="swatch waiting"></span>waiting. Every phase is at least 3 pixels wide, so millisecond tool calls
stay visible; hover one for its length. <label>scale <select id="t-scale"><option value="shared">shared: seconds
since the first start</option><option value="fitted">fitted: each row its own length</option></select></label></p>
<p class="note" id="tl-note"></p><div id="timeline"></div><div class="tl-axis" id="tl-axis"></div>
<h2 id="latencies">Latencies</h2><img src="latency.png" alt="latency distributions">
<h2 id="rewards">Rewards and terminations</h2><img src="rewards.png" alt="reward distribution">
<h2 id="servers">Servers</h2><img src="servers.png" alt="per-server load and routing decisions">
<script type="application/json" id="report-data">{to_script_json(data)}</script>
<script>{SCRIPT}</script>
</body></html>
""", encoding="utf-8")
    return path
