"""The gateway side: the Flower ServerApp and its round loop (installed as edgesched.server)."""
