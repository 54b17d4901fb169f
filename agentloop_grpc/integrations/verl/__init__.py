"""verl integration (the ``verl`` extra; tested with verl 0.9.1): verl's agent loops on agentloop.v1 engines.

```python
client = AgentloopLLMClient(config, servers=["127.0.0.1:50051"])   # verl's LLMServerClient, over our Router
output = await SingleTurnAgentLoop(..., server_manager=client, ...).run(sampling_params, raw_prompt=messages)
```
"""

from .sampling import sampling_from_verl

__all__ = ["sampling_from_verl"]
