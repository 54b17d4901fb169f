"""The data report.html embeds as JSON: one row per trajectory, token views, timeline phases, GRPO groups, errors.

Everything the page's script filters and draws is computed here once, in Python, so the page needs no network and
no server. Token views (ids, mask, logprobs, prompt, messages) are the bulk of the file: they are embedded in the
samples' order until ``max_detail_chars`` of JSON is reached, and the page says which trajectories have none.
Each distinct token id is decoded once, since thousands of trajectories reuse the same few thousand ids.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.agent.chat import ChatCodec

#: About 20 MB of token views: a browser opens that in a second or two.
MAX_DETAIL_CHARS = 20_000_000
#: Sample ids listed per error cause.
SAMPLE_IDS_PER_CAUSE = 5
#: Pictures up to this size are embedded (as data URLs) next to the conversation; larger ones are named only.
MAX_EMBEDDED_IMAGE_BYTES = 256 * 1024
#: Trace kinds drawn on the timeline, and the phase each one stands for.
PHASES = {"assistant": "generating", "tool": "tools", "user": "interaction"}


def _round(value: float, digits: int = 4) -> float:
    return round(value, digits)


def trajectory_row(t: Trajectory) -> dict[str, Any]:
    """The table row of one trajectory: what the filters and the columns need."""
    return {
        "id": t.sample_id, "group": t.group_id, "loop": t.loop, "reward": _round(t.reward),
        "termination": t.termination.value, "failed": t.failed, "infra": t.infrastructure_failure,
        "error": (t.error or "").splitlines()[0] if t.failed else "", "turns": t.assistant_turns,
        "tool_calls": t.tool_calls, "tool_errors": t.tool_errors, "malformed": t.malformed_tool_calls,
        "model_tokens": t.model_tokens, "tokens": len(t.response_ids), "total_s": _round(t.timings.total_s, 3),
        "drift": t.drift.kind if t.drift is not None else "",
    }


@dataclass
class TokenTable:
    """Each distinct token id decoded once (the page looks the text up by id)."""

    codec: ChatCodec

    def __post_init__(self) -> None:
        self.texts: dict[int, str] = {}

    def add(self, ids: tuple[int, ...]) -> None:
        for token in set(ids).difference(self.texts):
            self.texts[token] = self.codec.decode([token])


def mask_runs(mask: tuple[int, ...]) -> list[int]:
    """The mask as [first value, run length, run length, ...]: a few numbers where the mask has thousands."""
    if not mask:
        return []
    runs, count = [mask[0]], 1
    for previous, current in pairwise(mask):
        if current == previous:
            count += 1
        else:
            runs.append(count)
            count = 1
    runs.append(count)
    return runs


def trajectory_detail(t: Trajectory, prompt: int) -> dict[str, Any]:
    """The token view and conversation of one trajectory: the index of its prompt's text (GRPO groups share one),
    the response ids, the mask as runs, and the logprobs of the model tokens only (the others have none)."""
    return {
        "prompt": prompt, "ids": list(t.response_ids), "mask": mask_runs(t.response_mask),
        "logprobs": [round(lp, 3) for lp, m in zip(t.response_logprobs, t.response_mask, strict=True) if m],
        "messages": [_plain(m) for m in t.messages], "error": t.error or "",
        "images": [m.data_url() if len(m.data) <= MAX_EMBEDDED_IMAGE_BYTES else None for m in t.media],
    }


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of parts, with the parts as text: an image part as ``[image i]``, ``i``
    its index in the trajectory's media (shown under the conversation)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = "".join(part.get("text") or "" if part.get("type") != "image" else f"[image {part.get('media')}]"
                   for part in content)
    return {**message, "content": text}



def timeline(trajectories: list[Trajectory], trace: list[dict]) -> dict[str, Any]:
    """Per trajectory, its start and length and its traced phases as [phase, start, seconds, turn, tokens, server]
    with start in seconds since the trajectory began (the time between phases is waiting)."""
    phases: dict[str, list[list]] = defaultdict(list)
    started = {t.sample_id: t.timings.started_at for t in trajectories}
    for event in trace:
        phase = PHASES.get(event.get("kind", ""))
        if phase is None or event.get("sample_id") not in started:
            continue
        seconds = float(event["seconds"])
        begin = event["time"] - seconds - started[event["sample_id"]]
        phases[event["sample_id"]].append([phase, _round(max(begin, 0.0)), _round(seconds), event.get("turn", 0),
                                           len(event.get("token_ids", ())), event.get("server", "")])
    # a sample that failed before its loop started has no start time (0.0): it must not stretch the axis to 1970
    origin = min((t.timings.started_at for t in trajectories if t.timings.started_at), default=0.0)
    return {
        "rows": [{"id": t.sample_id, "start": _round(max(t.timings.started_at - origin, 0.0)),
                  "total": _round(t.timings.total_s),
                  "phases": phases.get(t.sample_id, [])} for t in trajectories],
        "traced": bool(trace),
    }


def group_stats(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Per GRPO group: size, failures, reward mean and population std of the scored (not failed) members, whether
    the rewards vary (a group whose rewards are all equal has zero advantage: no GRPO signal) and whether it is
    complete (as large as the largest group and nothing failed)."""
    members: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if t.group_id:
            members[t.group_id].append(t)
    expected = max((len(ts) for ts in members.values()), default=0)
    groups: list[dict[str, Any]] = []
    for group_id, ts in members.items():
        rewards = [t.reward for t in ts if not t.failed]
        groups.append({
            "group": group_id, "n": len(ts), "failed": len(ts) - len(rewards), "scored": len(rewards),
            "mean": _round(statistics.fmean(rewards)) if rewards else None,
            "std": _round(statistics.pstdev(rewards)) if rewards else None,
            "zero_variance": bool(rewards) and max(rewards) == min(rewards),
            "complete": len(ts) == expected and len(rewards) == len(ts),
        })
    scored = [g for g in groups if g["scored"]]
    return {
        "groups": groups, "expected_size": expected,
        "zero_variance_share": _round(sum(g["zero_variance"] for g in scored) / len(scored)) if scored else None,
        "complete_share": _round(sum(g["complete"] for g in groups) / len(groups)) if groups else None,
        "without_group": sum(not t.group_id for t in trajectories),
    }


def error_causes(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """Failed trajectories by cause (the error's first line) and by side (infrastructure or the sample/model),
    most common first, each with its first sample ids."""
    causes: dict[tuple[str, bool, str | None], list[str]] = defaultdict(list)
    for t in trajectories:
        if t.failed:
            what = (t.infrastructure_cause or "unspecified") if t.infrastructure_failure else None
            causes[((t.error or "no error recorded").splitlines()[0], t.infrastructure_failure, what)].append(
                t.sample_id)
    return [{"cause": cause, "infrastructure": infra, "what_failed": what, "count": len(ids),
             "samples": ids[:SAMPLE_IDS_PER_CAUSE]}
            for (cause, infra, what), ids in sorted(causes.items(), key=lambda item: -len(item[1]))]


def tool_errors(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """Failed tool calls by tool and error kind: the tool's (the model reads it, the trajectory goes on) or
    ``infrastructure`` (the call's trajectory failed)."""
    counts = Counter((m.tool, m.error) for t in trajectories for m in t.tool_call_metrics if m.error is not None)
    return [{"tool": tool, "error": error, "count": count} for (tool, error), count in counts.most_common()]


def report_data(trajectories: list[Trajectory], trace: list[dict], codec: ChatCodec,
                max_detail_chars: int = MAX_DETAIL_CHARS) -> dict[str, Any]:
    """Everything the page embeds; ``details`` (token views) is keyed by sample id and capped (see the module)."""
    table = TokenTable(codec)
    prompts: dict[tuple[int, ...], int] = {}
    prompt_texts: list[str] = []
    details: dict[str, str] = {}  # already JSON: its length is what the cap counts
    size = 0
    for t in trajectories:
        if t.prompt_ids not in prompts:
            prompts[t.prompt_ids] = len(prompt_texts)
            prompt_texts.append(codec.decode(t.prompt_ids))
            size += len(prompt_texts[-1])
        detail = json.dumps(trajectory_detail(t, prompts[t.prompt_ids]), ensure_ascii=False, separators=(",", ":"))
        if size + len(detail) > max_detail_chars:
            break
        details[t.sample_id] = detail
        table.add(t.response_ids)
        size += len(detail)
    return {
        "rows": [trajectory_row(t) for t in trajectories],
        "details": details,
        "prompts": prompt_texts,
        "tokens": table.texts,
        "timeline": timeline(trajectories, trace),
        "groups": group_stats(trajectories),
        "errors": error_causes(trajectories),
        "tool_errors": tool_errors(trajectories),
    }


def to_script_json(data: dict[str, Any]) -> str:
    """``data`` as JSON safe inside a <script> element (details are spliced in already serialized); ``<`` is
    escaped so no text in a trajectory can close the element."""
    details = data["details"]
    rest = json.dumps({**data, "details": {}}, ensure_ascii=False, separators=(",", ":"))
    spliced = ",".join(f"{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in details.items())
    text = rest.replace('"details":{}', '"details":{' + spliced + "}", 1)
    return text.replace("<", "\\u003c")
