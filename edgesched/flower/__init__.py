"""The Flower adapter: the engine over Flower's Grid (Message API), on a gateway and on Flower's
simulation engine; the message contract the ClientApp answers."""
