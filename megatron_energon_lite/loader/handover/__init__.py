"""The hand-over of items from the loader's worker processes to the main process.

- ``slabs.py``: tensors (and bundles of pickles) through rings of shared-memory slabs.
- ``bundles.py``: several small items per message from a worker, handed out in torch's turns.
- ``queues.py``: workers write their messages to the pipe themselves.

What a worker sends (the carrier: an item pickled with its state) is ``loader/streams.py``'s.
"""
