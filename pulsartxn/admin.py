"""Admin and stats (API.md, "Admin and stats"); transaction views come with their issues."""

from __future__ import annotations


class Admin:
    def __init__(self, broker) -> None:
        self._broker = broker

    def topic_stats(self, topic: str) -> dict:
        """Messages and bytes in and out, storage size, and backlog per subscription."""
        full, partitions = self._broker._resolve(topic, create=False)
        out = {
            "topic": full,
            "partitions": len(partitions) if len(partitions) > 1 or partitions[0].index >= 0 else 0,
            "msg_in": 0,
            "bytes_in": 0,
            "msg_out": 0,
            "bytes_out": 0,
            "entries": 0,
            "messages": 0,
            "storage_size": 0,
            "subscriptions": {},
        }
        subs: dict[str, dict] = out["subscriptions"]
        for part in partitions:
            out["msg_in"] += part.msg_in
            out["bytes_in"] += part.bytes_in
            out["msg_out"] += part.msg_out
            out["bytes_out"] += part.bytes_out
            out["entries"] += part.next_entry_id - part.first_entry_id
            out["messages"] += part.total_messages
            out["storage_size"] += part.storage_size()
            for name, sub in list(part.subscriptions.items()):
                s = sub.stats()
                agg = subs.setdefault(
                    name,
                    {
                        "backlog": 0,
                        "consumers": 0,
                        "unacked": 0,
                        "msg_out": 0,
                        "bytes_out": 0,
                        "type": s["type"],
                    },
                )
                for k in ("backlog", "consumers", "unacked", "msg_out", "bytes_out"):
                    agg[k] += s[k]
                agg["type"] = agg["type"] or s["type"]
        return out
