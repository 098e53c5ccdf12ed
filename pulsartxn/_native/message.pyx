# cython: language_level=3
"""A received message (API.md: ``Message``), native: the dispatch loop
(``dispatch.take_buffered``) fills its fields in C, where a Python class cost a call of its
``__init__`` per message. Its fields are declared in message.pxd, for dispatch to cimport.
The twin is ``reference/message.py``.
"""

# pulsartxn.messaging.message.MessageId, imported when first needed: that module imports
# this package (for Message), so no module of it can import MessageId while the package loads.
# outcome.pyx cimports this getter.
cdef object MessageId = None


cdef object message_id_type():
    global MessageId
    if MessageId is None:
        from pulsartxn.messaging.message import MessageId as found
        MessageId = found
    return MessageId


cdef class Message:
    """A received message. Its id may be given as the five fields of a MessageId (a tuple):
    the MessageId is then made when first asked for."""

    def __init__(self, data, properties, key, message_id, topic, publish_time,
                 redelivery_count=0, txn=None):
        self._data = data
        self._properties = properties
        self._key = key
        self._id = message_id
        self._topic = topic
        self._publish_time = publish_time
        self._redelivery_count = redelivery_count
        self._txn = txn

    def data(self):
        return self._data

    def value(self):
        return self._data

    def properties(self):
        return dict(self._properties) if self._properties else {}

    def partition_key(self):
        return self._key

    def message_id(self):
        mid = self._id
        if type(mid) is tuple:
            # Delivered with the id's fields: made on first use (most messages never are).
            mid = self._id = message_id_type()(*mid)
        return mid

    def topic_name(self):
        return self._topic

    def publish_timestamp(self):
        return self._publish_time

    def redelivery_count(self):
        return self._redelivery_count

    def __repr__(self):
        return f"Message(topic={self._topic!r}, id={self.message_id()!r}, {len(self._data)} bytes)"
