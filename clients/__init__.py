"""The device side: the Flower ClientApp (installed as edgesched.clients)."""
