"""The session gateway: OpenAI Chat Completions / Responses and Anthropic Messages over the Router, one base URL per
session, every conversation recorded as token-exact trajectories (docs/gateway.md)."""
