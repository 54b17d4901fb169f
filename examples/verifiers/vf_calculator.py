"""A small verifiers 0.4 environment (docs/environments.md): arithmetic questions, a calculator (add, subtract,
multiply) served over MCP by a ``vf.Toolset``, and an exact-match reward. Its taskset id is this module's name,
``vf_calculator``: put this folder on PYTHONPATH (or make it a package and install it), as verifiers finds an
Environments Hub package by its name."""

import verifiers.v1 as vf

QUESTIONS = [("What is 17 * 23?", "391"), ("What is 12 + 30?", "42"), ("What is 9 * 9?", "81"),
             ("What is 100 - 37?", "63")]


class Calculator(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @vf.tool
    async def subtract(self, a: int, b: int) -> int:
        """Subtract b from a."""
        return a - b

    @vf.tool
    async def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


class QuestionData(vf.TaskData):
    answer: str


class QuestionTask(vf.Task[QuestionData]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))


class Questions(vf.Taskset[QuestionTask, vf.TasksetConfig]):
    def load(self):
        for prompt, answer in QUESTIONS:
            yield QuestionTask(QuestionData(prompt=prompt, answer=answer), self.config.task)


__all__ = ["Questions"]

if __name__ == "__main__":
    Calculator.run()  # verifiers starts the tool server as `python -m vf_calculator`
