"""report.html from real trajectories (the tool loop against a scripted fake engine on loopback, the real tokenizer
and built-in tools, a real trace), rendered by headless Chromium: the URL hash drives the filters and the selected
trajectory, and the DOM after the page's script ran is checked against a recompute from the trajectories."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import statistics
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from agentloop_grpc.agent import AgentLoopConfig, Sample
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.agent.tracing import JsonlTracer
from agentloop_grpc.agent.worker import AgentLoopWorker
from agentloop_grpc.rollout.report import write_report
from agentloop_grpc.rollout.run import RunRecord, summarize

from ..agent.conftest import call, loop_context

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SYSTEM = {"role": "system", "content": "Be brief. </script><b>"}  # text that must not end the page's data
TOO_LONG = "Explain, at length, " * 30  # past max_prompt_tokens: these samples fail (the sample's fault)


def _model():
    """The scripted model: a calculator call first, then an answer that is right for 2+3, wrong for 4+4, and
    alternately right and wrong for 1+1 (one group with reward variance, two without); it breaks on 7+7."""
    answers_1_1 = itertools.cycle(["2", "3"])

    def reply(text: str) -> str:
        if "What is 7 + 7?" in text:
            raise RuntimeError("the engine broke")  # a failure on the engine's side: an INTERNAL status
        if "<tool_response>" not in text:
            return call("calculator", expression="+".join(re.findall(r"What is (\d) \+ (\d)\?", text)[-1]))
        if "What is 2 + 3?" in text:
            return call("check_answer", answer="5")
        if "What is 4 + 4?" in text:
            return call("check_answer", answer="9")
        return call("check_answer", answer=next(answers_1_1))

    return reply


def _samples() -> list[Sample]:
    questions = {"a": ("What is 2 + 3?", "5"), "b": ("What is 4 + 4?", "8"), "c": ("What is 1 + 1?", "2"),
                 "d": (TOO_LONG + "What is 1 + 1?", "2"), "e": ("What is 7 + 7?", "14")}
    return [Sample(sample_id=f"{group}-{i}", group_id=group, messages=(SYSTEM, {"role": "user", "content": question}),
                   tools_kwargs={"check_answer": {"ground_truth": truth}}, ground_truth=truth)
            for group, (question, truth) in questions.items() for i in range(4)]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("report")
    codec = load_codec(None)
    tracer = JsonlTracer(out / "trace.jsonl")

    async def rollout():
        async with loop_context(codec, _model(), AgentLoopConfig(max_prompt_tokens=450), tracer=tracer) as (
                _, loops, _s):
            return await AgentLoopWorker(loops).run(_samples())

    import asyncio

    started = time.monotonic()
    trajectories = asyncio.run(rollout())
    tracer.close()
    record = RunRecord(output_dir=out, trajectories=trajectories, servers=["127.0.0.1:1"],
                       wall_s=time.monotonic() - started)
    record.metrics = RolloutMetrics.of(trajectories, record.wall_s)
    return write_report(record, summarize(record), codec, out / "report.html"), trajectories


class _Dom(HTMLParser):
    """Text of the elements with an id, and the rows of the trajectory table and token view (class counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []
        self.text: dict[str, str] = {}
        self.row_ids: list[str] = []
        self.classes: dict[str, int] = {}
        self.in_tokens = 0
        self.raw = ""  # the whole page as rendered, for what the parser does not collect

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and self.stack and "rows" in self.stack:
            self.row_ids.append(attrs["data-id"])
        if "tokens" in self.stack and tag == "span":
            self.classes[attrs.get("class")] = self.classes.get(attrs.get("class"), 0) + 1
        self.stack.append(attrs.get("id"))
        if attrs.get("id"):
            self.text.setdefault(attrs["id"], "")

    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        for element in self.stack:
            if element:
                self.text[element] = self.text.get(element, "") + data


def _render(page: Path, fragment: str) -> _Dom:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: run `make browser` (Debian's chromium package)")
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          f"{page.as_uri()}#{fragment}"], capture_output=True, text=True, timeout=60, check=True)
    parsed = _Dom()
    parsed.feed(dom.stdout)
    parsed.raw = dom.stdout
    return parsed


def test_selected_trajectory_shows_its_tokens_with_the_mask(report):
    page, trajectories = report
    chosen = next(t for t in trajectories if t.sample_id == "c-1")
    dom = _render(page, "select=c-1")
    model = sum(chosen.response_mask)
    assert model and len(chosen.response_ids) > model  # two assistant turns with a tool response between
    assert dom.classes == {"prompt": 1, "model": model, "context": len(chosen.response_ids) - model}
    assert dom.text["count-model"] == str(model) and dom.text["count-context"] == str(len(chosen.response_ids) - model)
    assert dom.text["sel-title"] == "c-1 (group c)"
    assert "calculator" in dom.text["messages"] and "tool (calculator)" in dom.text["messages"]
    assert SYSTEM["content"] in dom.text["messages"]
    assert dom.row_ids == [t.sample_id for t in trajectories]  # no filter: every trajectory is a row


def test_filters_reduce_the_rows(report):
    page, trajectories = report
    failed = _render(page, "error=failed&select=d-0")
    expected = [f"{g}-{i}" for g in "de" for i in range(4)]
    assert failed.row_ids == [t.sample_id for t in trajectories if t.failed] == expected
    assert "more than max_prompt_tokens=450" in failed.text["sel-error"]
    assert failed.classes == {}  # a prompt that never ran has no tokens
    cause = next(t.error for t in trajectories if t.sample_id == "e-0")
    by_cause = _render(page, urlencode({"cause": cause}, quote_via=quote))
    assert by_cause.row_ids == [f"e-{i}" for i in range(4)]
    right = _render(page, "rmin=1&termination=stop&group=c&scale=fitted")
    assert right.row_ids == [t.sample_id for t in trajectories
                             if t.reward >= 1 and t.termination.value == "stop" and t.group_id == "c"]
    assert right.text["match-count"].startswith(f"{len(right.row_ids)} of 20 ")
    assert 0 < len(right.row_ids) < 4
    # the timeline follows the filters; the fitted scale gives each row its own trajectory's length
    assert len(re.findall(r'class="tl-row"', right.raw)) == len(right.row_ids)
    assert "each row: its own trajectory's length" in right.text["tl-axis"]


def test_group_statistics_errors_and_timeline(report):
    page, trajectories = report
    dom = _render(page, "")
    for group in "abcde":
        members = [t for t in trajectories if t.group_id == group]
        rewards = [t.reward for t in members if not t.failed]
        row = re.search(rf'<tr data-group="{group}">(.*?)</tr>', dom.raw).group(1)
        cells = dict(re.findall(r'<td class="(\w+)">([^<]*)</td>', row))
        assert cells["n"] == str(len(members)) and cells["failed"] == str(len(members) - len(rewards))
        assert cells["mean"] == (str(round(statistics.fmean(rewards), 4)) if rewards else "")
        assert cells["std"] == (str(round(statistics.pstdev(rewards), 4)) if rewards else "")
        assert cells["zero"] == ("yes" if rewards and len(set(rewards)) == 1 else "no")
    assert sorted(t.reward for t in trajectories if t.group_id == "c") == [0.0, 0.0, 1.0, 1.0]
    assert dom.text["zero-variance-share"] == "66.7%"  # a and b of a, b, c (d and e have no scored member)
    assert dom.text["complete-share"] == "60.0%"  # d's and e's members failed
    causes = re.findall(r'<td class="cause"><a [^>]*>([^<]*)</a></td><td class="side">([^<]*)</td>'
                        r'<td class="count">(\d+)</td>', dom.raw)
    assert [(side, count) for _, side, count in causes] == [("sample / model", "4")] * 2
    assert "more than max_prompt_tokens=450" in causes[0][0] + causes[1][0]
    assert "RuntimeError: the engine broke" in causes[0][0] + causes[1][0]
    # the timeline: one labelled row per trajectory, each traced tool phase drawn as its own bar
    assert re.findall(r'<div class="tl-label"[^>]*>([^<]*)</div>', dom.raw) == [t.sample_id for t in trajectories]
    traced = [json.loads(line)["kind"] for line in (page.parent / "trace.jsonl").read_text().splitlines()]
    assert dom.raw.count('class="tl-phase tools"') == traced.count("tool") > 0
    assert dom.raw.count('class="tl-phase generating"') == traced.count("assistant") > 0
    # the shared scale spans the run, not the time since 1970 (samples that failed before starting have no start)
    runs = [t for t in trajectories if t.timings.started_at]
    span = max(t.timings.started_at + t.timings.total_s for t in runs) - min(t.timings.started_at for t in runs)
    assert float(dom.text["tl-axis"].split("(first start)")[1].removesuffix(" s")) == pytest.approx(span, abs=0.01)


def test_a_capped_page_says_which_trajectories_have_no_token_view(report, tmp_path):
    _page, trajectories = report
    codec = load_codec(None)
    record = RunRecord(output_dir=tmp_path, trajectories=trajectories)
    record.metrics = RolloutMetrics.of(trajectories, 1.0)
    small = write_report(record, summarize(record), codec, tmp_path / "report.html", max_detail_chars=3000)
    text = small.read_text()
    assert re.search(r"Token views are embedded for the first [1-9] of 20 trajectories", text)
    dom = _render(small, "select=e-3")
    assert "No token view embedded" in dom.text["sel-counts"] and dom.classes == {}


def test_a_trajectorys_pictures_are_shown_with_its_conversation(tmp_path):
    """A tool's picture: the message names it ``[image 0]`` and the page shows it; one too large to embed is named."""
    from agentloop_grpc.agent.trajectory import Termination, Trajectory
    from agentloop_grpc.common.media import MediaInput
    from agentloop_grpc.rollout import report_data

    from ..multimodal.pictures import png

    small, large = png((255, 0, 0)), b"x" * (report_data.MAX_EMBEDDED_IMAGE_BYTES + 1)
    messages = ({"role": "user", "content": "Draw."}, {"role": "assistant", "content": "ok"},
                {"role": "tool", "name": "draw", "content": [{"type": "text", "text": "a red square"},
                                                             {"type": "image", "media": 0},
                                                             {"type": "image", "media": 1}]})
    t = Trajectory(sample_id="pic", loop="tool", prompt_ids=(1, 2), response_ids=(3, 4, 5, 6, 7, 8),
                   response_mask=(1, 0, 0, 0, 0, 1), response_logprobs=(-0.5, 0, 0, 0, 0, -0.1),
                   weight_versions=(0, -1, -1, -1, -1, 0), reward=0.0, termination=Termination.STOP,
                   messages=messages,
                   media=(MediaInput("image/png", small, 3, 2), MediaInput("image/png", large, 5, 1)))
    record = RunRecord(output_dir=tmp_path, trajectories=[t])
    record.metrics = RolloutMetrics.of([t], 1.0)
    page = write_report(record, summarize(record), load_codec(None), tmp_path / "report.html")
    dom = _render(page, "select=pic")
    assert "a red square[image 0][image 1]" in dom.text["messages"]
    assert "image 1 (too large to embed)" in dom.text["messages"]
    pictures = re.findall(r'<img src="(data:image/png;base64,[^"]+)" class="picture">', dom.raw)
    assert len(pictures) == 1 and base64.b64decode(pictures[0].split(",", 1)[1]) == small
