"""Service URLs of the remote client: one broker or several (Pulsar's multi-host form), and
what ``pulsartxn.Client`` gives when the brokers are no cluster's: today's RemoteClient."""

from __future__ import annotations

import socket

import pytest

import pulsartxn
from pulsartxn.remote import RemoteClient
from pulsartxn.remote.options import parse_service_url


def _dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed


def test_service_urls_parse_as_pulsars():
    assert parse_service_url("pulsartxn://h:1") == (False, ["h:1"])
    assert parse_service_url("pulsartxn+ssl://a:1,b:2/") == (True, ["a:1", "b:2"])
    assert parse_service_url("pulsartxn://[::1]:6650,10.0.0.1:6651") == (
        False,
        ["[::1]:6650", "10.0.0.1:6651"],
    )
    bad = [
        "pulsar://h:1",
        "pulsartxn://h",
        "pulsartxn://h:1,",
        "pulsartxn://h:1,h:1",
        "pulsartxn://h:x",
        "pulsartxn://:1",
        "pulsartxn://u@h:1",
        "pulsartxn://",
        "h:1",
        7,
        None,
    ]
    for url in bad:
        with pytest.raises(ValueError, match="service_url must be"):
            parse_service_url(url)
    with pytest.raises(ValueError, match="service_url must be"):
        RemoteClient("pulsartxn://a:1,b:2")  # a RemoteClient is one broker's
    with pytest.raises(ValueError, match="tls_trust_certs_file_path"):
        pulsartxn.Client("pulsartxn://a:1,b:2", tls_trust_certs_file_path="x.pem")


def test_several_hosts_of_no_cluster_give_the_first_live_ones_client(server):
    s = server()
    address = s.url.split("://")[1]
    with pulsartxn.Client(s.url) as one:
        assert type(one) is RemoteClient
    url = f"pulsartxn://{_dead_address()},{address}"
    with pulsartxn.Client(url, reconnect_timeout_s=5) as client:
        assert type(client) is RemoteClient  # tried in turn: the live one, alone
        assert client._reconnect_s == 5
        producer = client.create_producer("t")
        producer.send(b"x")
        assert (
            client.subscribe("t", "s", initial_position=pulsartxn.InitialPosition.Earliest)
            .receive(5000)
            .data()
            == b"x"
        )
    with pytest.raises(TypeError):
        pulsartxn.Client(url, no_such_option=True)


def test_no_live_host_is_broker_unavailable():
    url = f"pulsartxn://{_dead_address()},{_dead_address()}"
    with pytest.raises(pulsartxn.BrokerUnavailable, match="no broker"):
        pulsartxn.Client(url, reconnect_timeout_s=0.5)
