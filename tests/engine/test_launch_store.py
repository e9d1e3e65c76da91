"""Node 0 keeps the rendezvous store of several machines open until the others have left it
(engine/launch_store.py): closed earlier, their agents print torch's C++ stack traces at the
end of a run that succeeded. Real TCP stores on this machine, one per "machine" here."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from torchloom.engine import launch_store
from torchloom.engine.launch import check_port_free, free_port
from torchloom.engine.launch_store import StoreKeeper, host_and_port


def serving(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


def test_node_0_serves_the_store_after_its_agent_until_the_other_machines_have_left() -> None:
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    keeper = StoreKeeper(endpoint, nnodes=3, node_rank=0, run_id="r")
    # Node 0's agent makes its own store of that port later: it shares the keeper's server,
    # and its end (the agent's launch returned) no longer closes the port.
    agent = TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True)
    agent.set("rendezvous", "state")
    del agent
    waiting = threading.Thread(target=keeper.succeeded)
    waiting.start()
    for node_rank in (1, 2):
        time.sleep(0.3)
        assert waiting.is_alive()
        other = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        assert other.get("rendezvous") == b"state"  # still the agents' store
        del other
        StoreKeeper(endpoint, nnodes=3, node_rank=node_rank, run_id="r").succeeded()
    waiting.join(timeout=5)
    assert not waiting.is_alive()
    del keeper
    assert not serving(port)


def test_node_0_waits_a_bounded_time_for_a_machine_that_never_says_it_left(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launch_store, "LEAVE_TIMEOUT", 0.6)
    monkeypatch.setattr(launch_store, "SAY_WAITING_AFTER", 0.2)
    endpoint = f"127.0.0.1:{free_port()}"
    keeper = StoreKeeper(endpoint, nnodes=2, node_rank=0, run_id="this")
    # A machine of an earlier run on the same port, leaving late, counts for nothing.
    StoreKeeper(endpoint, nnodes=2, node_rank=1, run_id="earlier").succeeded()
    started = time.monotonic()
    keeper.succeeded()
    assert 0.6 <= time.monotonic() - started < 5
    assert "waiting for the other machines to leave the rendezvous" in capfd.readouterr().err


def test_a_machine_whose_node_0_is_gone_leaves_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """No store client's retries (each a C++ stack trace) towards a port nobody serves."""
    StoreKeeper(f"127.0.0.1:{free_port()}", nnodes=2, node_rank=1, run_id="r").succeeded()
    assert capfd.readouterr().err == ""


def test_one_machine_hosts_no_store_of_its_own() -> None:
    port = free_port()
    StoreKeeper(f"127.0.0.1:{port}", nnodes=1, node_rank=0, run_id="r").succeeded()
    assert not serving(port)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_an_ipv6_rendezvous_is_written_in_brackets_and_served() -> None:
    """`[::1]:PORT` was refused as "Name or service not known" with a hint to change the port."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    endpoint = f"[::1]:{port}"
    check_port_free(endpoint)
    keeper = StoreKeeper(endpoint, nnodes=2, node_rank=0, run_id="r")
    assert host_and_port(endpoint) == ("::1", port)
    StoreKeeper(endpoint, nnodes=2, node_rank=1, run_id="r").succeeded()
    started = time.monotonic()
    keeper.succeeded()
    assert time.monotonic() - started < 5  # at once: the other machine said it left
