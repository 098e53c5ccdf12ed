"""``pulsartxn produce`` and ``pulsartxn consume``: one-shot commands in the manner of
pulsar-client's CLI, against the embedded default (a data directory) or a running service
(``--url``). docs/operations.md, "pulsartxn produce and consume"."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import pulsartxn

# pulsar-client's spellings of the subscription types and positions.
SUBSCRIPTION_TYPES = {
    "Exclusive": pulsartxn.ConsumerType.Exclusive,
    "Shared": pulsartxn.ConsumerType.Shared,
    "Failover": pulsartxn.ConsumerType.Failover,
    "Key_Shared": pulsartxn.ConsumerType.KeyShared,
}
POSITIONS = {
    "Earliest": pulsartxn.InitialPosition.Earliest,
    "Latest": pulsartxn.InitialPosition.Latest,
}
# What a one-line print escapes: control characters, the backslash, and bytes that are not
# UTF-8 (decoded as surrogates U+DC80..U+DCFF), so that a printed line maps back to its bytes.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(32), 127)}
_ESCAPES |= {0xDC00 + b: f"\\x{b:02x}" for b in range(128, 256)}
_ESCAPES |= {10: "\\n", 13: "\\r", 9: "\\t", 92: "\\\\"}


def read_secret(path: str | None, what: str) -> str | None:
    """The token a --token-file (`what`) holds, stripped; None without one. Every command
    reads its token files here."""
    if path is None:
        return None
    with open(path) as f:
        value = f.read().strip()
    if not value:
        raise ValueError(f"{what} {path} is empty")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        help="pulsartxn://host:port (or a cluster's h1:p1,h2:p2,...) of a running service; "
        "default: the embedded broker on --data-dir",
    )
    p.add_argument("--token-file", help="file holding the bearer token the service needs")
    p.add_argument(
        "--tls-trust-certs-file-path", help="PEM certificates to trust (pulsartxn+ssl://)"
    )
    p.add_argument(
        "--data-dir",
        help="the embedded broker's LMDB data directory, without --url (default: "
        "pulsartxn-data; env PULSARTXN_DATA_DIR)",
    )


def add_parser(sub) -> None:
    """Register ``produce`` and ``consume`` on the ``pulsartxn`` command's subparsers."""
    prod = sub.add_parser("produce", help="send messages to a topic (as pulsar-client produce)")
    prod.add_argument("topic")
    prod.add_argument(
        "-m",
        "--messages",
        action="append",
        default=[],
        help="messages to send, split on --separator; repeatable",
    )
    prod.add_argument(
        "-f", "--files", action="append", default=[], help="a file whose bytes are one message"
    )
    prod.add_argument(
        "-n", "--num-produce", type=int, default=1, help="times to send the messages (default 1)"
    )
    prod.add_argument(
        "-r", "--rate", type=float, default=0.0, help="messages/s (default 0: as fast as it goes)"
    )
    prod.add_argument(
        "-s", "--separator", default=",", help="splits -m (default ','; '' does not split)"
    )
    prod.add_argument("-k", "--key", help="the messages' key (partition key)")
    prod.add_argument(
        "-p",
        "--properties",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property of every message; repeatable",
    )
    prod.add_argument(
        "--txn",
        action="store_true",
        help="send all in one transaction: all are visible, or (on an error) none",
    )
    _common(prod)
    prod.set_defaults(func=_produce)

    cons = sub.add_parser(
        "consume", help="receive messages from a topic (as pulsar-client consume)"
    )
    cons.add_argument("topic")
    cons.add_argument("-s", "--subscription-name", required=True)
    cons.add_argument(
        "-t", "--subscription-type", choices=list(SUBSCRIPTION_TYPES), default="Exclusive"
    )
    cons.add_argument(
        "-p",
        "--subscription-position",
        choices=list(POSITIONS),
        default="Latest",
        help="where a new subscription starts (default Latest)",
    )
    cons.add_argument(
        "-n",
        "--num-messages",
        type=int,
        default=1,
        help="messages to receive (default 1; 0: until Ctrl-C)",
    )
    cons.add_argument(
        "--timeout",
        type=float,
        help="seconds to wait for the next message before ending (default: wait on)",
    )
    cons.add_argument("--hex", action="store_true", help="print payloads as hex")
    _common(cons)
    cons.set_defaults(func=_consume)


def _connect(args) -> tuple[pulsartxn.Client, object]:
    """(client, what to close): the service at --url, else an embedded broker."""
    if args.url is None:
        if args.token_file is not None or args.tls_trust_certs_file_path is not None:
            raise ValueError("--token-file and --tls-trust-certs-file-path go with --url")
        data_dir = args.data_dir or os.environ.get("PULSARTXN_DATA_DIR", "pulsartxn-data")
        broker = pulsartxn.Broker(data_dir)
        return broker.client(), broker
    if args.data_dir is not None:
        raise ValueError("--data-dir is for the embedded broker: not with --url")
    client = pulsartxn.Client(
        args.url,
        token=read_secret(args.token_file, "token file"),
        tls_trust_certs_file_path=args.tls_trust_certs_file_path,
    )
    return client, client


def _properties(pairs: list[str]) -> dict[str, str] | None:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ValueError(f"-p/--properties takes KEY=VALUE, not {pair!r}")
        out[key] = value
    return out or None


def _payloads(args) -> list[bytes]:
    out = []
    for text in args.messages:
        parts = text.split(args.separator) if args.separator else [text]
        out.extend(part.encode() for part in parts)
    for path in args.files:
        with open(path, "rb") as f:
            out.append(f.read())
    if not out:
        raise ValueError("give the messages to send: -m/--messages or -f/--files")
    return out


# After Ctrl-C, how long the work may take to finish the step it is in before the close.
FINISH_STEP_S = 1.5


def _interruptibly(args, work, interrupted) -> int:
    """``work(client, stop)`` connected as the command says, on a thread of its own; the main
    thread joins it in slices, so that Ctrl-C ends the command at once, also while a call (the
    connect's too) waits for a broker that does not answer. Then `stop` is set, the work has
    FINISH_STEP_S to end the step it is in, ``interrupted()`` gives the exit code, and the
    client is closed: a remote one waits 5 s at most for a silent broker;
    an embedded broker aborts its open transactions, a remote session's are aborted once it
    has ended."""
    opened: list = []
    outcome: list = []
    stop = threading.Event()
    # Not Thread.join: a join that Ctrl-C interrupts marks a live thread stopped (Python
    # 3.11's bpo-45274 handling releases the thread's own lock), and a second join returns
    # at once.
    finished = threading.Event()

    def run() -> None:
        try:
            client, closer = _connect(args)
            opened.append(closer)
            outcome.append(work(client, stop))
        except BaseException as exc:  # noqa: BLE001 - raised in the main thread
            outcome.append(exc)
        finally:
            finished.set()

    worker = threading.Thread(target=run, name=f"pulsartxn-{args.command}", daemon=True)
    try:
        worker.start()
        while not finished.wait(0.1):  # in slices: the main thread sees Ctrl-C between them
            pass
    except KeyboardInterrupt:
        stop.set()
        finished.wait(FINISH_STEP_S)  # the step it is in (a print and its ack), if it can
        return interrupted()
    finally:
        for closer in opened:
            try:
                closer.close()
            except KeyboardInterrupt:
                pass  # Ctrl-C again while closing: what was acknowledged is stored
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _produce(args) -> int:
    if args.num_produce < 1:
        raise ValueError(f"-n/--num-produce must be at least 1, not {args.num_produce}")
    if not args.rate >= 0:  # NaN too
        raise ValueError(f"-r/--rate must not be negative, not {args.rate}")
    payloads = _payloads(args)
    properties = _properties(args.properties)

    def interrupted() -> int:
        print("pulsartxn produce: interrupted", file=sys.stderr)
        return 130

    return _interruptibly(
        args, lambda client, stop: _send_all(args, client, payloads, properties, stop), interrupted
    )


def _send_all(args, client, payloads: list[bytes], properties, stop: threading.Event) -> int:
    """Send (and commit); 130 without a commit once `stop` is set (Ctrl-C)."""
    producer = client.create_producer(args.topic)
    txn = client.new_transaction() if args.txn else None
    interval = 1.0 / args.rate if args.rate else 0.0
    start = time.monotonic()
    sent = 0
    try:
        futures = []
        for _ in range(args.num_produce):
            for payload in payloads:
                delay = start + sent * interval - time.monotonic() if interval else 0.0
                if stop.wait(delay) if delay > 0 else stop.is_set():
                    return 130  # its transaction is never committed: the close ends it
                futures.append(
                    producer.send_async(payload, None, properties, partition_key=args.key, txn=txn)
                )
                sent += 1
        if stop.is_set():
            return 130
        if txn is not None:
            txn.commit()
        else:
            producer.flush()
        for fut in futures:
            fut.result()
    except (ValueError, TypeError, OSError, pulsartxn.PulsarTxnError) as exc:
        if txn is None:
            raise
        _abort(txn)
        error = " ".join(str(exc).split())
        print(
            f"pulsartxn produce: {error} (transaction {txn.id} aborted: nothing produced)",
            file=sys.stderr,
        )
        return 2
    producer.close()
    where = f" in transaction {txn.id}" if txn is not None else ""
    print(f"{sent} messages produced to {args.topic}{where}", flush=True)
    return 0


def _abort(txn) -> None:
    try:
        if txn.state is pulsartxn.TxnState.OPEN:
            txn.abort()
    except pulsartxn.PulsarTxnError:
        pass  # the send's error is the one to report; an unended transaction times out


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape").translate(_ESCAPES)


def format_message(msg: pulsartxn.Message, hex_payload: bool = False) -> str:
    """One line for `msg`: its id, key, properties and payload (text, or hex)."""
    key = msg.partition_key()
    props = ", ".join(
        f"{_text(k.encode())}={_text(v.encode())}" for k, v in msg.properties().items()
    )
    content = msg.data().hex() if hex_payload else _text(msg.data())
    key_text = "null" if key is None else _text(key.encode())
    return f"id:{msg.message_id()} key:[{key_text}] properties:[{props}] content:{content}"


def _consume(args) -> int:
    if args.num_messages < 0:
        raise ValueError(f"-n/--num-messages must not be negative, not {args.num_messages}")
    if args.timeout is not None and not args.timeout > 0:
        raise ValueError(f"--timeout must be a positive number of seconds, not {args.timeout}")
    received = [0]

    def interrupted() -> int:
        print(f"pulsartxn consume: interrupted after {received[0]} messages", file=sys.stderr)
        return 0 if args.num_messages == 0 else 130

    def work(client, stop: threading.Event) -> int:
        _consume_until(args, client, received, stop)
        return 0

    return _interruptibly(args, work, interrupted)


def _consume_until(args, client, received: list, stop: threading.Event) -> None:
    """Receive, print and acknowledge until -n messages, --timeout idle or `stop`; counts
    into received[0]."""
    consumer = client.subscribe(
        args.topic,
        args.subscription_name,
        subscription_type=SUBSCRIPTION_TYPES[args.subscription_type],
        initial_position=POSITIONS[args.subscription_position],
    )
    # Waits are sliced so that a stop is seen within a second.
    slice_ms = 1000
    idle_since = time.monotonic()
    while args.num_messages == 0 or received[0] < args.num_messages:
        if stop.is_set():
            return
        wait_ms = slice_ms
        if args.timeout is not None:
            left = idle_since + args.timeout - time.monotonic()
            if left <= 0:
                print(
                    f"pulsartxn consume: {received[0]} messages; none more within "
                    f"{args.timeout:g} s",
                    file=sys.stderr,
                )
                break
            wait_ms = max(1, min(slice_ms, int(left * 1000)))
        try:
            msg = consumer.receive(timeout_millis=wait_ms)
        except pulsartxn.Timeout:
            continue
        if stop.is_set():
            return  # not printed, not acknowledged: delivered again to the next consumer
        print(format_message(msg, args.hex), flush=True)
        received[0] += 1  # printed: counted, though its ack may not land (it comes again)
        consumer.acknowledge(msg)
        idle_since = time.monotonic()
    consumer.close()
