"""``agentloop rollout``: a whole rollout from one YAML file (engines, tools, dataset, loop, outputs, report)."""
