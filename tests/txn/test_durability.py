"""When a transaction's work is durable: its sends and acks once stored, the whole of it by
the commit's one device flush (docs/API.md, "Durability")."""

from __future__ import annotations

import pytest

from tests import helpers


@pytest.mark.parametrize("side", ["embedded", "remote"])
def test_a_transaction_costs_one_device_flush_whatever_sent_its_messages(tmp_path, side):
    wrap = helpers.Served if side == "remote" else None
    with helpers.brokers_at(tmp_path / "data", wrap=wrap, sync=True) as open_:
        broker = open_()
        journal = broker.storage.journal
        if journal is None:
            pytest.skip("this disk gives the store no journal")
        client = broker.client()
        p = client.create_producer("t")
        p.send(b"warm")
        styles = {
            "send": lambda t: [p.send(b"s%d" % i, txn=t) for i in range(3)],
            "send_async + result": lambda t: [
                f.result() for f in [p.send_async(b"a%d" % i, txn=t) for i in range(3)]
            ],
            "send_batch": lambda t: p.send_batch([b"b%d" % i for i in range(3)], txn=t),
        }
        for name, send in styles.items():
            before = journal.flushes
            for _ in range(5):
                txn = client.new_transaction()
                send(txn)
                txn.commit()
            assert journal.flushes - before == 5, name
        assert len(helpers.scanned(client, "t")) == 1 + 5 * 9


def test_a_transactional_send_batch_that_fails_to_land_aborts_its_commit(tmp_path):
    """An in-process transaction's send_batch rides in its commit's write (nothing is gained
    by writing it sooner: the transaction dies with the process); if its write fails, the
    commit aborts the transaction and says so, and nothing of it shows."""
    import lmdb

    import pulsartxn
    from pulsartxn import TxnState
    from pulsartxn.errors import InvalidTxnStatus

    with pulsartxn.Broker(tmp_path / "data", sync=True) as broker:
        client = broker.client()
        producer = client.create_producer("t")
        producer.send(b"before")
        part = broker.topics.partition(broker.topic_partitions("t")[0])
        original = part.append_messages_op

        def failing(*args, **kwargs):
            op = original(*args, **kwargs)

            def apply(txn):
                raise lmdb.Error("mdb_put: injected write error")

            op.apply = apply
            return op

        part.append_messages_op = failing
        txn = client.new_transaction()
        assert producer.send_batch([b"a", b"b"], txn=txn) == 2  # handed over, not yet written
        with pytest.raises(InvalidTxnStatus, match="injected.*aborted"):
            txn.commit()
        assert txn.state is TxnState.ABORTED
        part.append_messages_op = original
        assert helpers.scanned(client, "t") == [b"before"]
