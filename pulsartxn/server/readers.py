"""The server's readers and seeks: a reader is kept with the session's consumers (it closes,
counts and answers has_message_available and get_last_message_id as they do). Part of
``BrokerServer``."""

from __future__ import annotations

import inspect

from .. import errors
from ..client import Client
from ..messaging.consumer import Isolation, check_count
from ..messaging.message import MessageId
from ..messaging.topic_name import check_keyed_name
from . import protocol
from .sessions import create_id, room
from .streams import capped_wait


def id_fields(mid: MessageId) -> list[int]:
    """A MessageId as its five fields (the wire form of an id that may be "nothing yet")."""
    return [mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index(), mid.batch_size()]


class ReaderActions:
    """Flight actions of readers and seeks (``BrokerServer`` defines the helpers they call)."""

    def _on_seek(self, args, payload):
        """A consumer's or a reader's seek: to a MessageId (`id`) or a publish time."""
        s = self.sessions.get(args)
        c = self._consumer(s, args)
        c.seek(self._mid(args) if "id" in args else args["timestamp"])
        self.replays.forget(c)  # a call made again after the seek delivers from there
        return {}

    def _on_get_last_message_ids(self, args, payload):
        """Each partition's last readable id and its publish time (a cluster client picks
        the one published last among its brokers' answers)."""
        s = self.sessions.get(args)
        lasts = self._consumer(s, args)._lasts()
        return {"ids": [id_fields(m) for m, _ in lasts], "times": [t for _, t in lasts]}

    def _on_create_reader(self, args, payload):
        s = self.sessions.get(args)
        opts = protocol.options(args, READER_OPTIONS)
        isolation = opts.get("isolation", "READ_COMMITTED")
        if not isinstance(isolation, str) or isolation not in Isolation.__members__:
            raise ValueError(f"isolation must name an Isolation, not {errors.excerpt(isolation)}")
        start = args.get("start_time")
        if start is None:
            start = MessageId.deserialize(bytes.fromhex(args["start"]))
        elif isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start_time must be a timestamp, not {errors.excerpt(start)}")
        resume = {}
        for index, (hexid, inclusive) in (args.get("resume") or {}).items():
            resume[int(index)] = (MessageId.deserialize(bytes.fromhex(hexid)), bool(inclusive))
        room(len(s.consumers), self.sessions.limits.consumers, "consumers")
        self._serve_topic(args["topic"])
        queue = opts.get("receiver_queue_size", 1000)
        check_count("receiver_queue_size", queue, least=1)
        for key in ("reader_name", "subscription_role_prefix"):
            if opts.get(key) is not None:
                check_keyed_name(key, opts[key])
        handle = next(self._handles)
        r = s.keep(
            s.consumers,
            handle,
            lambda: s.client._reader(
                args["topic"],
                start,
                None,  # a remote reader's listener runs in the client
                queue,
                opts.get("reader_name"),
                opts.get("subscription_role_prefix"),
                bool(opts.get("start_message_id_inclusive", False)),
                Isolation[isolation],
                resume,
            ),
            create_id(args),
        )
        return {"handle": handle, "name": r.reader_name(), "topic": r.topic()}

    def _on_read_many(self, args, payload):
        """Up to max_num_messages a reader has now (a list of messages, maybe empty)."""
        s = self.sessions.get(args)
        n = args.get("max_num_messages")
        check_count("max_num_messages", n, least=1)
        reader = self._consumer(s, args)
        return self.replays.run(
            reader,
            args,
            lambda: [protocol.encode_message(m) for m in reader._read_many(n)],
            "read_many",
        )

    def _on_read_next(self, args, payload):
        s = self.sessions.get(args)
        wait = capped_wait(args.get("timeout_millis"), self.max_wait_ms)
        reader = self._consumer(s, args)
        with self.sessions.waiting(s):
            return self.replays.run(
                reader, args, lambda: protocol.encode_message(reader.read_next(wait)), "read_next"
            )


# The embedded client's signature is the list, but for what cannot travel.
READER_OPTIONS = frozenset(inspect.signature(Client.create_reader).parameters) - {
    "self",
    "topic",
    "start_message_id",
    "reader_listener",
    "is_read_compacted",
}
