"""Run in msprobe 8.1.2's virtualenv (it needs twisted; tests/test_online_msprobe.py runs it).

msprobe 8.1.2's TCP client shares one twisted FileSender across its transfers and begins each from its sending
thread, which then polls the transfer's Deferred. If it begins transfer k+1 between the reactor thread's
`self.deferred.callback(...)` and `self.deferred = None` in FileSender.resumeProducing, the new transfer's
Deferred is overwritten and never fires. The interleaving is reproduced deterministically: a callback on
transfer k's Deferred begins transfer k+1, which is what the polling thread does when it runs at that moment.
"""
from __future__ import annotations

import io
from typing import Any

from twisted.protocols.basic import FileSender


class Consumer:
    """The transport's side of a pull producer, as twisted's FileDescriptor does it."""

    producer: Any = None

    def registerProducer(self, producer: Any, streaming: bool) -> None:  # noqa: N802 - twisted's interface
        assert self.producer is None, "producer never unregistered"
        self.producer = producer
        if not streaming:
            producer.resumeProducing()

    def unregisterProducer(self) -> None:  # noqa: N802
        self.producer = None

    def write(self, data: bytes) -> None:
        pass


def run(fresh_sender: bool) -> bool:
    """Whether transfer k+1's Deferred fires."""
    consumer, shared = Consumer(), FileSender()

    def sender() -> Any:
        return FileSender() if fresh_sender else shared

    box: dict[str, Any] = {}
    first = sender()
    done = first.beginFileTransfer(io.BytesIO(b"frame k"), consumer)
    done.addCallback(lambda _: box.setdefault("next", sender().beginFileTransfer(io.BytesIO(b"frame k+1"), consumer)))
    first.resumeProducing()  # reactor thread: frame k flushed, EOF -> callback -> the sending thread begins k+1
    consumer.producer.resumeProducing()  # reactor thread: frame k+1 flushed, EOF
    return bool(box["next"].called)


print("SHARED", run(False))  # msprobe 8.1.2's one FileSender: False, its sending thread would wait for ever
print("FRESH", run(True))  # a FileSender per transfer (examples/online_client/sender_fix.py): True
