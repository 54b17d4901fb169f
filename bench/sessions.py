"""The multi-turn chat sessions the prefix-cache benchmarks replay: each session opens with its own question, and
every later turn appends the model's reply and a follow-up question, so a turn's prompt extends the previous one."""

from __future__ import annotations


def opening(tokenizer, index: int) -> list[int]:
    """Session ``index``'s first prompt, with the generation prompt."""
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Session {index}: let us talk about the number {index}."}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
    )


def next_prompt(tokenizer, prompt: list[int], reply: list[int], index: int, turn: int) -> list[int]:
    """The prompt of turn ``turn + 1``: this turn's prompt and reply, then the follow-up question."""
    follow_up = f"<|im_end|>\n<|im_start|>user\nTurn {turn + 1}: tell me more about {index}.<|im_end|>\n"
    return prompt + reply + tokenizer.encode(follow_up + "<|im_start|>assistant\n")
