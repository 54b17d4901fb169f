"""Integrations with trainers people already use: each maps the trainer's prompts to Samples, trajectories to the
trainer's fields, and the trainer's optimizer step to a weight push (docs/trl.md, docs/verl.md; their status in
docs/architecture.md)."""
