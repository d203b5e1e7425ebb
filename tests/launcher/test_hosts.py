"""Host parsing and rank layout (pure functions)."""
import pytest

from appliance.launcher.hosts import Host, HostsError, assign_ranks, parse_hostfile, parse_hosts, read_hostfile


def test_parse_hosts_forms():
    assert parse_hosts("localhost:2") == [Host("localhost", 2)]
    assert parse_hosts(" a:2 , b:1,c ") == [Host("a", 2), Host("b", 1), Host("c", 1)]
    assert parse_hosts("10.0.0.1:4,node-2.example.org:8") == [Host("10.0.0.1", 4), Host("node-2.example.org", 8)]
    assert parse_hosts("[::1]:3,[fe80::1%eth0]") == [Host("::1", 3), Host("fe80::1%eth0", 1)]
    assert parse_hosts("::1") == [Host("::1", 1)]


@pytest.mark.parametrize("spec, words", [
    ("a:2,,b:1", ["entry 2", "empty"]),
    ("a:x", ["'a:x'", "whole number", "'x'"]),
    ("a:0", ["at least 1", "0"]),
    ("a:-1", ["at least 1"]),
    ("a:2,a:1", ["'a'", "more than once"]),
    ("a b:2", ["'a b'", "not a host name"]),
    ("[::1:2", ["missing ']'"]),
    ("", ["entry 1", "empty"]),
])
def test_parse_hosts_errors_name_the_entry(spec, words):
    with pytest.raises(HostsError) as e:
        parse_hosts(spec)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_parse_hostfile_comments_blank_lines_and_defaults():
    text = "# cluster\n\nnode1 slots=4   # gpu box\n  node2 slots=2\nnode3\n"
    assert parse_hostfile(text) == [Host("node1", 4), Host("node2", 2), Host("node3", 1)]


def test_parse_hostfile_reads_both_dialects_and_keeps_names_as_given():
    # the MPI Operator's OpenMPI and Intel/MPICH hostfiles, and Trainer's short names
    text = ("pi-worker-0.pi.default.svc slots=2 max_slots=4\npi-worker-1.pi.default.svc:3\n"
            "job-node-0-0.job\n[fe80::1]:2\nfe80::2 slots=1\n")
    assert parse_hostfile(text, default_slots=5) == [
        Host("pi-worker-0.pi.default.svc", 2), Host("pi-worker-1.pi.default.svc", 3), Host("job-node-0-0.job", 5),
        Host("fe80::1", 2), Host("fe80::2", 1)]


@pytest.mark.parametrize("text, line, words", [
    ("a slots=2\nb slots=two\n", 2, ["whole number", "'two'"]),
    ("a slots=2\n# c\nb cores=2\n", 3, ["expected 'host slots=N'", "b cores=2"]),
    ("a slots=2 slots=3\n", 1, ["expected 'host slots=N'"]),
    ("a slots\n", 1, ["expected 'host slots=N'"]),
    ("a slots=0\n", 1, ["at least 1"]),
    ("a:two\n", 1, ["whole number", "'two'"]),
    ("a:2 slots=3\n", 1, ["expected 'host slots=N' or 'host:N'"]),
    ("a:\n", 1, ["expected 'host slots=N' or 'host:N'"]),
    ("a slots=2 max_slots=x\n", 1, ["whole number"]),
])
def test_parse_hostfile_bad_line_names_file_and_line(text, line, words):
    with pytest.raises(HostsError) as e:
        parse_hostfile(text, "hosts.txt")
    msg = str(e.value)
    assert msg.startswith(f"hosts.txt:{line}:"), msg
    for w in words:
        assert w in msg, (w, msg)


def test_parse_hostfile_empty_and_duplicates():
    with pytest.raises(HostsError, match="no hosts"):
        parse_hostfile("# nothing\n\n", "f")
    with pytest.raises(HostsError, match="'a' is listed more than once"):
        parse_hostfile("a slots=1\na slots=2\n", "f")


def test_read_hostfile_missing(tmp_path):
    with pytest.raises(HostsError, match="nope"):
        read_hostfile(tmp_path / "nope")
    p = tmp_path / "hf"
    p.write_text("h1 slots=2\n")
    assert read_hostfile(p) == [Host("h1", 2)]


def _table(slots):
    return [(s.rank, s.host, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size) for s in slots]


def test_assign_ranks_homogeneous():
    slots = assign_ranks([Host("a", 2), Host("b", 2), Host("c", 2)], 6)
    assert _table(slots) == [
        (0, "a", 0, 2, 0, 3, 6), (1, "a", 1, 2, 0, 3, 6),
        (2, "b", 0, 2, 1, 3, 6), (3, "b", 1, 2, 1, 3, 6),
        (4, "c", 0, 2, 2, 3, 6), (5, "c", 1, 2, 2, 3, 6),
    ]


def test_assign_ranks_fills_in_order_and_skips_unused_hosts():
    slots = assign_ranks([Host("a", 4), Host("b", 4)], 3)
    assert _table(slots) == [(0, "a", 0, 3, 0, 1, 3), (1, "a", 1, 3, 0, 1, 3), (2, "a", 2, 3, 0, 1, 3)]
    slots = assign_ranks([Host("a", 2), Host("b", 4)], 3)
    assert _table(slots) == [(0, "a", 0, 2, 0, 2, 3), (1, "a", 1, 2, 0, 1, 3), (2, "b", 0, 1, 1, 2, 3)]


def test_assign_ranks_heterogeneous_cross_is_per_local_rank_as_horovod():
    # Horovod: cross_size = hosts holding this local_rank; cross_rank = index among them.
    slots = assign_ranks([Host("a", 1), Host("b", 2), Host("c", 3)], 6)
    assert _table(slots) == [
        (0, "a", 0, 1, 0, 3, 6),
        (1, "b", 0, 2, 1, 3, 6), (2, "b", 1, 2, 0, 2, 6),
        (3, "c", 0, 3, 2, 3, 6), (4, "c", 1, 3, 1, 2, 6), (5, "c", 2, 3, 0, 1, 6),
    ]


def test_assign_ranks_invariants_over_many_layouts():
    import itertools
    for counts in itertools.product([1, 2, 3], repeat=3):
        hosts = [Host(f"h{i}", n) for i, n in enumerate(counts)]
        for np_ in range(1, sum(counts) + 1):
            slots = assign_ranks(hosts, np_)
            assert [s.rank for s in slots] == list(range(np_))
            for s in slots:
                same_host = [t for t in slots if t.host == s.host]
                assert s.local_size == len(same_host)
                assert sorted(t.local_rank for t in same_host) == list(range(len(same_host)))
                peers = [t for t in slots if t.local_rank == s.local_rank]
                assert s.cross_size == len(peers)
                assert sorted(t.cross_rank for t in peers) == list(range(len(peers)))


def test_assign_ranks_too_many_processes_says_how_many_slots():
    with pytest.raises(HostsError) as e:
        assign_ranks([Host("a", 2), Host("b", 1)], 4)
    msg = str(e.value)
    assert "-np 4" in msg and "3 slots on 2 hosts" in msg and "a:2,b:1" in msg
    with pytest.raises(HostsError, match="at least 1"):
        assign_ranks([Host("a", 2)], 0)


@pytest.mark.parametrize("entry, words", [
    ("localhost:2:3", ["'localhost:2:3' is not a host name", "[address]:slots"]),
    ("a:b:c", ["'a:b:c' is not a host name"]),
    ("[::1]:2:3", ["whole number", "'2:3'"]),
    ("localhost:1_0", ["whole number", "'1_0'"]),
    ("localhost:\u0662", ["whole number"]),
    ("localhost:+3", ["whole number"]),
    ("localhost:" + "9" * 5000, ["whole number"]),
])
def test_hosts_and_slots_are_parsed_strictly_in_h_hostfiles_and_discovery(entry, words):
    from appliance.launcher.elastic.discovery import DiscoveryError, parse_hosts_output
    from appliance.launcher.hosts import shown

    with pytest.raises(HostsError) as e:
        parse_hosts(f"good:1,{entry}")
    assert "entry 2" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    host, _, slots = entry.rpartition(":") if not entry.startswith("localhost:2") and entry.count(":") == 1 else (
        entry, "", "")
    hostfile_line = f"{host} slots={slots}" if slots else entry
    with pytest.raises(HostsError) as e:
        parse_hostfile(f"good slots=1\n{hostfile_line}\n", "hosts.txt")
    assert str(e.value).startswith("hosts.txt:2:") and shown(hostfile_line) in str(e.value), str(e.value)
    assert len(str(e.value)) < 600
    with pytest.raises(DiscoveryError) as e:
        parse_hosts_output(f"good:1\n{entry}\n", "host discovery script d.sh")
    assert "host discovery script d.sh, line 2" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_ipv6_addresses_still_pass_bare_or_in_brackets():
    assert parse_hosts("::1,[fe80::1%eth0]:2,[::ffff:10.0.0.1]:3") == [
        Host("::1", 1), Host("fe80::1%eth0", 2), Host("::ffff:10.0.0.1", 3)]
    assert parse_hostfile("::1 slots=2\n", "f") == [Host("::1", 2)]


@pytest.mark.timeout(20)
def test_a_hostfile_that_is_not_a_regular_file_is_refused_never_waited_on(tmp_path):
    import os

    fifo = tmp_path / "hosts.fifo"
    os.mkfifo(fifo)
    with pytest.raises(HostsError, match="no hosts in the file"):
        read_hostfile(fifo)  # no writer: empty at once, never waited on
    r, w = os.pipe()  # --hostfile <(echo ...): a pipe with its writer is read
    os.write(w, b"h1 slots=2\n")
    os.close(w)
    try:
        assert read_hostfile(f"/proc/self/fd/{r}") == [Host("h1", 2)]
    finally:
        os.close(r)
    for path, words in ((tmp_path, "not a regular file or a pipe"), ("/dev/zero", "not a regular file or a pipe")):
        with pytest.raises(HostsError) as e:
            read_hostfile(path)
        assert str(path) in str(e.value) and words in str(e.value), str(e.value)
    bad = tmp_path / "latin1"
    bad.write_bytes(b"h\xe9 slots=1\n")
    with pytest.raises(HostsError, match="not text"):
        read_hostfile(bad)
