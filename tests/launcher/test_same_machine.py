"""One machine named twice is one host: the merge rule and the names that count as one machine."""
import socket

from appliance.launcher.executors import is_local, merge_same_machines
from appliance.launcher.hosts import Host, assign_ranks, merge_hosts


def test_merge_keeps_first_name_and_place_and_sums_slots():
    key = {"a": 1, "b": 2, "a2": 1, "c": None, "c2": None}.__getitem__
    hosts, groups = merge_hosts([Host("a", 1), Host("b", 2), Host("a2", 3), Host("c", 1), Host("c2", 1)], key)
    assert hosts == [Host("a", 4), Host("b", 2), Host("c", 1), Host("c2", 1)]  # None: never merged
    assert groups == [["a", "a2"]]
    slots = assign_ranks(hosts, 6)
    assert [(s.host, s.local_rank, s.local_size) for s in slots] == [
        ("a", 0, 4), ("a", 1, 4), ("a", 2, 4), ("a", 3, 4), ("b", 0, 2), ("b", 1, 2)]


def test_names_of_this_machine_and_names_of_one_address_merge():
    hosts, notes = merge_same_machines([
        Host("localhost", 1), Host("10.9.9.9", 1), Host("127.0.0.1", 2), Host(socket.gethostname(), 1),
        Host("168364297", 2)])  # inet_aton's form of 10.9.9.9: another name of that address
    assert hosts == [Host("localhost", 4), Host("10.9.9.9", 3)]
    assert len(notes) == 2
    assert notes[0].startswith(f"localhost, 127.0.0.1 and {socket.gethostname()} name this machine")
    assert "(10.9.9.9)" in notes[1] and "3 slots" in notes[1]


def test_distinct_machines_stay_apart():
    hosts, notes = merge_same_machines([Host("localhost", 1), Host("10.9.9.8", 1), Host("10.9.9.9", 1)])
    assert hosts == [Host("localhost", 1), Host("10.9.9.8", 1), Host("10.9.9.9", 1)] and notes == []


def test_this_pods_dns_name_before_its_record_exists_is_this_machine():
    """A launcher pod that also runs workers finds its own ``pod.job.ns.svc`` in the hostfile before
    the cluster's DNS has its record: the name's first label is this machine's hostname."""
    own, other = f"{socket.gethostname()}.job.ns.svc", "another-pod.job.ns.svc"
    assert is_local(own) and not is_local(other)
    hosts, notes = merge_same_machines([Host("localhost", 1), Host(own, 2), Host(other, 1)])
    assert hosts == [Host("localhost", 3), Host(other, 1)] and len(notes) == 1
