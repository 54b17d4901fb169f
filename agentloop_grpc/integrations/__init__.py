"""Integrations with trainers people already use: each maps the trainer's prompts to Samples, trajectories to the
trainer's fields, and the trainer's optimizer step to a weight push (ARCHITECTURE.md, "Trainers")."""
