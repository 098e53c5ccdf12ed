"""``pulsartxn admin``: a running server's admin calls from the shell, in pulsar-admin's
groups, spellings and flags (docs/operations.md, "pulsartxn admin"). JSON on stdout by
default, one document per command; ``--format table`` for people. A command that changes
something prints nothing (as pulsar-admin) unless it has something to say (skip: the count)."""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

from pulsartxn import Client
from pulsartxn.client_cli import read_secret
from pulsartxn.remote.options import check_seconds

DEFAULT_URL = "pulsartxn://127.0.0.1:6650"
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdwy]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def relative_ms(text: str) -> float:
    """A relative time as pulsar-admin writes it (10s, 5m, 3h, 2d, 1w, 1y; bare: seconds), in
    milliseconds."""
    found = _RELATIVE.match(text.strip())
    if found is None:
        raise ValueError(f"a time is a number and one of s, m, h, d, w, y (e.g. 10m), not {text!r}")
    return float(found.group(1)) * _UNIT_S[found.group(2)] * 1000.0


def _txn(args: argparse.Namespace) -> str:
    """The transaction of -m/-l (pulsar-admin's most and least significant bits) or --txn-id."""
    if args.txn_id is not None:
        if args.most_sig_bits is not None or args.least_sig_bits is not None:
            raise ValueError("give --txn-id or -m/-l, not both")
        return args.txn_id
    if args.most_sig_bits is None or args.least_sig_bits is None:
        raise ValueError("the transaction: -m/--most-sig-bits and -l/--least-sig-bits, or --txn-id")
    return f"{args.most_sig_bits}:{args.least_sig_bits}"


# Each action: (group, action) -> what it asks of client.admin (or the client).
def _topics(admin, client, a) -> Any:
    if a.action == "create":
        return client.create_topic(a.topic, a.partitions)
    if a.action == "list":
        rows = admin.list_topics()
        if a.namespace is not None:
            prefix = f"persistent://{a.namespace.strip('/')}/"
            rows = [r for r in rows if r["topic"].startswith(prefix)]
        return rows
    if a.action == "delete":
        return admin.delete_topic(a.topic, a.force)
    if a.action == "stats":
        return admin.topic_stats(a.topic)
    return admin.partitioned_stats(a.topic, a.per_partition)


def _subscriptions(admin, client, a) -> Any:
    if a.action == "list":
        return admin.list_subscriptions(a.topic)
    if a.action == "create":
        return admin.create_subscription(a.topic, a.subscription, a.position)
    if a.action == "delete":
        return admin.delete_subscription(a.topic, a.subscription, a.force)
    if a.action == "reset-cursor":
        if (a.time is None) == (a.message_id is None):
            raise ValueError("reset-cursor needs one of -t/--time and -m/--messageId")
        if a.time is not None:
            position: Any = int(time.time() * 1000 - relative_ms(a.time))
        else:
            position = a.message_id
        return admin.reset_cursor(a.topic, a.subscription, position)
    if a.action == "skip":
        return {"skipped": admin.skip(a.topic, a.subscription, a.count)}
    if a.action == "clear-backlog":
        return admin.clear_backlog(a.topic, a.subscription)
    return admin.peek(a.topic, a.subscription, a.count)


def _transactions(admin, client, a) -> Any:
    action = a.action
    if action == "coordinator-stats":
        if a.coordinator_id is not None:
            return admin.coordinator_stats(a.coordinator_id)
        ids = [c["coordinator_id"] for c in admin.coordinators()]
        return {str(i): admin.coordinator_stats(i) for i in ids}
    if action == "transaction-metadata":
        return admin.transaction_metadata(_txn(a))
    if action == "slow-transactions":
        rows = admin.slow_transactions(relative_ms(a.time))
        if a.coordinator_id is not None:
            rows = [r for r in rows if str(r.get("txn_id", "")).startswith(f"{a.coordinator_id}:")]
        return rows
    if action == "transaction-buffer-stats":
        return admin.transaction_buffer_stats(a.topic)
    if action == "pending-ack-stats":
        return admin.pending_ack_stats(a.topic, a.sub_name)
    if action == "transaction-in-buffer-stats":
        return admin.transaction_in_buffer_stats(a.topic, _txn(a))
    if action == "transaction-in-pending-ack-stats":
        return admin.transaction_in_pending_ack_stats(a.topic, a.sub_name, _txn(a))
    admin.scale_coordinators(a.replicas)
    return None


_GROUPS = {"topics": _topics, "subscriptions": _subscriptions, "transactions": _transactions}


def _run(args: argparse.Namespace) -> int:
    check_seconds("--timeout", args.timeout, zero=False)  # Client's would name its keyword
    client = Client(
        args.url,
        token=read_secret(args.token_file, "token file"),
        reconnect_timeout_s=args.timeout,
        tls_trust_certs_file_path=args.tls_trust_certs_file,
        operation_timeout_seconds=args.timeout,
    )
    try:
        result = _GROUPS[args.group](client.admin, client, args)
    finally:
        client.close()
    if result is None:
        return 0
    if args.format == "table":
        print(render_table(result))
    else:
        print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return "" if value is None else str(value)


def render_table(result: Any) -> str:
    """Aligned columns: a row per item of a list (a column per key), a row per key of a
    dict (KEY, VALUE), nested values as compact JSON."""
    if isinstance(result, dict):
        header, rows = ["KEY", "VALUE"], [[str(k), _cell(v)] for k, v in result.items()]
    elif isinstance(result, list) and all(isinstance(r, dict) for r in result):
        header = list(dict.fromkeys(k for r in result for k in r))
        header = header or ["(none)"]
        rows = [[_cell(r.get(k)) for k in header] for r in result]
        header = [h.upper() for h in header]
    elif isinstance(result, list):
        header, rows = ["NAME"], [[_cell(r)] for r in result]
    else:
        return _cell(result)
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    lines = [header, *rows]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "admin",
        help="admin calls on a running server, as pulsar-admin (topics, subscriptions, "
        "transactions)",
    )
    p.add_argument(
        "--url",
        default=os.environ.get("PULSARTXN_URL", DEFAULT_URL),
        help=f"the server or cluster (default: env PULSARTXN_URL, else {DEFAULT_URL})",
    )
    p.add_argument("--token-file", help="file holding the admin token (serve --admin-token-file)")
    p.add_argument("--tls-trust-certs-file", help="CA certificate of a pulsartxn+ssl:// server")
    p.add_argument("--format", choices=("json", "table"), default="json")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds to keep trying an unreachable server, and to wait for one that does "
        "not answer",
    )
    p.set_defaults(func=_run)
    groups = p.add_subparsers(dest="group", required=True, metavar="GROUP")

    topics = groups.add_parser("topics", help="create, list, delete, stats").add_subparsers(
        dest="action", required=True
    )
    c = topics.add_parser("create", help="create a topic (-p N: partitioned)")
    c.add_argument("topic")
    c.add_argument("-p", "--partitions", type=int, default=0)
    c = topics.add_parser("list", help="every topic, partitioned ones once")
    c.add_argument("namespace", nargs="?", help="only those of tenant/namespace")
    c = topics.add_parser("delete", help="delete a topic, its messages and subscriptions")
    c.add_argument("topic")
    c.add_argument("-f", "--force", action="store_true", help="close its producers, consumers")
    topics.add_parser("stats", help="counters and subscriptions").add_argument("topic")
    c = topics.add_parser("partitioned-stats", help="a partitioned topic's stats")
    c.add_argument("topic")
    c.add_argument("--per-partition", action="store_true")

    subs = groups.add_parser("subscriptions", help="a topic's subscriptions").add_subparsers(
        dest="action", required=True
    )
    subs.add_parser("list", help="a topic's subscriptions").add_argument("topic")
    for name, help_ in (
        ("create", "create a subscription"),
        ("delete", "delete a subscription (pulsar-admin's unsubscribe)"),
        ("reset-cursor", "move a subscription to a time or a message id"),
        ("skip", "acknowledge the next N messages"),
        ("clear-backlog", "acknowledge every message readable now"),
        ("peek", "the next N messages, without moving the subscription"),
    ):
        c = subs.add_parser(name, help=help_)
        c.add_argument("topic")
        c.add_argument("-s", "--subscription", required=True)
        if name == "create":
            c.add_argument(
                "-m",
                "--messageId",
                "--position",
                dest="position",
                default="latest",
                help="latest (default), earliest, or ledger:entry[:partition[:batch_index]]",
            )
        elif name == "delete":
            c.add_argument("-f", "--force", action="store_true", help="close its consumers")
        elif name == "reset-cursor":
            c.add_argument("-t", "--time", help="this long ago (10s, 5m, 3h, 2d, 1w)")
            c.add_argument("-m", "--messageId", dest="message_id", help="ledger:entry[:...]")
        elif name in ("skip", "peek"):
            c.add_argument(
                "-n", "--count", type=int, required=name == "skip", default=1, help="messages"
            )

    txns = groups.add_parser("transactions", help="coordinators, buffers, pending acks")
    txns = txns.add_subparsers(dest="action", required=True)
    c = txns.add_parser("coordinator-stats", help="one coordinator's, or every one's")
    c.add_argument("-c", "--coordinator-id", type=int)
    c = txns.add_parser("slow-transactions", help="transactions open at least --time")
    c.add_argument("-t", "--time", required=True, help="e.g. 1s, 10s, 1m")
    c.add_argument("-c", "--coordinator-id", type=int)
    for name, topic, sub_name, txn in (
        ("transaction-metadata", False, False, True),
        ("transaction-buffer-stats", True, False, False),
        ("pending-ack-stats", True, True, False),
        ("transaction-in-buffer-stats", True, False, True),
        ("transaction-in-pending-ack-stats", True, True, True),
    ):
        c = txns.add_parser(name)
        if topic:
            c.add_argument("-t", "--topic", required=True)
        if sub_name:
            c.add_argument("-s", "--sub-name", required=True)
        if txn:
            c.add_argument("-m", "--most-sig-bits", type=int, help="the coordinator id")
            c.add_argument("-l", "--least-sig-bits", type=int, help="the sequence")
            c.add_argument("--txn-id", help="coordinator:sequence, as the stats print it")
    c = txns.add_parser(
        "scale-coordinators",
        aliases=["scale-transactionCoordinators"],
        help="grow to N coordinators",
    )
    c.add_argument("-r", "--replicas", type=int, required=True)
