"""A Grid stand-in for tests: delivers each message to the real ClientApp in-process."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

from edgesched.clients.app import app as client_app


class LocalGrid(Grid):
    """Nodes are {node_id: node_config}; records every message it was sent."""

    def __init__(self, nodes: dict[int, dict]) -> None:
        self.nodes = nodes
        self.sent: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        replies = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, node_config=self.nodes[node], state=RecordDict(), run_config={})
            replies.append(client_app(msg, context))
        return replies

    def set_run(self, run_id: int) -> None: ...
    def run(self) -> None: ...
    def create_message(self, *args: object, **kwargs: object) -> None: ...
    def push_messages(self, messages: Iterable[Message]) -> None: ...
    def pull_messages(self, message_ids: Iterable[str]) -> None: ...
