"""The live progress display of a rollout (rich): trajectories done/total, turns, tokens/s, tool calls, failures,
reward so far; and the summary table at the end. On a terminal that is not interactive it prints a line every
few finished trajectories instead of redrawing."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentloop_grpc.agent import Trajectory
from agentloop_grpc.agent.trajectory import DRIFT_MEANING


def drift_line(summary: dict) -> str:
    """How many trajectories depart from a fresh render, per kind with what the kind means."""
    kinds = summary.get("drift", {})
    parts = [f"{kind} {entry['count']}" + (f" ({DRIFT_MEANING[kind]})" if entry["count"] else "")
             for kind, entry in kinds.items()]
    return f"{summary['drifted_trajectories']}" + (f": {'; '.join(parts)}" if parts else "")


class Progress:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.total = 0
        self.done = 0
        self.turns = 0
        self.tokens = 0
        self.tool_calls = 0
        self.tool_errors = 0
        self.failures = 0
        self.reward = 0.0
        self.started = 0.0
        self._live: Live | None = None
        self._printed = 0

    def status(self, text: str) -> None:
        self.console.print(f"[dim]{text}...[/dim]")

    def start(self, total: int) -> None:
        self.total, self.started = total, time.monotonic()
        if self.console.is_terminal:
            self._live = Live(self._table(), console=self.console, refresh_per_second=4, transient=True)
            self._live.start()

    def advance(self, t: Trajectory) -> None:
        self.done += 1
        self.turns += t.assistant_turns
        self.tokens += t.model_tokens
        self.tool_calls += t.tool_calls + t.malformed_tool_calls
        self.tool_errors += t.tool_errors
        self.failures += t.failed
        self.reward += t.reward
        if self._live is not None:
            self._live.update(self._table())
        elif self.done - self._printed >= max(1, self.total // 10) or self.done == self.total:
            self._printed = self.done
            self.console.print(self._line())

    def _rates(self) -> tuple[float, float]:
        elapsed = max(1e-9, time.monotonic() - self.started)
        return elapsed, self.tokens / elapsed

    def _line(self) -> str:
        elapsed, rate = self._rates()
        return (f"{self.done}/{self.total} trajectories, {self.turns} turns, {rate:.1f} model tokens/s, "
                f"{self.tool_calls} tool calls ({self.tool_errors} errors), {self.failures} failed, "
                f"{elapsed:.0f} s")

    def _table(self) -> Table:
        elapsed, rate = self._rates()
        table = Table(title="rollout", show_header=False)
        table.add_row("trajectories", f"{self.done}/{self.total}")
        table.add_row("assistant turns", str(self.turns))
        table.add_row("model tokens/s", f"{rate:.1f}")
        table.add_row("tool calls (errors)", f"{self.tool_calls} ({self.tool_errors})")
        table.add_row("failed", str(self.failures))
        table.add_row("mean reward so far", f"{self.reward / self.done:.3f}" if self.done else "-")
        table.add_row("elapsed", f"{elapsed:.0f} s")
        return table

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def summary(self, summary: dict, output_dir: str, report: bool = True) -> None:
        table = Table(title="rollout summary", show_header=False)
        for key in ("trajectories", "wall_s", "mean_reward", "correct_answers_rate", "valid_tool_calls_rate",
                    "tool_call_attempts", "mean_assistant_turns", "model_tokens", "model_tokens_per_s", "failures",
                    "infrastructure_failures", "sticky_share", "slowest_s"):
            table.add_row(key.replace("_", " "), str(summary[key]))
        table.add_row("terminations", ", ".join(f"{k} {v}" for k, v in sorted(summary["terminations"].items())))
        table.add_row("drifted trajectories", drift_line(summary))
        self.console.print(table)
        if report:
            self.console.print(f"report: {output_dir}/report.html")
