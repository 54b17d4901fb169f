"""verl integration (the ``verl`` extra; tested with verl 0.9.1): verl's trainer and agent loops on agentloop.v1
engines, selected by verl's own config keys (no verl file is patched).

Engine level (verl's loops unchanged):
  - ``rollout.name=agentloop``: our rollout replica (``replica.py``, registered by the ``verl.plugins`` entry
    point, ``plugin.py``) launches one engine server per replica behind a Ray actor verl's balancer and client call
    (``server_actor.py``); verl's wake_up / sleep / abort / resume / cache calls map onto EngineControl; in hybrid
    mode verl's in-trainer rollout handle is ``rollout_adapter.py``;
  - ``checkpoint_engine.backend=agentloop`` (``custom_backend_module``: ``checkpoint_engine.py``) with
    ``checkpoint_manager_class`` (``checkpoint_manager.py``): verl's weights reach the servers by our transfer;
  - ``agent.agent_loop_manager_class=...loops_manager...``: verl's loops on ``AgentloopLLMClient`` (``client.py``,
    verl's ``LLMServerClient`` over our Router; ``sampling.py`` maps verl's sampling dict; ``picture_spans.py`` finds
    where verl's pictures sit in its prompt ids, so they go as media).
Loop level (our loops inside verl's trainer): ``agent.agent_loop_manager_class=...manager...`` reads verl's dataset
columns, runs our agent loops and returns verl's agent-loop batch (``batch.py``); verl's tool YAML runs in our tool
server (``tools.py``). Tool level (verl's loops unchanged): ``remote_tool.py``'s ``ToolExecuteTool``, named in verl's
tool YAML, runs a tool on a ToolExecute server. Our settings live under ``rollout.custom.agentloop`` (``settings.py``).
"""

from .sampling import sampling_from_verl

__all__ = ["sampling_from_verl"]
