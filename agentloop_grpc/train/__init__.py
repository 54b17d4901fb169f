"""``agentloop train``: GRPO with TRL on rollouts from our engines and tool servers (``make train``)."""
