"""The manifests in deploy/kubernetes: every one is an object the cluster accepts, and runs the appliance.

Each YAML document there is checked three ways (default tier: no Docker, no cluster):

1. Against the ``openAPIV3Schema`` of the CRD that serves its ``apiVersion`` and ``kind`` (copies of
   the MPI Operator's and Kubeflow Trainer's CRDs in ``tests/k8s/crds``, see the README there),
   with jsonschema's Draft 4 validator (OpenAPI 3.0's schema object is Draft 4's, extended). The
   Kubernetes extensions are turned into what the API server does with them: an object with
   ``properties`` refuses unknown fields (kubectl's default, strict field validation; a
   ``x-kubernetes-preserve-unknown-fields`` object keeps them), ``x-kubernetes-int-or-string``
   takes an integer or a string (a quantity's ``pattern`` then applies to the string),
   ``nullable`` admits null, ``x-kubernetes-list-type: map``/``set`` refuses duplicate keys/items,
   and ``format: int32``/``int64`` bound integers. A document whose ``apiVersion``/``kind`` no CRD
   here serves is refused.
2. What the API server and the controllers refuse beyond the schema, where it is cheap:
   ``metadata.name`` a DNS-1123 subdomain; pod hostnames (``<job>-worker-<i>``,
   ``<job>-launcher``, Trainer's ``<job>-<rjob>-0-<i>``) DNS-1123 labels; container and volume
   names DNS-1123 labels, unique in their pod; every volumeMount naming a volume; every container
   having an image; the MPI Operator's own validation (a Launcher replica spec with 1 replica,
   Worker replicas >= 1, restartPolicy Never or OnFailure).
3. The appliance's contract: the images are ones build.sh makes, pods run as mpiuser (uid 1000)
   with the key mounted at /home/mpiuser/.ssh, workers run the image's non-root sshd (an elastic
   job's with a preStop hook), the launcher's line parses with the image's own horovodrun parser
   (and the default job's flags with its own), takes no -H/--hostfile, and its -np (or
   --min-np/--max-np/--slots-per-host) matches the slots the job gets.

Not covered (these need a real API server or the controllers' webhooks): the CRDs' CEL rules
(``x-kubernetes-validations``; those that concern these manifests are restated in 2 and 3:
numProcPerNode >= 1, one ML policy), defaulting, the rest of ObjectMeta and PodSpec validation
(label syntax, resource names, probe and securityContext semantics), and admission by JobSet.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from appliance.examples import train
from appliance.hvdcompat import horovodrun
from fixtures import ROOT

CRDS = Path(__file__).resolve().parent / "crds"
MANIFESTS = ROOT / "deploy" / "kubernetes"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml: the CRDs are ~600 KB each

# What build.sh makes (`bash build.sh` / `bash build.sh --cpu`): the names the re-enactment runs.
IMAGES = {"appliance:gpu", "appliance:cpu"}
MPIUSER = 1000
SSH_PATH = "/home/mpiuser/.ssh"
SSHD = ["/usr/sbin/sshd", "-De", "-f", "/home/mpiuser/.sshd_config"]
DISCOVERY = "/etc/mpi/discover_hosts.sh"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


# ---------------------------------------------------------------------------------------------
# 1. The CRD schemas, as the API server reads them.

def _structural(s: dict) -> dict:
    """An OpenAPI v3 structural schema as a Draft 4 JSON schema with the API server's semantics."""
    s = dict(s)
    s.pop("description", None)
    if "properties" in s:
        s["properties"] = {name: _structural(sub) for name, sub in s["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(s.get(key), dict):
            s[key] = _structural(s[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in s:
            s[key] = [_structural(sub) for sub in s[key]]
    if s.get("x-kubernetes-int-or-string"):
        s.pop("type", None)
        s.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if s.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if s.get("x-kubernetes-embedded-resource"):
        props = s.setdefault("properties", {})
        for name, kind in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
            props.setdefault(name, {"type": kind})
    if ("properties" in s and "additionalProperties" not in s
            and not s.get("x-kubernetes-preserve-unknown-fields")):
        s["additionalProperties"] = False   # strict field validation: an unknown field is an error
    return s


def _list_type(validator, list_type, instance, schema):
    if not validator.is_type(instance, "array"):
        return
    seen = set()
    keys = schema.get("x-kubernetes-list-map-keys", [])
    for item in instance:
        if list_type == "map" and isinstance(item, dict):
            key = json.dumps({k: item.get(k) for k in keys}, sort_keys=True)
        elif list_type == "set":
            key = json.dumps(item, sort_keys=True)
        else:
            continue
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry {key} in a list of type {list_type}")
        seen.add(key)


FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("int32")(lambda v: not isinstance(v, int) or -2**31 <= v < 2**31)
FORMATS.checks("int64")(lambda v: not isinstance(v, int) or -2**63 <= v < 2**63)
Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})


@functools.lru_cache(maxsize=None)
def validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> a validator, for every served version of every CRD in tests/k8s/crds."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schema = _structural(version["schema"]["openAPIV3Schema"])
                Validator.check_schema(schema)
                out[(f"{group}/{version['name']}", kind)] = Validator(schema, format_checker=FORMATS)
    return out


def _where(path) -> str:
    return ".".join(str(p) for p in path) or "(top)"


def schema_errors(doc: dict) -> list[str]:
    key = (doc.get("apiVersion"), doc.get("kind"))
    validator = validators().get(key)
    if validator is None:
        served = ", ".join(f"{v} {k}" for v, k in sorted(validators()))
        return [f"no CRD here serves apiVersion {key[0]!r} kind {key[1]!r} (served: {served})"]
    return [f"{_where(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


# ---------------------------------------------------------------------------------------------
# 2. What the API server and the controllers refuse beyond the schema.

def pod_specs(doc: dict) -> dict[str, dict]:
    """The pod templates' specs of a document, by a readable role name."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "MPIJob":
        return {role: (((rs or {}).get("template") or {}).get("spec") or {})
                for role, rs in (spec.get("mpiReplicaSpecs") or {}).items()}
    if doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
        jobs = ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
        return {rj.get("name", "?"): ((((rj.get("template") or {}).get("spec") or {})
                                       .get("template") or {}).get("spec") or {}) for rj in jobs}
    return {}


def _label(name: str, what: str) -> list[str]:
    if len(name) > 63 or not DNS1123_LABEL.match(name):
        return [f"{what} {name!r} is not a DNS-1123 label (lower case letters, digits, '-', at most 63)"]
    return []


def _nulls(node, path=()) -> list[str]:
    if node is None:
        return [f"{_where(path)}: empty value (the API server drops it without a word)"]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [e for k, v in items for e in _nulls(v, (*path, k))]


def cluster_errors(doc: dict) -> list[str]:
    errs = []
    name = (doc.get("metadata") or {}).get("name", "")
    if len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        errs.append(f"metadata.name {name!r} is not a DNS-1123 subdomain")
    for role, pod in pod_specs(doc).items():
        containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
        if not pod.get("containers"):
            errs.append(f"{role}: the pod template has no containers")
        volumes = [v.get("name", "") for v in pod.get("volumes") or []]
        for n in volumes:
            errs += _label(n, f"{role}: volume name")
        names = [c.get("name", "") for c in containers]
        for n in names:
            errs += _label(n, f"{role}: container name")
        for dup in sorted({n for n in names if names.count(n) > 1} | {n for n in volumes if volumes.count(n) > 1}):
            errs.append(f"{role}: the name {dup!r} is used twice in one pod")
        for c in containers:
            if not c.get("image"):
                errs.append(f"{role}: container {c.get('name')!r} has no image")
            for m in c.get("volumeMounts") or []:
                if m.get("name") not in volumes:
                    errs.append(f"{role}: container {c.get('name')!r} mounts volume {m.get('name')!r}, "
                                "which the pod does not define")
    spec = doc.get("spec") or {}
    if doc.get("kind") == "MPIJob":
        rs = spec.get("mpiReplicaSpecs") or {}
        workers = (rs.get("Worker") or {}).get("replicas", 1)
        if "Launcher" not in rs:
            errs.append("spec.mpiReplicaSpecs: the MPI Operator needs a Launcher replica spec")
        elif (rs["Launcher"] or {}).get("replicas", 1) != 1:
            errs.append("spec.mpiReplicaSpecs.Launcher.replicas must be 1")
        if "Worker" in rs and isinstance(workers, int) and workers < 1:
            errs.append("spec.mpiReplicaSpecs.Worker.replicas must be at least 1")
        for role, r in rs.items():
            if (r or {}).get("restartPolicy", "Never") not in ("Never", "OnFailure"):
                errs.append(f"spec.mpiReplicaSpecs.{role}.restartPolicy must be Never or OnFailure")
        if isinstance(workers, int):
            errs += _label(f"{name}-worker-{max(workers, 1) - 1}", "the worker pod hostname")
        errs += _label(f"{name}-launcher", "the launcher pod hostname")
    if doc.get("kind") == "TrainJob":
        nodes = (spec.get("trainer") or {}).get("numNodes", 1)
        if isinstance(nodes, int):
            errs += _label(f"{name}-node-0-{max(nodes, 1) - 1}", "the node pod hostname")
        errs += _label(f"{name}-launcher-0-0", "the launcher pod hostname")
    return errs


# ---------------------------------------------------------------------------------------------
# 3. The appliance's contract.

def _refusal(parse, argv: list[str]) -> str | None:
    """What argparse says when ``parse(argv)`` exits (its usage error), else None."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "refused"
    return None


def _mpirun_np(args: list[str]) -> str | None:
    for flag, value in zip(args, args[1:]):
        if flag in ("-np", "-n", "--np", "-c"):
            return value
    return None


def _launch_line_errors(what: str, line: list, slots_total: int, slots_per_host: int) -> list[str]:
    """The launcher's command line, read by the appliance's own parsers: horovodrun's (the same
    one the image runs), mpirun's -np, and the default job's flags."""
    line = [str(a) for a in line]
    if not line or line[0] not in ("horovodrun", "mpirun"):
        return [f"{what}: runs {line[:1]}, not horovodrun or mpirun"]
    if line[0] == "mpirun":
        np_, command = _mpirun_np(line[1:]), line[line.index("python"):] if "python" in line else []
        errs = [] if np_ == str(slots_total) else [f"{what}: -np is {np_}, but the job has {slots_total} slots"]
    else:
        refused = _refusal(horovodrun.parse, line[1:])
        if refused:
            return [f"{what}: horovodrun refuses {line[1:]}: {refused}"]
        parsed = horovodrun.parse(line[1:])
        f, command = parsed.flags, parsed.command
        errs = [f"{what}: horovodrun says: {m}" for m in [*parsed.errors, *parsed.warnings]]
        if f.hosts or f.hostfile:
            errs.append(f"{what}: horovodrun takes the hostfile the operator mounts; no -H/--hostfile")
        if f.min_np is None and f.max_np is None:
            if f.np != slots_total:
                errs.append(f"{what}: -np is {f.np}, but the job has {slots_total} slots")
        else:
            if f.host_discovery_script != DISCOVERY:
                errs.append(f"{what}: an elastic job discovers hosts with {DISCOVERY}")
            if f.slots_per_host != slots_per_host:
                errs.append(f"{what}: --slots-per-host must be {slots_per_host} (the slots of a worker)")
            if not (f.np and f.min_np and f.max_np and f.min_np <= f.np <= f.max_np):
                errs.append(f"{what}: needs --min-np <= -np <= --max-np")
            elif f.np > slots_total:
                errs.append(f"{what}: -np {f.np} is more than the {slots_total} slots it starts with")
    if command[:3] == ["python", "-m", "appliance.examples.train"]:
        refused = _refusal(train.parse_args, command[3:])
        if refused:
            errs.append(f"{what}: the default job refuses {command[3:]}: {refused}")
    elif command[:1] != ["python"]:
        errs.append(f"{what}: the command {command} does not start with python")
    return errs


def appliance_errors(doc: dict, docs: list[dict]) -> list[str]:
    errs = []
    spec = doc.get("spec") or {}
    for role, pod in pod_specs(doc).items():
        for c in pod.get("containers") or []:
            if c.get("image") not in IMAGES:
                errs.append(f"{role}: image {c.get('image')!r} is not one build.sh makes ({sorted(IMAGES)})")
            if ((c.get("securityContext") or {}).get("runAsUser")) != MPIUSER:
                errs.append(f"{role}: container {c.get('name')!r} must run as mpiuser (runAsUser {MPIUSER})")
        first = (pod.get("containers") or [{}])[0]
        line = [*(first.get("command") or []), *(first.get("args") or [])]
        if role in ("Worker", "node") and line != SSHD:
            errs.append(f"{role}: runs {line}, not the image's non-root sshd {SSHD}")
    if doc.get("kind") == "MPIJob":
        rs = spec.get("mpiReplicaSpecs") or {}
        slots, workers = spec.get("slotsPerWorker", 1), (rs.get("Worker") or {}).get("replicas", 1)
        if spec.get("sshAuthMountPath") != SSH_PATH:
            errs.append(f"spec.sshAuthMountPath must be {SSH_PATH} (pods run as mpiuser)")
        hosts = workers + (1 if spec.get("runLauncherAsWorker") else 0)
        launcher = ((rs.get("Launcher") or {}).get("template") or {}).get("spec") or {}
        first = (launcher.get("containers") or [{}])[0]
        line = [*(first.get("command") or []), *(first.get("args") or [])]
        errs += _launch_line_errors("Launcher", line, slots * hosts, slots)
        if "--min-np" in line or "--max-np" in line:
            for c in ((rs.get("Worker") or {}).get("template") or {}).get("spec", {}).get("containers", []):
                if not ((c.get("lifecycle") or {}).get("preStop")):
                    errs.append(f"Worker: container {c.get('name')!r} of an elastic job needs the preStop hook that "
                                "lets its ranks leave before Kubernetes stops sshd")
        for c in ((rs.get("Worker") or {}).get("template") or {}).get("spec", {}).get("containers", []):
            gpus = ((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
            if gpus is not None and int(gpus) != slots:
                errs.append(f"Worker: {gpus} GPUs but slotsPerWorker {slots}: one rank per GPU")
    if doc.get("kind") == "ClusterTrainingRuntime":
        mpi = (spec.get("mlPolicy") or {}).get("mpi") or {}
        if mpi.get("sshAuthMountPath") != SSH_PATH or mpi.get("numProcPerNode", 1) < 1:
            errs.append(f"mlPolicy.mpi: sshAuthMountPath must be {SSH_PATH}, numProcPerNode >= 1")
        for role, pod in pod_specs(doc).items():
            if (pod.get("securityContext") or {}).get("fsGroup") != MPIUSER:
                errs.append(f"{role}: fsGroup {MPIUSER} lets mpiuser read Trainer's 0640 root-owned key")
        launcher = (pod_specs(doc).get("launcher", {}).get("containers") or [{}])[0]
        per_node = mpi.get("numProcPerNode", 1)
        errs += _launch_line_errors("launcher", [*(launcher.get("command") or []), *(launcher.get("args") or [])],
                                    (spec.get("mlPolicy") or {}).get("numNodes", 1) * per_node, per_node)
    if doc.get("kind") == "TrainJob":
        ref = spec.get("runtimeRef") or {}
        runtimes = {d["metadata"]["name"]: d for d in docs if d.get("kind") == ref.get("kind", "ClusterTrainingRuntime")}
        runtime = runtimes.get(ref.get("name"))
        if runtime is None:
            return errs + [f"runtimeRef names {ref.get('name')!r}, which deploy/kubernetes does not ship"]
        policy = runtime["spec"]["mlPolicy"]
        trainer = spec.get("trainer") or {}
        nodes = trainer.get("numNodes", policy.get("numNodes", 1))
        per_node = trainer.get("numProcPerNode", policy["mpi"].get("numProcPerNode", 1))
        if not isinstance(per_node, int) or per_node < 1:
            errs.append("trainer.numProcPerNode must be an integer >= 1")
        elif "command" in trainer:
            errs += _launch_line_errors("trainer", [*trainer["command"], *(trainer.get("args") or [])],
                                        nodes * per_node, per_node)
    return errs


# ---------------------------------------------------------------------------------------------
# The tests.

def errors(doc: dict) -> list[str]:
    """Why the cluster or the appliance would refuse ``doc``; the checks of 2 and 3 run on a document
    whose fields have their schema's types (as the API server stops at the schema)."""
    errs = _nulls(doc) + schema_errors(doc)
    return errs or cluster_errors(doc) + appliance_errors(doc, ALL_DOCS)


def shipped() -> list[tuple[str, dict]]:
    return [(f"{p.name}#{i}" if i else p.name, d)
            for p in sorted(MANIFESTS.glob("**/*.y*ml"))
            for i, d in enumerate(yaml.safe_load_all(p.read_text()))]


SHIPPED = shipped()
ALL_DOCS = [d for _, d in SHIPPED]


def _base(name: str) -> dict:
    return copy.deepcopy(next(d for n, d in SHIPPED if n == name))


@pytest.mark.parametrize("name,doc", SHIPPED, ids=[n for n, _ in SHIPPED])
def test_a_shipped_manifest_is_accepted(name, doc):
    errs = errors(doc)
    assert not errs, f"deploy/kubernetes/{name}:\n  " + "\n  ".join(errs)


def test_the_folder_holds_every_kind_of_job_users_need():
    """horovodrun and mpirun fixed jobs, an elastic job, a GPU job, runLauncherAsWorker, and a
    Trainer runtime with a TrainJob on it."""
    found = set()
    for doc in ALL_DOCS:
        spec = doc.get("spec") or {}
        if doc["kind"] == "MPIJob":
            c = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
            line = [*c.get("command", []), *c.get("args", [])]
            found.add(line[0] + (" elastic" if "--min-np" in line else ""))
            workers = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
            found |= {"gpu" for w in workers if "nvidia.com/gpu" in (w.get("resources") or {}).get("limits", {})}
            found |= {"launcher as worker"} if spec.get("runLauncherAsWorker") else set()
        else:
            found.add(doc["kind"])
    need = {"horovodrun", "mpirun", "horovodrun elastic", "gpu", "launcher as worker",
            "ClusterTrainingRuntime", "TrainJob"}
    assert need <= found, f"deploy/kubernetes lacks: {sorted(need - found)}"


def _set(doc: dict, path, value) -> dict:
    """Set (or with DELETE remove) the field at ``path``: "a.b.0.c", or a tuple when a key has a dot."""
    *parents, last = path.split(".") if isinstance(path, str) else path
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


DELETE = object()
W = "spec.mpiReplicaSpecs.Worker"
WC = f"{W}.template.spec.containers.0"
L = "spec.mpiReplicaSpecs.Launcher"

# (what a user gets wrong, the file, the field, its wrong value, what the refusal says)
BAD = [
    ("unknown mpiImplementation", "mpijob-horovodrun.yaml", "spec.mpiImplementation", "OpenMPI5",
     "'OpenMPI5' is not one of ['OpenMPI', 'Intel', 'MPICH']"),
    ("string slotsPerWorker", "mpijob-horovodrun.yaml", "spec.slotsPerWorker", "2",
     "spec.slotsPerWorker: '2' is not of type 'integer'"),
    ("unquoted number in args", "mpijob-horovodrun.yaml", f"{L}.template.spec.containers.0.args.1", 4,
     "4 is not of type 'string'"),
    ("string replicas", "mpijob-elastic.yaml", f"{W}.replicas", "3", "'3' is not of type 'integer'"),
    ("replicas beyond int32", "mpijob-elastic.yaml", f"{W}.replicas", 2**31, "is not a 'int32'"),
    ("no Launcher replica spec", "mpijob-mpirun.yaml", L, DELETE, "needs a Launcher replica spec"),
    ("two launchers", "mpijob-mpirun.yaml", f"{L}.replicas", 2, "Launcher.replicas must be 1"),
    ("old apiVersion", "mpijob-horovodrun.yaml", "apiVersion", "kubeflow.org/v1",
     "no CRD here serves apiVersion 'kubeflow.org/v1' kind 'MPIJob'"),
    ("misspelled field", "mpijob-horovodrun.yaml", "spec.sshAuthMountpath", SSH_PATH,
     "'sshAuthMountpath' was unexpected"),
    ("misspelled field in the pod", "mpijob-horovodrun.yaml", f"{WC}.readinesProbe", {},
     "'readinesProbe' was unexpected"),
    ("worker without containers", "mpijob-horovodrun.yaml", f"{W}.template.spec.containers", DELETE,
     "'containers' is a required property"),
    ("container name not a DNS label", "mpijob-horovodrun.yaml", f"{WC}.name", "Worker_0",
     "container name 'Worker_0' is not a DNS-1123 label"),
    ("a quantity that is not one", "mpijob-gpu.yaml", f"{WC}.resources.limits.cpu", "two", "does not match"),
    ("duplicate env name", "mpijob-horovodrun.yaml", f"{WC}.env",
     [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "duplicate entry"),
    ("mount of a missing volume", "mpijob-horovodrun.yaml", f"{W}.template.spec.volumes.0.name", "data",
     "mounts volume 'share', which the pod does not define"),
    ("empty value", "mpijob-horovodrun.yaml", f"{W}.template.spec.volumes.0.emptyDir", None,
     "empty value"),
    ("name too long for the pods", "mpijob-horovodrun.yaml", "metadata.name", "a" * 60,
     "the worker pod hostname"),
    ("invalid restartPolicy", "mpijob-elastic.yaml", f"{W}.restartPolicy", "Always",
     "restartPolicy must be Never or OnFailure"),
    ("key mounted where mpiuser has none", "mpijob-horovodrun.yaml", "spec.sshAuthMountPath", "/root/.ssh",
     "sshAuthMountPath must be /home/mpiuser/.ssh"),
    ("np beyond the slots", "mpijob-horovodrun.yaml", f"{L}.template.spec.containers.0.args.1", "6",
     "-np is 6, but the job has 4 slots"),
    ("slots per host unlike slotsPerWorker", "mpijob-elastic.yaml", "spec.slotsPerWorker", 2,
     "--slots-per-host must be 2"),
    ("GPUs unlike slots", "mpijob-gpu.yaml", (*WC.split("."), "resources", "limits", "nvidia.com/gpu"), 2,
     "2 GPUs but slotsPerWorker 4"),
    ("a flag horovodrun does not have", "mpijob-horovodrun.yaml", f"{L}.template.spec.containers.0.args.0",
     "--np", "horovodrun refuses"),
    ("a flag the default job does not have", "mpijob-elastic.yaml", f"{L}.template.spec.containers.0.args.13",
     "--batch_size", "the default job refuses"),
    ("an elastic worker without its preStop hook", "mpijob-elastic.yaml", f"{WC}.lifecycle", DELETE,
     "needs the preStop hook"),
    ("runtime launcher np unlike its nodes", "trainer-runtime.yaml",
     "spec.template.spec.replicatedJobs.1.template.spec.template.spec.containers.0.args.1", "3",
     "launcher: -np is 3, but the job has 2 slots"),
    ("an image build.sh does not make", "mpijob-mpirun.yaml", f"{WC}.image", "horovod/horovod:0.28.1",
     "is not one build.sh makes"),
    ("TrainJob numProcPerNode as a string", "trainjob.yaml", "spec.trainer.numProcPerNode", "1",
     "'1' is not of type 'integer'"),
    ("TrainJob with negative numNodes", "trainjob.yaml", "spec.trainer.numNodes", -1,
     "-1 is less than the minimum of 0"),
    ("TrainJob without a runtime name", "trainjob.yaml", "spec.runtimeRef.name", DELETE,
     "'name' is a required property"),
    ("TrainJob on a runtime not shipped", "trainjob.yaml", "spec.runtimeRef.name", "torch-distributed",
     "which deploy/kubernetes does not ship"),
    ("runtime with an unknown mpiImplementation", "trainer-runtime.yaml",
     "spec.mlPolicy.mpi.mpiImplementation", "Intel", "'Intel' is not one of ['OpenMPI', '']"),
]


@pytest.mark.parametrize("what,name,path,value,says", BAD, ids=[b[0] for b in BAD])
def test_a_wrong_manifest_is_refused_with_the_reason(what, name, path, value, says):
    doc = _set(_base(name), path, value)
    errs = errors(doc)
    assert any(says in e for e in errs), f"{what}: not refused as expected ({says!r}); errors: {errs}"


GOOD = [
    ("a named probe port (int-or-string as a string)", f"{WC}.readinessProbe.tcpSocket.port", "ssh"),
    ("a CPU quantity as an integer", f"{WC}.resources", {"limits": {"cpu": 2}}),
    ("a CPU quantity as a string", f"{WC}.resources", {"limits": {"cpu": "500m", "memory": "2Gi"}}),
    ("an env list with distinct names", f"{WC}.env", [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]),
]


@pytest.mark.parametrize("what,path,value", GOOD, ids=[g[0] for g in GOOD])
def test_what_the_api_server_accepts_is_accepted(what, path, value):
    doc = _set(_base("mpijob-horovodrun.yaml"), path, value)
    errs = errors(doc)
    assert not errs, f"{what}: refused: {errs}"


def test_the_schema_reading_follows_the_api_server():
    """The extensions these CRDs do not use today, on a schema written for the purpose: an
    int-or-string without anyOf, nullable, preserve-unknown-fields, an embedded resource."""
    schema = _structural({"type": "object", "properties": {
        "port": {"x-kubernetes-int-or-string": True},
        "note": {"type": "string", "nullable": True},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                 "properties": {"known": {"type": "integer"}}},
        "obj": {"type": "object", "x-kubernetes-embedded-resource": True,
                "properties": {"spec": {"type": "object"}}},
        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"}}})
    check = Validator(schema, format_checker=FORMATS)

    def refused(doc):
        return [e.message for e in check.iter_errors(doc)]

    assert not refused({"port": 22, "note": None, "free": {"known": 1, "other": "x"},
                        "obj": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
                        "tags": ["a", "b"]})
    assert not refused({"port": "ssh"})
    assert refused({"port": 2.5})
    assert refused({"free": {"known": "one"}})
    assert refused({"obj": {"kind": "Pod", "status": {}}})
    assert refused({"tags": ["a", "a"]})
    assert refused({"unknown": 1})


def test_the_user_page_lists_every_manifest():
    """docs/kubernetes.md's table names every file in deploy/kubernetes, and only those."""
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    listed = set(re.findall(r"(?m)^\| `([\w.-]+\.ya?ml)` \|", page))
    files = {p.name for p in MANIFESTS.glob("*.y*ml")}
    assert listed == files, (f"docs/kubernetes.md's table: {sorted(listed - files)} not in deploy/kubernetes, "
                             f"{sorted(files - listed)} missing from it")
