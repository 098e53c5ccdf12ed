"""An in-process transaction's send claims its entry id (Partition.claim): its MessageId comes
at once, the entry is written with the transaction's end, and until then readers stop below
it. Claims interleave with plain sends and with other transactions, end in any order, and are
never half-kept across a SIGKILL."""

from __future__ import annotations

import functools
import random
import signal
import textwrap
import threading

import pytest

import pulsartxn
from pulsartxn import ConsumerType, InitialPosition
from pulsartxn._native import decode_header
from tests import helpers

drain = functools.partial(helpers.drain, timeout_ms=100)


def _ledger(part) -> list[tuple[int, int]]:
    """(entry id, message count) of every entry stored in the partition's ledger."""
    with part.storage.read() as lmdb_txn:
        ids, bufs = part.log.scan(lmdb_txn, 0, None)
        return [(i, decode_header(bytes(b), verify=False).message_count) for i, b in zip(ids, bufs)]


def _counts_agree(part) -> None:
    """The partition's message counts (backlog arithmetic) are what its ledger holds."""
    stored = dict(_ledger(part))
    first = part.first_entry_id
    counts = [stored.get(i, 0) for i in range(first, part.next_entry_id)]
    assert list(part._counts) == counts
    assert part.messages_between(first, part.next_entry_id) == sum(counts)
    assert part.total_messages == sum(counts)


def test_a_send_answers_at_once_and_is_written_by_its_commit(tmp_path):
    with pulsartxn.Broker(tmp_path / "d", sync=True) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        groups = broker.storage.commits.groups
        txn = client.new_transaction()
        mid = producer.send(b"m", txn=txn)
        fut = producer.send_async(b"n", txn=txn)
        assert fut.done() and fut.result().entry_id() == mid.entry_id() + 1
        assert broker.storage.commits.groups == groups  # nothing written: a claim only
        assert _ledger(part) == []
        txn.commit()
        assert _ledger(part) == [(0, 1), (1, 1), (2, 0)]  # both, then the marker
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        got = drain(consumer)
        assert [(m.data(), m.message_id()) for m in got] == [(b"m", mid), (b"n", fut.result())]


def test_readers_stop_below_an_open_claim(tmp_path):
    """A plain send after a claim lands above it and is written first; read-committed readers
    see it only once the claiming transaction ends, as with any open transaction."""
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        for end in ("commit", "abort"):
            txn = client.new_transaction()
            claimed = producer.send(b"in-" + end.encode(), txn=txn)
            plain = producer.send(b"plain-" + end.encode())
            assert plain.entry_id() > claimed.entry_id()
            assert drain(consumer) == []
            getattr(txn, end)()
            got = [(m.data(), m.message_id()) for m in drain(consumer)]
            expected = [(b"plain-" + end.encode(), plain)]
            if end == "commit":
                expected.insert(0, (b"in-commit", claimed))
            assert got == expected
            consumer.acknowledge_cumulative(expected[-1][1])
        _counts_agree(broker.topics.partition(broker.topic_partitions("t")[0]))


@pytest.mark.parametrize("seed", range(3))
def test_claims_interleaved_with_everything_read_where_their_sends_said(tmp_path, seed):
    """Transactions of several producers and plain sends interleave on two partitions and end
    in random order (some by a group commit of another's write first): every committed and
    plain message is read once, at the MessageId its send gave, in entry order; nothing of an
    aborted one is; counts match the ledger; a restart changes none of it."""
    rng = random.Random(seed)
    data = tmp_path / "d"
    expected: dict = {}  # MessageId -> value, of what must be read
    with pulsartxn.Broker(data, sync=False) as broker:
        broker.create_topic("t", partitions=2)
        client = broker.client()
        producers = [
            client.create_producer("t", batching_enabled=rng.random() < 0.5) for _ in range(3)
        ]
        open_txns: list = []
        for i in range(400):
            roll = rng.random()
            producer = rng.choice(producers)
            key = f"k{rng.randrange(4)}"
            value = b"v%d" % i
            if roll < 0.2:
                expected[producer.send(value, partition_key=key)] = value
            elif roll < 0.6 or not open_txns:
                if not open_txns or rng.random() < 0.3:
                    open_txns.append((client.new_transaction(), {}))
                txn, sent = rng.choice(open_txns)
                if rng.random() < 0.5:
                    sent[producer.send(value, partition_key=key, txn=txn)] = value
                else:
                    fut = producer.send_async(value, partition_key=key, txn=txn)
                    sent[fut] = value
            elif roll < 0.65:
                broker.storage.commits.flush_lazy(durable=False, lead=True)
            else:
                txn, sent = open_txns.pop(rng.randrange(len(open_txns)))
                if rng.random() < 0.7:
                    txn.commit()
                    for mid, value in sent.items():
                        expected[mid if isinstance(mid, pulsartxn.MessageId) else mid.result()] = (
                            value
                        )
                else:
                    txn.abort()
        for txn, sent in open_txns:
            txn.commit()
            for mid, value in sent.items():
                expected[mid if isinstance(mid, pulsartxn.MessageId) else mid.result()] = value
        for producer in producers:
            producer.flush()
        _check(broker, client, expected)
    with pulsartxn.Broker(data, sync=False) as broker:
        _check(broker, broker.client(), expected, "again")


def _check(broker, client, expected: dict, name: str = "s") -> None:
    consumer = client.subscribe(
        "t",
        name,
        subscription_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
    )
    got = drain(consumer)
    assert len(got) == len(expected)
    assert {m.message_id(): m.data() for m in got} == expected
    for part_name in broker.topic_partitions("t"):
        part = broker.topics.partition(part_name)
        _counts_agree(part)
        mine = [m.message_id() for m in got if m.message_id().partition() == part.index]
        assert mine == sorted(mine)  # in entry order, per partition


CRASH = textwrap.dedent(
    """
    import sys
    import pulsartxn

    broker = pulsartxn.Broker(sys.argv[1], sync=True)
    client = broker.client()
    producer = client.create_producer("t", batching_enabled=False)
    orphan = client.new_transaction()
    print(producer.send(b"orphan", txn=orphan).entry_id(), flush=True)
    for i in range(3):
        producer.send(b"plain%d" % i)  # their writes carry the orphan's first
    done = client.new_transaction()
    producer.send(b"committed", txn=done)
    done.commit()
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def test_an_orphaned_claim_is_aborted_after_a_sigkill(tmp_path):
    """SIGKILL with a transaction open whose claimed entry was written by later writes (plain
    sends above it, and a commit): after the restart the orphan is aborted, everything else
    is read, and new sends go after it all."""
    data = str(tmp_path / "d")
    proc = helpers.python_child(tmp_path, CRASH, data)
    try:
        claimed = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with pulsartxn.Broker(data, sync=True) as broker:
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        assert (claimed, 1) in _ledger(part)
        helpers.wait_for(lambda: not part.buffer.ongoing, what="the orphan's abort")
        client = broker.client()
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        got = [m.data() for m in drain(consumer)]
        assert got == [b"plain0", b"plain1", b"plain2", b"committed"]
        last = part.last_entry_id
        producer = client.create_producer("t", batching_enabled=False)
        txn = client.new_transaction()
        after = producer.send(b"after", txn=txn)
        txn.commit()
        assert after.entry_id() > last
        assert [m.data() for m in drain(consumer)] == [b"after"]
        _counts_agree(part)


def test_claims_from_many_threads_never_show_what_was_not_committed(tmp_path):
    """Threads claim (send), ride unclaimed (send_batch), send plain, commit and abort on one
    partition while a consumer reads read-committed: it gets every committed and plain message
    once (a claimed one at its send's id), in entry order, and never one of an aborted
    transaction."""
    with pulsartxn.Broker(tmp_path / "d", sync=True) as broker:
        client = broker.client()
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        kept: dict = {}  # value -> its MessageId when its send gave one
        dropped: set = set()
        lock = threading.Lock()
        received: list = []
        stop = threading.Event()

        def work(seed: int) -> None:
            rng = random.Random(seed)
            producer = client.create_producer("t", batching_enabled=rng.random() < 0.5)
            for i in range(150):
                value = b"%d-%d" % (seed, i)
                if rng.random() < 0.3:
                    mid = producer.send(value)
                    with lock:
                        kept[value] = mid
                    continue
                txn = client.new_transaction()
                sent = {}
                for j in range(rng.randrange(1, 3)):
                    v = value + b"-%d" % j
                    if rng.random() < 0.5:
                        sent[v] = producer.send(v, txn=txn)
                    else:
                        producer.send_batch([v], txn=txn)
                        sent[v] = None
                if rng.random() < 0.7:
                    txn.commit()
                    with lock:
                        kept.update(sent)
                else:
                    txn.abort()
                    with lock:
                        dropped.update(sent)

        def read() -> None:
            while not stop.is_set():
                try:
                    msg = consumer.receive(timeout_millis=50)
                except pulsartxn.Timeout:
                    continue
                received.append((msg.data(), msg.message_id()))

        reader = threading.Thread(target=read)
        reader.start()
        workers = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        helpers.wait_for(lambda: len(received) >= len(kept), what="every kept message")
        stop.set()
        reader.join()
        extra = [(v, mid, v in dropped) for v, mid in received if v not in kept]
        assert not extra
        assert sorted(v for v, _ in received) == sorted(kept)  # each once, none dropped
        assert all(kept[v] in (None, mid) for v, mid in received)
        ids = [mid for _, mid in received]
        assert ids == sorted(ids)  # one Exclusive consumer: in entry order
        _counts_agree(broker.topics.partition(broker.topic_partitions("t")[0]))


def test_a_claim_of_a_transaction_that_times_out_is_written_aborted(tmp_path):
    """A claimed send whose transaction times out before its end: the coordinator's abort
    waits for the claim's write, readers pass it once the marker is there, its message is
    never read, and the late commit raises."""
    with pulsartxn.Broker(tmp_path / "d", sync=True) as broker:
        client = broker.client()
        producer = client.create_producer("t", batching_enabled=False)
        consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest)
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        txn = client.new_transaction(timeout_ms=200)
        claimed = producer.send(b"late", txn=txn)
        plain = producer.send(b"plain")
        assert drain(consumer) == []  # behind the open claim
        helpers.wait_for(lambda: txn.state is pulsartxn.TxnState.TIMEOUT, what="the timeout")
        helpers.wait_for(lambda: not part.buffer.ongoing, what="the abort marker")
        assert [(m.data(), m.message_id()) for m in drain(consumer)] == [(b"plain", plain)]
        assert (claimed.entry_id(), 1) in _ledger(part)  # written, aborted
        with pytest.raises(pulsartxn.InvalidTxnStatus):
            txn.commit()
        _counts_agree(part)
