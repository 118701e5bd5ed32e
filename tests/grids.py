"""A Grid stand-in for tests: delivers each message to the real ClientApp in-process."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

from edgesched.clients.app import app as client_app


class LocalGrid(Grid):
    """Nodes are {node_id: node_config}; records every message it was sent.

    A pushed message is handled at once; its reply waits to be pulled, as on Flower's grids.
    """

    def __init__(self, nodes: dict[int, dict]) -> None:
        self.nodes = nodes
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = f"m{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = msg_id
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, node_config=self.nodes[node], state=RecordDict(), run_config={})
            self._replies[msg_id] = client_app(msg, context)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def set_run(self, run_id: int) -> None: ...
    def run(self) -> None: ...
    def create_message(self, *args: object, **kwargs: object) -> None: ...
