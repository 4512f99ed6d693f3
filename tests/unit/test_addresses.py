"""The address a process publishes for others to reach it (core.addresses)."""

from __future__ import annotations

import socket

from core.addresses import advertised_host, host_port, http_url, primary_address


def test_a_bound_host_is_advertised_as_is_unless_it_is_a_wildcard() -> None:
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("10.1.2.3", "frontend.example") == "frontend.example"
    for wildcard in ("0.0.0.0", "::", ""):
        assert advertised_host(wildcard) == primary_address()
        assert advertised_host(wildcard, "pod-ip") == "pod-ip"


def test_the_primary_address_is_one_this_machine_can_listen_on() -> None:
    address = primary_address()
    if address == socket.gethostname():  # no route to anywhere
        return
    with socket.socket() as listener:
        listener.bind((address, 0))  # an address of one of this machine's interfaces


def test_ipv6_hosts_are_bracketed() -> None:
    assert host_port("::1", 80) == "[::1]:80"
    assert host_port("[::1]", 80) == "[::1]:80"
    assert http_url("h", 8000, "/metrics") == "http://h:8000/metrics"
