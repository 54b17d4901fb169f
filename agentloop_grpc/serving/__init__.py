"""What every server of ours shares (engine servers and tool servers alike): start-up options, health and
reflection, the stop signal, status mapping, authentication and TLS, metrics."""
