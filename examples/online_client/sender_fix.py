"""msprobe 8.1.2's TCP client shares one twisted FileSender across its transfers and begins each from its
sending thread: if it begins one between the reactor thread's `deferred.callback()` and `deferred = None`
(FileSender.resumeProducing), that transfer's Deferred never fires, its sending thread waits for it for ever and
the log says `send_queue put send_data timeout` every 60 s. Nothing the receiving side sends can fire it; a
FileSender per transfer avoids the race. Call `one_file_sender_per_transfer()` before msprobe starts its client
(train.py does; so does the project's own test client).
"""


def one_file_sender_per_transfer():
    from msprobe.pytorch.api_accuracy_checker.tensor_transport_layer import client as msprobe_client
    from twisted.protocols.basic import FileSender

    send_large_data = msprobe_client.ClientProtocol.send_large_data

    def with_own_file_sender(self, data):
        self.file_sender = FileSender()
        self.file_sender.CHUNK_SIZE = 655360  # msprobe's own
        return send_large_data(self, data)

    msprobe_client.ClientProtocol.send_large_data = with_own_file_sender
