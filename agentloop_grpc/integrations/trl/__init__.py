"""TRL integration: GRPOTrainer learns from agentloop-grpc rollouts (the ``trl`` extra; tested with trl 1.16.0).

```python
with AgentLoopRollout(spec, rows) as rollout:
    trainer = GRPOTrainer(model, reward_funcs=[agentloop_reward], args=GRPOConfig(...),
                          train_dataset=prompt_dataset(rows), rollout_func=rollout,
                          callbacks=[WeightSyncCallback(rollout)])
    trainer.train()
```
"""

from .async_rollout import AsyncAgentLoopRollout
from .callback import WeightSyncCallback
from .fields import agentloop_reward, trl_fields
from .rollout import TESTED_TRL_VERSION, AgentLoopRollout, StepRecord, prompt_dataset, prompt_key
from .weights import model_tensors, train_top_layers

__all__ = [
    "TESTED_TRL_VERSION", "AgentLoopRollout", "AsyncAgentLoopRollout", "StepRecord", "WeightSyncCallback",
    "agentloop_reward", "model_tensors", "prompt_dataset", "prompt_key", "train_top_layers", "trl_fields",
]
