"""The gateway side: the Flower ServerApp, its telemetry and its checkpoint (installed as edgesched.server)."""
