"""Virtual fleets on one machine (installed as edgesched.simulations)."""
