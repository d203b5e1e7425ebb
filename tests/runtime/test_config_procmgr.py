"""Where ``RuntimeConfig.from_env`` asks the process manager (pure logic: the exchange itself is a
stand-in here; tests/runtime/test_mpirun_lines.py and test_hydra.py run the real ones)."""
from __future__ import annotations

import pytest

from appliance.common.knobs import ConfigError
from appliance.common.slurm import SlurmTask
from appliance.runtime.config import RuntimeConfig
from appliance.runtime.procmgr import Bootstrap

SECRET = "ab" * 16


def fake(calls):
    def boot(env, rank, size):
        calls.append((rank, size))
        return Bootstrap(store_addr="10.1.2.3:4567", secret_hex=SECRET, data_addr="10.1.2.9",
                         note="rank 0 on h0 chose 10.1.2.3:4567 (interface eth1, from btl_tcp_if_include)")
    return boot


def test_mpirun_ranks_take_store_secret_and_address_from_the_process_manager():
    calls = []
    cfg = RuntimeConfig.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, procmgr=fake(calls))
    assert calls == [(1, 2)]
    assert (cfg.store_host, cfg.store_port, cfg.secret, cfg.data_addr) == ("10.1.2.3", 4567, bytes.fromhex(SECRET),
                                                                             "10.1.2.9")
    assert cfg.manager == "mpirun" and "interface eth1" in cfg.store_note


def test_given_store_address_or_our_launcher_never_ask_it():
    calls = []
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "APPLIANCE_STORE_ADDR": "a:1",
           "APPLIANCE_JOB_SECRET": SECRET}
    cfg = RuntimeConfig.from_env(env, procmgr=fake(calls))
    assert (cfg.store_host, cfg.manager) == ("a", "")
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "APPLIANCE_STORE_ADDR": "a:1", "APPLIANCE_JOB_SECRET": SECRET,
           "PMIX_RANK": "0", "PMI_RANK": "0", "PMI_SIZE": "2"}
    RuntimeConfig.from_env(env, procmgr=fake(calls))
    assert RuntimeConfig.from_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
                                  procmgr=fake(calls)).size == 1
    assert calls == []  # a single rank needs no store either


def test_hydra_ranks_and_srun_keeps_priority_over_pmi(tmp_path):
    calls = []
    cfg = RuntimeConfig.from_env({"PMI_RANK": "2", "PMI_SIZE": "3"}, procmgr=fake(calls))
    assert (cfg.rank, cfg.size, cfg.manager) == (2, 3, "hydra") and calls == [(2, 3)]
    slurm = {"HOME": str(tmp_path), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
             "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1",
             "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n1",
             "SLURM_TASKS_PER_NODE": "2", "PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "5",
             "APPLIANCE_JOB_SECRET": SECRET}
    cfg = RuntimeConfig.from_env(slurm, slurm=SlurmTask.from_env, procmgr=fake(calls))
    assert (cfg.store_host, cfg.manager) == ("n1", "") and calls == [(2, 3)]


def test_process_manager_failures_name_the_rank_and_manager():
    def broken(env, rank, size):
        raise ConfigError("PMIx_Init failed: UNREACHABLE (-25)")
    with pytest.raises(ConfigError, match=r"^rank 1 of 2 under mpirun: PMIx_Init failed"):
        RuntimeConfig.from_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, procmgr=broken)
    with pytest.raises(ConfigError, match=r"^PMI_RANK='x' is not a whole number"):
        RuntimeConfig.from_env({"PMI_RANK": "x", "PMI_SIZE": "2"}, procmgr=broken)


@pytest.mark.parametrize("env, line", [
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "abc"}, "OMPI_COMM_WORLD_SIZE='abc' is not a whole number"),
    ({"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE is not set though OMPI_COMM_WORLD_RANK='1' is"),
    ({"OMPI_COMM_WORLD_RANK": "x1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK='x1' is not a whole number"),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2"),
    ({"OMPI_COMM_WORLD_RANK": "-1", "OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_RANK=-1 is negative"),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, "PMI_SIZE=0 is not a job size (at least 1)"),
    ({"PMI_RANK": "0", "PMI_SIZE": ""}, "PMI_SIZE is empty though PMI_RANK='0' is"),
    ({"HOROVOD_RANK": "3", "HOROVOD_SIZE": "2"}, "HOROVOD_RANK=3 is not below HOROVOD_SIZE=2"),
])
def test_layout_names_the_variable_as_its_origin_set_it(env, line):
    with pytest.raises(ConfigError) as e:
        RuntimeConfig.from_env(env, procmgr=fake([]))
    assert str(e.value).startswith(line), str(e.value)


def test_one_origin_table_in_its_order():
    from appliance.runtime.config import ORIGINS, layout, origin
    assert [o.name for o in ORIGINS] == ["launcher", "mpirun", "srun", "hydra", "alone"]
    both = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}
    assert origin(both).name == "launcher" and layout(both)[1:3] == (1, 2)
    assert origin({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}).name == "srun"
    assert origin({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1"}, srun=False).name == "hydra"
    assert layout({})[0].name == "alone" and layout({})[1:3] == (0, 1)
    assert origin({"PMI_SIZE": "2", "PMI_RANK": "1"}).manager == "hydra"
