"""Coding agents as they are: an unmodified CLI (Codex, Claude Code, mini-swe-agent, a command of yours) per
trajectory, in a sandboxed workspace holding the task's repository, its model calls through the trajectory's gateway
session, its reward from the task's hidden tests run afterwards in a fresh sandbox (docs/coding-agents.md)."""
