"""Slurm's compressed host lists and task counts -> hosts and slots (pure parsing)."""
import re

import pytest

from appliance.common.ranks import Slot
from appliance.common.slurm import (
    SlurmAllocation, SlurmEnvError, SlurmTask, default_secret_file, expand_nodelist, expand_tasks_per_node, store_port,
)
from appliance.launcher.config import LaunchConfig
from appliance.launcher.hosts import Host, HostsError, allocation_hosts, assign_ranks, hosts_from
from appliance.launcher.run import hosts_of


def slurm_hosts(nodelist, tasks_per_node=None, ntasks_per_node=None):
    return allocation_hosts(SlurmAllocation(nodelist, tasks_per_node, ntasks_per_node))


@pytest.mark.parametrize("spec, names", [
    ("node1", ["node1"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[3]", ["gpu3"]),
    ("[1-2]x", ["1x", "2x"]),
    ("10.0.0.[2-3]", ["10.0.0.2", "10.0.0.3"]),
    (" n[1-2] , m ", ["n1", "n2", "m"]),
])
def test_expand_nodelist(spec, names):
    assert expand_nodelist(spec) == names


@pytest.mark.parametrize("spec, words", [
    ("n[1-2", "missing ']'"),
    ("n1-2]", "unbalanced ']'"),
    ("n[[1]]", "nested"),
    ("n[3-1]", "runs backwards"),
    ("n[a-b]", "not a number"),
    ("n[1-]", "not a number"),
    ("a,,b", "empty entry"),
    ("", "empty entry"),
    ("n[1-9999999]", "too large"),
])
def test_expand_nodelist_errors(spec, words):
    with pytest.raises(SlurmEnvError) as e:
        expand_nodelist(spec)
    assert words in str(e.value) and "SLURM_JOB_NODELIST" in str(e.value)
    with pytest.raises(HostsError) as e:  # as the launcher's hosts
        slurm_hosts(spec)
    assert words in str(e.value) and "SLURM_JOB_NODELIST" in str(e.value)


def test_tasks_per_node():
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4") == [4]
    assert expand_tasks_per_node("1,2(x2),3") == [1, 2, 2, 3]
    for bad in ["2(3)", "x", "0", "2(x0)", ""]:
        with pytest.raises(SlurmEnvError, match="SLURM_TASKS_PER_NODE"):
            expand_tasks_per_node(bad)
    for bad in ["2(3)", "x", "0", "2(x0)"]:  # as the launcher's hosts ("" there: not set)
        with pytest.raises(HostsError, match="SLURM_TASKS_PER_NODE"):
            slurm_hosts("a", bad)


def test_slurm_hosts_sources_of_slots():
    assert slurm_hosts("node[01-03,07]", "2(x3),1") == [
        Host("node01", 2), Host("node02", 2), Host("node03", 2), Host("node07", 1)]
    assert slurm_hosts("a,b", None, "3") == [Host("a", 3), Host("b", 3)]
    assert slurm_hosts("a,b", "2(x2)", "7") == [Host("a", 2), Host("b", 2)]  # the allocation wins
    assert slurm_hosts("a,b") == [Host("a", 1), Host("b", 1)]
    with pytest.raises(HostsError, match="gives 3 counts for 2 nodes"):
        slurm_hosts("a,b", "1(x3)")
    with pytest.raises(HostsError, match="more than once"):
        slurm_hosts("a,a")
    with pytest.raises(HostsError, match="is not a host name"):
        slurm_hosts("a,b@c")


def test_host_source_order_and_layout():
    slurm = SlurmAllocation.from_env({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    assert hosts_from("x:1", None, slurm, 4) == [Host("x", 1)]          # -H wins
    assert hosts_from(None, None, slurm, 4) == [Host("n1", 2), Host("n2", 2)]
    assert hosts_from(None, None, SlurmAllocation(), 3) == [Host("localhost", 3)]
    slots = assign_ranks(hosts_from(None, None, slurm, 4), 4)
    assert [(s.host, s.local_rank, s.cross_rank) for s in slots] == [("n1", 0, 0), ("n1", 1, 0), ("n2", 0, 1), ("n2", 1, 1)]
    c = LaunchConfig.create(["p"], 3, environ={"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NTASKS_PER_NODE": "1"})
    assert hosts_of(c) == [Host("n1", 1), Host("n2", 1), Host("n3", 1)]
    c = LaunchConfig.create(["p"], 3, hosts="h:3", environ={"SLURM_JOB_NODELIST": "n[1-3]"})
    assert hosts_of(c) == [Host("h", 3)]


def _task_env(**over):
    env = dict(SLURM_STEP_ID="3", SLURM_PROCID="0", SLURM_NTASKS="3", SLURM_LOCALID="0", SLURM_NODEID="0",
               SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_TASKS_PER_NODE="2,1", SLURM_JOB_ID="41",
               SLURMD_NODENAME="node1")
    env.update(over)
    return env


def test_slurm_task_layout_uneven_nodes():
    # srun -n3 on node[1-2] with 2,1 tasks: ranks 0,1 on node1 and 2 on node2
    t0 = SlurmTask.from_env(_task_env())
    t1 = SlurmTask.from_env(_task_env(SLURM_PROCID="1", SLURM_LOCALID="1"))
    t2 = SlurmTask.from_env(_task_env(SLURM_PROCID="2", SLURM_NODEID="1", SLURMD_NODENAME="node2"))
    assert (t0.rank, t0.local_rank, t0.local_size, t0.cross_rank, t0.cross_size) == (0, 0, 2, 0, 2)
    assert (t1.rank, t1.local_rank, t1.local_size, t1.cross_rank, t1.cross_size) == (1, 1, 2, 0, 1)
    assert (t2.rank, t2.local_rank, t2.local_size, t2.cross_rank, t2.cross_size) == (2, 0, 1, 1, 2)
    assert t2.first_node == "node1" and t2.node == "node2" and t2.nodes == ("node1", "node2")
    assert t0.store_port == t2.store_port == store_port(41, 3)


def test_a_slurm_task_is_the_slot_the_launcher_lays_out():
    # the same uneven layout, read by each task from Slurm and laid out by the launcher: one type, one rule
    tasks = [SlurmTask.from_env(_task_env(SLURM_PROCID=str(r), SLURM_LOCALID=str(lr), SLURM_NODEID=str(n),
                                          SLURMD_NODENAME=f"node{n + 1}"))
             for r, (n, lr) in enumerate([(0, 0), (0, 1), (1, 0)])]
    slots = assign_ranks(hosts_from(None, None, SlurmAllocation("node[1-2]", "2,1"), 3), 3)
    assert all(isinstance(t, Slot) for t in tasks)
    assert [Slot(**{f: getattr(t, f) for f in Slot.__dataclass_fields__}) for t in tasks] == slots


def test_slurm_task_is_not_a_batch_script():
    env = _task_env()
    del env["SLURM_STEP_ID"]  # sbatch's batch script: SLURM_PROCID=0 but no step
    assert SlurmTask.from_env(env) is None
    assert SlurmTask.from_env({}) is None


def test_store_ports_differ_between_steps_and_jobs():
    ports = {store_port(job, step) for job in range(100, 110) for step in range(3)}
    assert len(ports) == 30 and all(20000 <= p < 30000 for p in ports)


@pytest.mark.parametrize("over, words", [
    (dict(SLURM_PROCID="x"), "SLURM_PROCID='x' is not a whole number"),
    (dict(SLURM_NTASKS="4"), "do not add up"),
    (dict(SLURM_STEP_TASKS_PER_NODE="1(x3)"), "gives 3 counts for 2 nodes"),
    (dict(SLURM_LOCALID="2"), "not a task of"),
    (dict(SLURM_JOB_ID=""), "SLURM_JOB_ID is not set"),
    (dict(SLURM_STEP_NODELIST="node[1-"), "missing ']'"),
])
def test_slurm_task_errors_name_the_variable(over, words):
    with pytest.raises(SlurmEnvError, match=re.escape(words)):
        SlurmTask.from_env(_task_env(**over))


def test_default_secret_file_is_per_job_under_home():
    assert default_secret_file(41, {"HOME": "/shared/home/u"}) == "/shared/home/u/.appliance/slurm/job-41.secret"
