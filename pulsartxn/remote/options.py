"""What a remote client's URL and options become: its brokers, TLS roots and wire options."""

from __future__ import annotations

from urllib.parse import urlparse

from .. import errors
from ..messaging.consumer import check_subscribe_enums
from ..messaging.dead_letter import check_policy
from ..messaging.send_options import check_batching, check_ms


def parse_service_url(service_url) -> tuple[bool, list[str]]:
    """(TLS, ["host:port", ...]) of ``pulsartxn[+ssl]://host:port[,host:port...]``, as
    Pulsar's multi-host service URLs; anything else is a ValueError."""
    bad = ValueError(
        "service_url must be pulsartxn://host:port[,host:port...] or "
        f"pulsartxn+ssl://host:port[,...], not {errors.excerpt(service_url)}"
    )
    if not isinstance(service_url, str):
        raise bad
    scheme, sep, rest = service_url.partition("://")
    if not sep or scheme not in ("pulsartxn", "pulsartxn+ssl"):
        raise bad
    netloc = rest.split("/", 1)[0]  # a path is ignored, as it always was
    if not netloc or "@" in netloc or "?" in netloc or "#" in netloc:
        raise bad
    hosts = []
    for part in netloc.split(","):
        try:
            url = urlparse(f"//{part}")
            host, port = url.hostname, url.port
        except ValueError:
            raise bad from None
        if not host or not port:
            raise bad
        hosts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if len(set(hosts)) != len(hosts):
        raise bad
    return scheme == "pulsartxn+ssl", hosts


def check_operation_timeout(value) -> float:
    """operation_timeout_seconds as a float: a positive, finite number (ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise ValueError(
            f"operation_timeout_seconds must be a positive number, not {errors.excerpt(value)}"
        )
    return float(value)


def check_client_options(token, reconnect_timeout_s, keepalive_s) -> None:
    """Client(...)'s other arguments, before anything is done: a token is None or a str;
    reconnect_timeout_s a finite number of seconds >= 0; keepalive_s a positive one (0 made
    the keep-alive call the broker without a pause)."""
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str or None, not {errors.excerpt(token)}")
    check_seconds("reconnect_timeout_s", reconnect_timeout_s, zero=True)
    check_seconds("keepalive_s", keepalive_s, zero=False)


def check_seconds(name: str, value, zero: bool) -> None:
    """TypeError unless `value` is a number; ValueError unless it is finite and positive
    (>= 0 with `zero`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {errors.excerpt(value)}")
    if not ((value >= 0 if zero else value > 0) and value < 1e9):  # NaN fails both
        kind = "non-negative" if zero else "positive"
        raise ValueError(f"{name} must be a {kind} finite number of seconds, not {value}")


def tls_roots(tls: bool, trust_certs_file_path: str | None):
    """None for plain gRPC; for TLS, the PEM roots to check the server against (b"": the
    system's)."""
    if not tls:
        if trust_certs_file_path is not None:
            raise ValueError("tls_trust_certs_file_path needs a pulsartxn+ssl:// service_url")
        return None
    if trust_certs_file_path is None:
        return b""
    with open(trust_certs_file_path, "rb") as f:
        return f.read()


def producer_options(
    batching_enabled,
    batching_max_messages,
    batching_max_allowed_size_in_bytes,
    batching_max_publish_delay_ms,
) -> dict:
    """create_producer's options as they travel (the remote clients' one list), checked."""
    check_batching(
        batching_enabled,
        batching_max_messages,
        batching_max_allowed_size_in_bytes,
        batching_max_publish_delay_ms,
    )
    return {
        "batching_enabled": batching_enabled,
        "batching_max_messages": batching_max_messages,
        "batching_max_allowed_size_in_bytes": batching_max_allowed_size_in_bytes,
        "batching_max_publish_delay_ms": batching_max_publish_delay_ms,
    }


def subscribe_options(
    subscription_type,
    initial_position,
    isolation,
    consumer_name,
    negative_ack_redelivery_delay_ms,
    receiver_queue_size,
    unacked_messages_timeout_ms=None,
    dead_letter_policy=None,
) -> dict:
    """subscribe's options as they travel, its enums checked first."""
    check_subscribe_enums(
        subscription_type=subscription_type,
        initial_position=initial_position,
        isolation=isolation,
    )
    check_policy(dead_letter_policy)
    check_ms("negative_ack_redelivery_delay_ms", negative_ack_redelivery_delay_ms)
    return {
        "unacked_messages_timeout_ms": unacked_messages_timeout_ms,
        "dead_letter_policy": dead_letter_policy and dead_letter_policy.to_wire(),
        "subscription_type": subscription_type.name,
        "initial_position": initial_position.name,
        "isolation": isolation.name,
        "consumer_name": consumer_name,
        "negative_ack_redelivery_delay_ms": negative_ack_redelivery_delay_ms,
        "receiver_queue_size": receiver_queue_size,
    }
