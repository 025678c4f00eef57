"""Editor plugin configurations and the background service."""
