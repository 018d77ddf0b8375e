"""A stateful fake Kubernetes API server on localhost, for the Kubernetes drainer's tests.

No real API server can run on this machine, so this one keeps the state a drain touches (nodes,
pods with their owners, ReplicaSets, DaemonSets, PodDisruptionBudgets) and answers the requests
`kubectl drain` and our drainer send, in the shapes the real server uses: legacy discovery, Status
bodies for errors (429 TooManyRequests with a DisruptionBudget cause when a budget forbids an
eviction), merge / strategic-merge / JSON patches with a resourceVersion precondition, and pods
that take a while to go after eviction (deletionTimestamp first, then 404). tests/
test_fake_kube_kubectl.py checks it against a real kubectl. Plain HTTP on 127.0.0.1 only:
kubectl 1.32 and lightkube both take an http:// server in the kubeconfig, so no TLS is needed."""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str, *, details: Json | None = None) -> Json:
    """A metav1.Status body, as the real server answers errors."""
    body: Json = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message}
    body.update({"reason": reason, "code": code})
    if details is not None:
        body["details"] = details
    return body


class KubeError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.body = status(code, reason, message, details=details)
        self.code = code


def _not_found(kind: str, name: str) -> KubeError:
    return KubeError(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives ($patch, $retainKeys): not needed for nodes
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def json_patch(target: Json, operations: list[Json]) -> Json:
    """RFC 6902, the operations kubectl sends (add, replace, remove, test) on object members."""
    result = copy.deepcopy(target)
    for operation in operations:
        *parents, last = _pointer(operation["path"])
        node: Any = result
        for part in parents:
            node = node.setdefault(part, {}) if operation["op"] == "add" else node[part]
        if operation["op"] in ("add", "replace"):
            node[last] = operation["value"]
        elif operation["op"] == "remove":
            del node[last]
        elif operation["op"] == "test" and node.get(last) != operation["value"]:
            raise KubeError(422, "Invalid", f"test operation failed at {operation['path']}")
    return result


def _resource(name: str, kind: str, *, namespaced: bool, verbs: list[str], **extra: str) -> Json:
    return {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs, **extra}


READ = ["get", "list"]
DISCOVERY: dict[str, Json] = {
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            _resource("nodes", "Node", namespaced=False, verbs=[*READ, "patch", "update"], shortNames=["no"]),
            _resource("pods", "Pod", namespaced=True, verbs=[*READ, "delete"], shortNames=["po"]),
            # kubectl finds the eviction API here (CheckEvictionSupport): name, kind, group and version.
            _resource("pods/eviction", "Eviction", namespaced=True, verbs=["create"], group="policy", version="v1"),
        ],
    },
    "/apis/apps/v1": {
        "kind": "APIResourceList",
        "groupVersion": "apps/v1",
        "resources": [
            _resource("daemonsets", "DaemonSet", namespaced=True, verbs=READ, shortNames=["ds"]),
            _resource("replicasets", "ReplicaSet", namespaced=True, verbs=READ, shortNames=["rs"]),
        ],
    },
    "/apis/policy/v1": {
        "kind": "APIResourceList",
        "groupVersion": "policy/v1",
        "resources": [_resource("poddisruptionbudgets", "PodDisruptionBudget", namespaced=True, verbs=READ)],
    },
}
GROUPS = {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
for _group in ("apps", "policy"):
    _version = {"groupVersion": f"{_group}/v1", "version": "v1"}
    GROUPS["groups"].append({"name": _group, "versions": [_version], "preferredVersion": _version})


class FakeKube:
    """The cluster's state and the API over it. Tests arrange it with the add_/set_ methods and read
    it back with node()/pod(); `requests` lists (method, path) of every request served."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, Json] = {}
        self.pods: dict[tuple[str, str], Json] = {}
        self.owners: dict[tuple[str, str, str], Json] = {}  # (kind, namespace, name)
        self.pdbs: dict[tuple[str, str], Json] = {}
        self.requests: list[tuple[str, str]] = []
        self._gone_at: dict[tuple[str, str], float] = {}
        self._terminate_s: dict[tuple[str, str], float] = {}
        self._versions = itertools.count(1000)

    # Arranging the cluster --------------------------------------------------------------------------
    def _meta(self, name: str, namespace: str | None = None, **extra: Any) -> Json:
        meta: Json = {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": str(next(self._versions))}
        if namespace is not None:
            meta["namespace"] = namespace
        meta.update(creationTimestamp=_stamp(), **extra)
        return meta

    def add_node(self, name: str, *, unschedulable: bool = False, annotations: dict[str, str] | None = None) -> None:
        with self.lock:
            meta = self._meta(name, labels={"kubernetes.io/hostname": name}, annotations=dict(annotations or {}))
            ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            spec = {"unschedulable": True} if unschedulable else {}
            self.nodes[name] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": meta,
                "spec": spec,
                "status": {"conditions": [ready]},
            }

    def add_owner(self, kind: str, name: str, *, namespace: str = "default") -> Json:
        """A ReplicaSet or DaemonSet (or any kind) for pods to name as their controller."""
        group = "apps/v1" if kind in ("ReplicaSet", "DaemonSet", "StatefulSet") else "batch/v1"
        with self.lock:
            owner = {"apiVersion": group, "kind": kind, "metadata": self._meta(name, namespace), "spec": {}}
            self.owners[(kind, namespace, name)] = owner
            return owner

    def add_pod(
        self,
        name: str,
        *,
        node: str,
        namespace: str = "default",
        owner: tuple[str, str] | None = None,
        labels: dict[str, str] | None = None,
        mirror: bool = False,
        ready: bool = True,
        terminate_s: float = 0.0,
    ) -> Json:
        """A running pod on `node`; owner (kind, name) makes it controlled (the owner is created if
        missing); terminate_s: how long it stays terminating after an eviction or delete."""
        with self.lock:
            annotations = {MIRROR_ANNOTATION: "mirror-hash"} if mirror else {}
            meta = self._meta(name, namespace, labels=dict(labels or {}), annotations=annotations)
            if owner:
                kind, owner_name = owner
                found = self.owners.get((kind, namespace, owner_name)) or self.add_owner(
                    kind, owner_name, namespace=namespace
                )
                meta["ownerReferences"] = [
                    {
                        "apiVersion": found["apiVersion"],
                        "kind": kind,
                        "name": owner_name,
                        "uid": found["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            condition = {"type": "Ready", "status": "True" if ready else "False"}
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Running", "conditions": [condition]},
            }
            self.pods[(namespace, name)] = pod
            self._terminate_s[(namespace, name)] = terminate_s
            return pod

    def add_pdb(
        self,
        name: str,
        *,
        selector: dict[str, str],
        namespace: str = "default",
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> None:
        with self.lock:
            spec: Json = {"selector": {"matchLabels": dict(selector)}}
            if min_available is not None:
                spec["minAvailable"] = min_available
            if max_unavailable is not None:
                spec["maxUnavailable"] = max_unavailable
            pdb = {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": self._meta(name, namespace),
                "spec": spec,
            }
            self.pdbs[(namespace, name)] = pdb

    def set_pdb(self, name: str, *, namespace: str = "default", **spec: int | str | None) -> None:
        """Change a budget (min_available=…, max_unavailable=…): an operator raising it mid-drain."""
        with self.lock:
            pdb = self.pdbs[(namespace, name)]
            pdb["spec"].pop("minAvailable", None)
            pdb["spec"].pop("maxUnavailable", None)
            names = {"min_available": "minAvailable", "max_unavailable": "maxUnavailable"}
            pdb["spec"].update({names[key]: value for key, value in spec.items() if value is not None})

    def set_node(self, name: str, patch: Json) -> None:
        """Someone else changing the node (a merge patch), e.g. another operator cordoning it."""
        with self.lock:
            self._store_node(name, merge_patch(self.nodes[name], patch))

    # Reading the cluster back -------------------------------------------------------------------------
    def node(self, name: str) -> Json:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def pod_names(self, node: str | None = None) -> set[str]:
        """namespace/name of the pods that still exist (terminating ones included)."""
        with self.lock:
            self._reap()
            return {f"{ns}/{n}" for (ns, n), pod in self.pods.items() if node in (None, pod["spec"]["nodeName"])}

    def evictions(self) -> list[str]:
        return [path for method, path in self.requests if method == "POST" and path.endswith("/eviction")]

    # The API ------------------------------------------------------------------------------------------
    def handle(self, method: str, url: str, body: bytes, content_type: str) -> tuple[int, Json]:
        parts = urlsplit(url)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        with self.lock:
            self.requests.append((method, parts.path))
            self._reap()
            try:
                return self._route(method, parts.path.rstrip("/") or "/", query, body, content_type)
            except KubeError as error:
                return error.code, error.body

    def _route(self, method: str, path: str, query: dict[str, str], body: bytes, content_type: str) -> tuple[int, Json]:
        if method == "GET" and path == "/version":
            return 200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-fake", "platform": "linux/amd64"}
        if method == "GET" and path == "/api":
            address = {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [address]}
        if method == "GET" and path == "/apis":
            return 200, GROUPS
        if method == "GET" and path in DISCOVERY:
            return 200, DISCOVERY[path]
        for pattern, handler in self._routes():
            match = re.fullmatch(pattern, path)
            if match and method in handler:
                return handler[method](query=query, body=body, content_type=content_type, **match.groupdict())
        raise KubeError(404, "NotFound", "the server could not find the requested resource")

    def _routes(self) -> list[tuple[str, dict[str, Any]]]:
        ns = r"/namespaces/(?P<namespace>[^/]+)"
        return [
            (r"/api/v1/nodes", {"GET": self._list_nodes}),
            (r"/api/v1/nodes/(?P<name>[^/]+)", {"GET": self._get_node, "PATCH": self._patch_node}),
            (rf"/api/v1(?:{ns})?/pods", {"GET": self._list_pods}),
            (rf"/api/v1{ns}/pods/(?P<name>[^/]+)", {"GET": self._get_pod, "DELETE": self._delete_pod}),
            (rf"/api/v1{ns}/pods/(?P<name>[^/]+)/eviction", {"POST": self._evict}),
            (rf"/apis/apps/v1{ns}/(?P<plural>daemonsets|replicasets)/(?P<name>[^/]+)", {"GET": self._get_owner}),
            (rf"/apis/policy/v1(?:{ns})?/poddisruptionbudgets", {"GET": self._list_pdbs}),
        ]

    def _list(self, kind: str, api_version: str, items: list[Json]) -> tuple[int, Json]:
        meta = {"resourceVersion": str(next(self._versions))}
        return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}

    def _list_nodes(self, **_: Any) -> tuple[int, Json]:
        return self._list("Node", "v1", [copy.deepcopy(n) for n in self.nodes.values()])

    def _get_node(self, *, name: str, **_: Any) -> tuple[int, Json]:
        if name not in self.nodes:
            raise _not_found("nodes", name)
        return 200, copy.deepcopy(self.nodes[name])

    def _patch_node(self, *, name: str, body: bytes, content_type: str, **_: Any) -> tuple[int, Json]:
        if name not in self.nodes:
            raise _not_found("nodes", name)
        patch = json.loads(body or b"null")
        kind = content_type.split(";")[0].strip()
        if kind == "application/json-patch+json":
            patched = json_patch(self.nodes[name], patch)
        elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != self.nodes[name]["metadata"]["resourceVersion"]:
                raise KubeError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on nodes "{name}": the object '
                    "has been modified; please apply your changes to the latest version and try again",
                    {"name": name, "kind": "nodes"},
                )
            patched = merge_patch(self.nodes[name], patch)
        else:
            raise KubeError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {kind}")
        return 200, self._store_node(name, patched)

    def _store_node(self, name: str, node: Json) -> Json:
        node["metadata"]["resourceVersion"] = str(next(self._versions))
        node.setdefault("spec", {})
        self.nodes[name] = node
        return copy.deepcopy(node)

    def _list_pods(self, *, query: dict[str, str], namespace: str | None = None, **_: Any) -> tuple[int, Json]:
        wanted_node = None
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            field, _, value = term.partition("=")
            if field.rstrip("=") != "spec.nodeName":
                raise KubeError(400, "BadRequest", f'"{field}" is not a known field selector: only "spec.nodeName"')
            wanted_node = value.lstrip("=")
        labels = dict(term.split("=", 1) for term in filter(None, query.get("labelSelector", "").split(",")))
        items = [
            copy.deepcopy(pod)
            for (pod_ns, _name), pod in self.pods.items()
            if namespace in (None, pod_ns)
            and wanted_node in (None, pod["spec"]["nodeName"])
            and all(pod["metadata"]["labels"].get(k) == v for k, v in labels.items())
        ]
        return self._list("Pod", "v1", items)

    def _get_pod(self, *, namespace: str, name: str, **_: Any) -> tuple[int, Json]:
        if (namespace, name) not in self.pods:
            raise _not_found("pods", name)
        return 200, copy.deepcopy(self.pods[(namespace, name)])

    def _delete_pod(self, *, namespace: str, name: str, **_: Any) -> tuple[int, Json]:
        if (namespace, name) not in self.pods:
            raise _not_found("pods", name)
        self._terminate(namespace, name)
        self._reap()
        return 200, copy.deepcopy(self.pods.get((namespace, name), {"kind": "Pod", "metadata": {"name": name}}))

    def _get_owner(self, *, namespace: str, plural: str, name: str, **_: Any) -> tuple[int, Json]:
        kind = {"daemonsets": "DaemonSet", "replicasets": "ReplicaSet"}[plural]
        if (kind, namespace, name) not in self.owners:
            raise _not_found(f"{plural}.apps", name)
        return 200, copy.deepcopy(self.owners[(kind, namespace, name)])

    def _list_pdbs(self, *, namespace: str | None = None, **_: Any) -> tuple[int, Json]:
        items = [self._pdb_with_status(pdb) for (pdb_ns, _n), pdb in self.pdbs.items() if namespace in (None, pdb_ns)]
        return self._list("PodDisruptionBudget", "policy/v1", items)

    # Evictions and budgets ------------------------------------------------------------------------------
    def _evict(self, *, namespace: str, name: str, **_: Any) -> tuple[int, Json]:
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise _not_found("pods", name)
        terminating = "deletionTimestamp" in pod["metadata"]
        finished = pod["status"].get("phase") in ("Succeeded", "Failed")
        budgets = [pdb for (pdb_ns, _n), pdb in self.pdbs.items() if pdb_ns == namespace and self._covers(pdb, pod)]
        if not terminating and not finished and budgets:
            if len(budgets) > 1:
                raise KubeError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )
            pdb = self._pdb_with_status(budgets[0])
            if pdb["status"]["disruptionsAllowed"] <= 0:
                message = (
                    f"The disruption budget {pdb['metadata']['name']} needs "
                    f"{pdb['status']['desiredHealthy']} healthy pods and has "
                    f"{pdb['status']['currentHealthy']} currently"
                )
                cause = {"reason": "DisruptionBudget", "message": message}
                # No Retry-After header (the real server gives 0): client-go would otherwise retry by itself.
                raise KubeError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [cause]},
                )
        self._terminate(namespace, name)
        self._reap()
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    @staticmethod
    def _covers(pdb: Json, pod: Json) -> bool:
        wanted = pdb["spec"]["selector"].get("matchLabels", {})
        return all(pod["metadata"]["labels"].get(k) == v for k, v in wanted.items())

    def _pdb_with_status(self, pdb: Json) -> Json:
        """The budget with the status the disruption controller would compute right now."""
        namespace = pdb["metadata"]["namespace"]
        matching = [p for (ns, _n), p in self.pods.items() if ns == namespace and self._covers(pdb, p)]
        healthy = sum(
            1
            for p in matching
            if "deletionTimestamp" not in p["metadata"]
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        )
        expected = len(matching)

        def count(value: int | str) -> int:
            return -(-expected * int(value[:-1]) // 100) if isinstance(value, str) else int(value)

        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = count(spec["minAvailable"])
        else:
            desired = expected - count(spec.get("maxUnavailable", 0))
        result = copy.deepcopy(pdb)
        result["status"] = {
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": max(0, healthy - desired),
            "observedGeneration": 1,
        }
        return result

    def _terminate(self, namespace: str, name: str) -> None:
        pod = self.pods[(namespace, name)]
        if "deletionTimestamp" not in pod["metadata"]:
            pod["metadata"]["deletionTimestamp"] = _stamp()
            pod["metadata"]["deletionGracePeriodSeconds"] = 30
            pod["metadata"]["resourceVersion"] = str(next(self._versions))
            self._gone_at[(namespace, name)] = time.monotonic() + self._terminate_s.get((namespace, name), 0.0)

    def _reap(self) -> None:
        now = time.monotonic()
        for key in [key for key, when in self._gone_at.items() if when <= now]:
            self.pods.pop(key, None)
            del self._gone_at[key]


def _handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            code, answer = kube.handle(self.command, self.path, body, self.headers.get("Content-Type", ""))
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serve_fake_kube(kube: FakeKube, kubeconfig: Path) -> Iterator[str]:
    """Serve `kube` on 127.0.0.1 in a thread and write a kubeconfig for it; yields the server URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(kube))
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "fake-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
                "current-context": "fake",
            }
        )
    )
    thread = threading.Thread(target=server.serve_forever, name="fake-kube", daemon=True)
    thread.start()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
