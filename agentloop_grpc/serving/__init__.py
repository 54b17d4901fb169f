"""What every server of ours shares (engine servers and tool servers alike): authentication and TLS."""
