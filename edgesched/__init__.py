"""edgesched: federated training for heterogeneous fleets of edge devices.

The pure scheduling core (partitioning, aggregation, configuration) imports only numpy and
the standard library, so it runs and is tested without Flower, MQTT or torch. Torch, Flower
and Ray live in adapter modules that are imported only when they are used.
"""

__version__ = "0.1.0"
