"""The ``horovod`` compatibility package (shim/horovod) without ranks: every module path
Horovod scripts import, Horovod 0.28.1's names, ``__version__``, the timeline through the shim,
the framework-free helpers, and install_horovod.py (which never shadows a real Horovod).
Each check runs in a fresh interpreter with the shim's directory on sys.path."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures import ROOT

SHIM = ROOT / "shim"
INSTALLER = SHIM / "install_horovod.py"

MODULES = """horovod horovod.torch horovod.torch.mpi_ops horovod.torch.functions horovod.torch.optimizer
horovod.torch.compression horovod.torch.elastic horovod.torch.sync_batch_norm horovod.common
horovod.common.exceptions horovod.common.util horovod.common.process_sets horovod.common.basics
horovod.common.elastic horovod.torch.elastic.state horovod.torch.elastic.sampler
horovod.runner horovod.runner.util horovod.runner.util.threads horovod.runner.common horovod.runner.common.util
horovod.runner.common.util.env""".split()

# Horovod 0.28.1: horovod/torch/__init__.py's exports (all of them now), the extra public names of
# horovod/torch/mpi_ops.py, and those of the framework-free modules.
TORCH_NAMES = """elastic Compression allgather_object broadcast_object broadcast_optimizer_state
broadcast_parameters allreduce allreduce_async allreduce_ allreduce_async_ grouped_allreduce
grouped_allreduce_async grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather
allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async broadcast_
broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async grouped_reducescatter
grouped_reducescatter_async join barrier poll synchronize init shutdown is_initialized start_timeline
stop_timeline size local_size cross_size rank local_rank cross_rank mpi_threads_supported mpi_enabled
mpi_built gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built rocm_built ProcessSet
global_process_set add_process_set remove_process_set Average Sum Adasum Min Max Product
HorovodInternalError DistributedOptimizer SyncBatchNorm""".split()
MPI_OPS_NAMES = """Compression HorovodAllreduce HorovodGroupedAllreduce HorovodAllgather HorovodGroupedAllgather
HorovodBroadcast HorovodAlltoall HorovodReducescatter HorovodGroupedReducescatter
handle_average_backwards_compatibility is_homogeneous HorovodInternalError ProcessSet global_process_set""".split()
OTHER_NAMES = {
    "horovod.common.exceptions": "HorovodInternalError HostsUpdatedInterrupt HorovodVersionMismatchError "
                                 "get_version_mismatch_message",
    "horovod.common.util": "env get_average_backwards_compatibility_fun num_rank_is_power_2 split_list is_iterable "
                           "check_extension extension_available gpu_available mpi_built gloo_built nccl_built "
                           "ddl_built ccl_built check_installed_version is_version_greater_equal_than",
    "horovod.common.process_sets": "ProcessSet global_process_set add_process_set remove_process_set",
    "horovod.common.basics": "HorovodBasics",
    "horovod.runner": "run",
    "horovod.runner.util.threads": "execute_function_multithreaded in_thread on_event",
    "horovod.runner.common.util.env": "get_env_rank_and_size",
    "horovod.torch.elastic": "run State ObjectState TorchState ElasticSampler",
    "horovod.torch.elastic.state": "TorchState ObjectState get_handler_registry set_handler_registry",
    "horovod.common.elastic": "State ObjectState run_fn",
    "horovod": "run __version__",
}


def py(code: str, *, path=(SHIM,), timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [str(ROOT)])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd="/")


def ok(code: str, **kw) -> str:
    p = py(code, **kw)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout


def test_every_module_path_imports_and_every_name_exists():
    pytest.importorskip("torch")
    out = ok(f"""
        import importlib
        missing = []
        for m in {MODULES!r}:
            importlib.import_module(m)
        import horovod.torch as hvd, horovod.torch.mpi_ops as mo
        missing += ["horovod.torch." + n for n in {TORCH_NAMES!r} if not hasattr(hvd, n)]
        missing += ["horovod.torch.mpi_ops." + n for n in {MPI_OPS_NAMES!r} if not hasattr(mo, n)]
        for m, names in {OTHER_NAMES!r}.items():
            mod = importlib.import_module(m)
            missing += [m + "." + n for n in names.split() if not hasattr(mod, n)]
        print("MISSING", missing)
    """)
    assert out.strip().splitlines()[-1] == "MISSING []"


def test_one_runtime_state_and_the_versions():
    pytest.importorskip("torch")
    ok("""
        import appliance, appliance.torch as a, horovod, horovod.torch as hvd
        import horovod.torch.mpi_ops, horovod.torch.elastic, horovod.common.exceptions as ex
        from horovod.common.process_sets import global_process_set
        assert hvd is a and hvd.init is a.init and horovod.torch.mpi_ops is a.mpi_ops
        assert horovod.torch.elastic is a.elastic and global_process_set is a.global_process_set
        assert ex.HorovodInternalError is hvd.HorovodInternalError and issubclass(ex.HorovodInternalError, RuntimeError)
        assert str(ex.HorovodInternalError()) == "" and ex.HostsUpdatedInterrupt(True).skip_sync is True
        assert hvd.mpi_ops.Compression is hvd.Compression and hvd.mpi_ops.Compression.none.compress(1) == (1, None)
        assert horovod.__version__ == "0.28.1" and appliance.__version__ != "0.28.1"
        import horovod.common.basics as b
        hb = b.HorovodBasics("/x/mpi_ops.py", "mpi_lib_v2")
        assert not hb.is_initialized() and hb.Sum == hvd.Sum and hb.mpi_built() is False
        hvd.init(); assert hb.rank() == 0 and hb.size() == 1 and hb.is_homogeneous(); hvd.shutdown()
    """)


def test_timeline_through_the_shim_writes_a_complete_file(tmp_path):
    pytest.importorskip("torch")
    out = ok(f"""
        import json, torch
        import horovod.torch as hvd
        from horovod.common.basics import HorovodBasics
        try:
            hvd.start_timeline({str(tmp_path / "early.json")!r})
        except ValueError:
            print("VALUEERROR before init")  # as Horovod
        hvd.init()
        for i, start in enumerate([hvd.start_timeline, HorovodBasics().start_timeline]):
            path = {str(tmp_path)!r} + f"/t{{i}}.json"
            start(path, mark_cycles=True)
            hvd.allreduce(torch.ones(3), name=f"w{{i}}")
            HorovodBasics().stop_timeline(); hvd.stop_timeline()
            names = [e["args"]["name"] for e in json.load(open(path)) if e.get("name") == "process_name" and e["pid"]]
            print("NAMES", names)
        hvd.shutdown()
    """)
    assert "VALUEERROR before init" in out and "NAMES ['w0']" in out and "NAMES ['w1']" in out, out


def test_sync_batch_norm_and_elastic_on_one_rank():
    pytest.importorskip("torch")
    ok("""
        import torch, horovod.torch as hvd
        from horovod.common.elastic import ObjectState
        from horovod.torch.elastic.state import TorchState
        assert TorchState is hvd.elastic.TorchState and issubclass(hvd.elastic.ObjectState, ObjectState)
        hvd.init()
        bn, ref = hvd.SyncBatchNorm(3), torch.nn.BatchNorm2d(3)
        assert isinstance(bn, torch.nn.modules.batchnorm._BatchNorm)
        x = torch.randn(4, 3, 2, 2)
        assert torch.allclose(bn(x), ref(x)) and torch.allclose(bn.running_var, ref.running_var)
        state = TorchState(model=torch.nn.Linear(2, 2), epoch=0)
        w = state.model.weight.detach().clone()
        def train(state):
            state.epoch = 1
            state.commit()
            state.epoch = 2
            with torch.no_grad():
                state.model.weight.add_(1)
            raise hvd.HorovodInternalError("x")
        try:
            hvd.elastic.run(train)(state)
        except hvd.HorovodInternalError:
            pass
        assert state.epoch == 1 and torch.equal(state.model.weight, w)
        hvd.shutdown()
    """)


def test_threads_and_util_helpers():
    out = ok("""
        import os, threading, time
        import sys; assert "torch" not in sys.modules
        from horovod.runner.util.threads import execute_function_multithreaded, in_thread, on_event
        from horovod.common.util import env, get_average_backwards_compatibility_fun, num_rank_is_power_2, split_list
        seen = set()
        def square(x, y):
            seen.add(threading.get_ident()); time.sleep(0.05); return x * x + y
        assert execute_function_multithreaded(square, [[i, 1] for i in range(6)]) == {i: i * i + 1 for i in range(6)}
        assert len(seen) > 1
        assert execute_function_multithreaded(square, [[1, 1]], block_until_all_done=False) is None
        def boom(i):
            if i == 2: raise KeyError("x")
            return i
        try:
            execute_function_multithreaded(boom, [[i] for i in range(3)])
        except RuntimeError as e:
            assert "boom" in str(e) and isinstance(e.__cause__, KeyError)
        else:
            raise AssertionError("no RuntimeError")
        try:
            in_thread(print, args=[1])
        except ValueError: pass
        else: raise AssertionError("list args accepted")
        ev, hits = threading.Event(), []
        t = on_event(ev, hits.append, args=(7,)); ev.set(); t.join(5); assert hits == [7]
        os.environ.pop("HVD_SHIM_T", None)
        with env(HVD_SHIM_T="1", HVD_SHIM_U=None):
            assert os.environ["HVD_SHIM_T"] == "1" and "HVD_SHIM_U" not in os.environ
        assert "HVD_SHIM_T" not in os.environ
        class Ops: Average, Sum = 0, 1
        f = get_average_backwards_compatibility_fun(Ops)
        assert (f(None, None), f(None, False), f(5, None)) == (0, 1, 5)
        try: f(1, True)
        except ValueError: pass
        else: raise AssertionError("op and average together accepted")
        assert [num_rank_is_power_2(n) for n in (0, 1, 2, 3, 4)] == [False, True, True, False, True]
        assert split_list(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
        print("DONE")
    """)
    assert "DONE" in out


def _installer(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(INSTALLER), *args], capture_output=True, text=True, timeout=60,
                          cwd="/")


def _import_from_site(site: Path) -> str:
    """What ``import horovod`` finds when ``site`` is a site directory (its .pth files processed)."""
    return ok(f"""
        import site; site.addsitedir({str(site)!r})
        import horovod; print(horovod.__file__); print(getattr(horovod, "__version__", "none"))
    """, path=())


def test_installer_installs_behind_site_packages_and_uninstalls(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    p = _installer("--target", str(site))
    assert p.returncode == 0, p.stderr
    assert (site / "appliance-horovod-shim.pth").exists()
    where, version = _import_from_site(site).split()
    assert where == str(site / "appliance_horovod_shim" / "horovod" / "__init__.py") and version == "0.28.1"
    assert _installer("--target", str(site), "--uninstall").returncode == 0
    assert not (site / "appliance_horovod_shim").exists() and not (site / "appliance-horovod-shim.pth").exists()


def test_installer_never_shadows_a_real_horovod(tmp_path):
    site = tmp_path / "site-packages"
    (site / "horovod").mkdir(parents=True)
    (site / "horovod" / "__init__.py").write_text("__version__ = 'real-0.28.1'\n")
    p = _installer("--target", str(site))
    assert p.returncode == 1 and str(site / "horovod") in p.stderr
    assert not (site / "appliance-horovod-shim.pth").exists()
    # forced, the shim is installed but the real Horovod still wins the import
    assert _installer("--target", str(site), "--force").returncode == 0
    where, version = _import_from_site(site).split()
    assert where == str(site / "horovod" / "__init__.py") and version == "real-0.28.1"
