"""ToolExecute servers and built-in tools.

A tool instance lives for one trajectory. A failure of the tool's work comes back as a normal result marked as a
tool error (the model reads it); a failure of the infrastructure is a gRPC status, raised by the client as
ToolInfrastructureError so the trajectory can be excluded from training.
"""
