"""Flower's Grid without Ray: the ClientApp runs in this process, one message at a time.

Ray takes 10-20 s to start and a worker process per core; a virtual fleet's run of a round
or two, a debugging session (plain tracebacks, one process) or a CI job spends most of its
time waiting for it. The virtual transport times every job on the virtual clock and sends the
real work to a few executor nodes in a fixed order, so what trains it changes neither the
results nor the bytes, only how long the run takes on the wall clock (one core here against
all of them under Ray).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    """Nodes are {node_id: node_config}. A pushed message is handled at once by the real
    ClientApp; its reply waits to be pulled, as on Flower's grids."""

    def __init__(self, nodes: dict[int, dict]) -> None:
        from edgesched.clients.app import app

        self.nodes = nodes
        self._client_app = app
        self._pushed = 0
        self._replies: dict[str, Message] = {}

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self._pushed += 1
            msg_id = f"m{self._pushed}"
            msg.metadata.__dict__["_message_id"] = msg_id  # Flower's grids stamp the id as they store it
            node = msg.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, node_config=self.nodes[node], state=RecordDict(), run_config={})
            self._replies[msg_id] = self._client_app(msg, context)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def set_run(self, run_id: int) -> None:
        """One run per grid: nothing to switch."""

    @property
    def run(self) -> None:
        return None

    def create_message(self, *args: object, **kwargs: object) -> Message:
        raise NotImplementedError("build Message objects directly")


def run_in_process(main: Callable[[Grid, Context], None], num_nodes: int, threads: int) -> None:
    """Run a ServerApp main function against `num_nodes` in-process nodes, torch on `threads`
    threads: as many as Ray gives each worker, so the floating-point sums, and the bytes, match."""
    import torch

    torch.set_num_threads(threads)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0  # what Flower's runtime sets
    grid = InProcessGrid({node: {} for node in range(1, num_nodes + 1)})
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
