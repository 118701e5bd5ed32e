"""A Grid for tests: the product's in-process grid, recording every message it was sent."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message

from edgesched.simulations.in_process import InProcessGrid


class LocalGrid(InProcessGrid):
    """Nodes are {node_id: node_config}; `sent` lists every message pushed, in order."""

    def __init__(self, nodes: dict[int, dict]) -> None:
        super().__init__(nodes)
        self.sent: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        self.sent += messages
        return super().push_messages(messages)
