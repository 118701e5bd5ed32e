"""The pure core: the engine, its seams, the policies and the adaptive scheduler.

Numpy and the standard library only (tests/core/test_purity.py keeps it so): no Flower, torch,
MQTT client or plotting. Time and randomness come in as inputs (a Clock, a numpy Generator),
so a virtual fleet repeats exactly and every decision can be tested on hand-made fleets.
"""
