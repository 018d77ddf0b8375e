"""The Slurm source: a cluster's nodes as the fleet file's host rows.

Nodes are read with `sinfo --json` (Slurm 21.08 and later), else `scontrol -o show node` (any
release). The rules that turn a node into a host are configurable (`SlurmRules`):
- pool: the node's partition, through `pool_map` (partition → pool); without a map, the pool named
  like the partition. A node in no mapped partition is skipped (and listed as such).
- domain: the node's first feature starting with `domain_feature` ("rack" → feature `rack12`), else
  the `domain` group (or the first group) of `domain_pattern` matched on the node name.
- hostname: `hostname_format` over {node} (the node name) and {hostname} (its NodeHostName).
- sku: the first feature starting with `sku_feature`, else `sku`; gpu_count from the `gpu` gres.
- labels: `slurm_node` (what the Slurm drainer reads) and `slurm_partitions`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.fleetfile.schema import Problem
from fleet.sync import SourceError

# `scontrol -o show node`: Key=Value pairs on one line, values may hold spaces (OS=Linux 6.1 #1 SMP).
_PAIR = re.compile(r"([A-Za-z_]+)=(.*?)(?= [A-Za-z_]+=|$)")
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")
_NULL = {"", "(null)", "none", "N/A"}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str
    partitions: tuple[str, ...]
    features: tuple[str, ...]
    gres: str


@dataclass(frozen=True)
class SlurmRules:
    pool_map: dict[str, str] = field(default_factory=dict)
    domain_feature: str = "rack"
    domain_pattern: str = ""
    hostname_format: str = "{node}"
    sku: str = "slurm-node"
    sku_feature: str = ""


@dataclass
class SlurmRows:
    rows: list[dict[str, Any]]
    skipped: list[str]
    problems: list[Problem]


def _run(args: Sequence[str], conf: str | None, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if conf:
        env["SLURM_CONF"] = conf
    try:
        return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SourceError(f"{args[0]} not found: install Slurm's client tools (slurm-client)") from None
    except subprocess.TimeoutExpired:
        raise SourceError(f"{' '.join(args)} took more than {timeout_s:.0f}s") from None


def _words(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else str(value or "").split(",")
    return tuple(w for w in (str(i).strip() for i in items) if w not in _NULL)


def nodes_from_json(text: str) -> list[SlurmNode]:
    nodes = json.loads(text).get("nodes") or []
    return [
        SlurmNode(
            name=str(node["name"]),
            hostname=str(node.get("hostname") or node["name"]),
            partitions=_words(node.get("partitions")),
            features=_words(node.get("active_features") or node.get("features")),
            gres="" if str(node.get("gres") or "") in _NULL else str(node["gres"]),
        )
        for node in nodes
    ]


def nodes_from_scontrol(text: str) -> list[SlurmNode]:
    nodes = []
    for line in text.splitlines():
        fields = dict(_PAIR.findall(line.strip()))
        if "NodeName" not in fields:
            continue
        gres = fields.get("Gres", "")
        nodes.append(
            SlurmNode(
                name=fields["NodeName"],
                hostname=fields.get("NodeHostName") or fields["NodeName"],
                partitions=_words(fields.get("Partitions")),
                features=_words(fields.get("ActiveFeatures") or fields.get("AvailableFeatures")),
                gres="" if gres in _NULL else gres,
            )
        )
    return nodes


def slurm_nodes(*, conf: str | None = None, reader: str = "auto", timeout_s: float = 60) -> list[SlurmNode]:
    """The cluster's nodes, by name; reader "json" (sinfo --json), "scontrol", or "auto" (JSON when
    this Slurm has it). SourceError (one line) when Slurm cannot be asked."""
    if reader in ("auto", "json"):
        done = _run(["sinfo", "--json"], conf, timeout_s)
        if done.returncode == 0:
            try:
                return sorted(nodes_from_json(done.stdout), key=lambda n: n.name)
            except (ValueError, KeyError, AttributeError) as error:
                raise SourceError(f"sinfo --json gave an answer that is not a node list: {error}") from None
        if reader == "json":
            raise SourceError(f"sinfo --json: {_first_line(done)}")
    done = _run(["scontrol", "-o", "show", "node"], conf, timeout_s)
    if done.returncode != 0:
        raise SourceError(f"scontrol -o show node: {_first_line(done)}")
    return sorted(nodes_from_scontrol(done.stdout), key=lambda n: n.name)


def _first_line(done: subprocess.CompletedProcess[str]) -> str:
    text = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
    return text.splitlines()[0]


def _name(value: str) -> str:
    """A Slurm word as an inventory name (lower case, - for _)."""
    return value.strip().lower().replace("_", "-")


def _domain(node: SlurmNode, rules: SlurmRules) -> str | None:
    if rules.domain_feature:
        for feature in node.features:
            if feature.startswith(rules.domain_feature):
                return _name(feature)
    if rules.domain_pattern:
        match = re.search(rules.domain_pattern, node.name)
        if match:
            value = match.groupdict().get("domain") or (match.group(1) if match.groups() else match.group(0))
            return _name(value) if value else None
    return None


def _pool(node: SlurmNode, rules: SlurmRules) -> str | None:
    for partition in node.partitions:
        if not rules.pool_map:
            return _name(partition)
        if partition in rules.pool_map:
            return rules.pool_map[partition]
    return None


def host_rows(nodes: Sequence[SlurmNode], rules: SlurmRules) -> SlurmRows:
    """The fleet file's host rows for these nodes; the nodes skipped (no pool mapped) and the
    problems (no domain by the rules), each naming its node."""
    out = SlurmRows(rows=[], skipped=[], problems=[])
    for node in nodes:
        pool = _pool(node, rules)
        if pool is None:
            out.skipped.append(f"{node.name} (partitions {', '.join(node.partitions) or 'none'}: no pool mapped)")
            continue
        domain = _domain(node, rules)
        if domain is None:
            rule = f"no feature starting with {rules.domain_feature!r}" if rules.domain_feature else "no feature rule"
            if rules.domain_pattern:
                rule += f" and the name does not match {rules.domain_pattern!r}"
            out.problems.append(Problem(f"node {node.name}", f"no domain: {rule}"))
            continue
        sku = next((f for f in node.features if rules.sku_feature and f.startswith(rules.sku_feature)), rules.sku)
        gpus = _GPUS.search(node.gres)
        out.rows.append(
            {
                "hostname": rules.hostname_format.format(node=node.name, hostname=node.hostname).lower(),
                "pool": pool,
                "domain": domain,
                "sku": sku,
                "gpu_count": int(gpus.group(1)) if gpus else 0,
                "labels": {"slurm_node": node.name, "slurm_partitions": ",".join(node.partitions)},
            }
        )
    return out


_ROW = re.compile(r"^hosts\[(\d+)\]\.?")


def by_node(problems: Sequence[Problem], rows: Sequence[dict[str, Any]]) -> list[Problem]:
    """hosts[3].domain -> node n4: domain (the source's names for the rows)."""
    named = []
    for problem in problems:
        match = _ROW.match(problem.place)
        if match is None or int(match.group(1)) >= len(rows):
            named.append(problem)
            continue
        rest = problem.place[match.end() :]
        node = rows[int(match.group(1))]["labels"]["slurm_node"]
        named.append(Problem(f"node {node}" + (f": {rest}" if rest else ""), problem.message))
    return named
