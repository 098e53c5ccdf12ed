"""A remote reader across a server's kill -9: re-created where it stood (after the last
message it read, or where it sought), its cursor never stored on the server."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn import MessageId, errors


def test_a_reader_goes_on_where_it_stood_after_a_kill(server):
    s = server()
    client = pulsartxn.Client(s.url)
    p = client.create_producer("t", batching_enabled=False)
    ids = [p.send(b"m%d" % i) for i in range(6)]
    reader = client.create_reader("t", MessageId.earliest)
    assert [reader.read_next(5000).data() for _ in range(2)] == [b"m0", b"m1"]
    s.kill9()
    s.start()
    assert [reader.read_next(10_000).data() for _ in range(2)] == [b"m2", b"m3"]
    reader.seek(ids[0])  # exclusive, as it started
    s.kill9()
    s.start()
    assert reader.read_next(10_000).data() == b"m1"  # the seek's place, then what it read
    s.kill9()
    s.start()
    assert [reader.read_next(10_000).data() for _ in range(4)] == [b"m2", b"m3", b"m4", b"m5"]
    with pytest.raises(errors.Timeout):
        reader.read_next(200)
    assert client.admin.topic_stats("t")["subscriptions"] == {}
    reader.close()
    client.close()


def test_readers_count_as_consumers_and_close_with_their_session(tmp_path):
    from pulsartxn.server.service import BrokerServer
    from pulsartxn.server.sessions import SessionLimits

    broker = pulsartxn.Broker(tmp_path / "data", sync=False)
    server = BrokerServer(broker, "127.0.0.1", 0, limits=SessionLimits(consumers=2))
    client = pulsartxn.Client(f"pulsartxn://127.0.0.1:{server.port}")
    try:
        client.subscribe("t", "s")
        reader = client.create_reader("t", MessageId.earliest)
        with pytest.raises(errors.QuotaExceeded):
            client.create_reader("t", MessageId.earliest)
        part = broker.topics.resolve("t")[1][0]
        assert len(part.readers) == 1
        with pytest.raises(TypeError):  # an option the server does not know
            client._json("create_reader", {"topic": "t", "start": "00", "options": {"x": 1}})
        reader.close()
        assert part.readers == {}
        client.create_reader("t", MessageId.latest)
        assert len(part.readers) == 1
        client._raw("close_session", {})  # the session ends (no reader closed first)
        assert part.readers == {}
    finally:
        client.close()
        server.shutdown_sessions()
        server.shutdown()
        broker.close()
