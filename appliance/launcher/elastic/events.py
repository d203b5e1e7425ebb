"""What the elastic state machine reads and writes: typed events in, typed actions out.

What it owns: the events the driver's I/O shell (``driver.ElasticDriver``) hands to the pure state
machine (``machine``) and the actions the machine returns for the shell to carry out. Events are
facts that already happened (a worker joined, one asked to leave, a process exited, discovery
printed a host list, a host passed its check, time passed); actions are what the machine decided
(start a worker, stop one, answer a join or a leave, tell the members of a round, release a
round, open or close hosts, say a line, end the job). Every record is a frozen dataclass: nothing
here holds a socket, a thread or a process.

Env vars: none. Failure modes: none (plain data).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping


# -- events (shell -> machine) ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Joined:
    """Worker ``wid`` asks for its round (``message``: the join request: reason, addr, port...)."""
    wid: int
    message: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Watching:
    """Worker ``wid`` opened its notification stream."""
    wid: int


@dataclasses.dataclass(frozen=True)
class Leaving:
    """Worker ``wid`` was sent SIGTERM (its pod is being deleted) and asks to leave at its next
    commit (``op: leave``); the machine answers with ``Answer(wid, ..., leave=True)``."""
    wid: int


@dataclasses.dataclass(frozen=True)
class Exited:
    """Worker ``wid``'s process ended with ``code`` (``cause``: the mechanism's words, if any)."""
    wid: int
    code: int
    cause: str = ""


@dataclasses.dataclass(frozen=True)
class SpawnFailed:
    """Worker ``wid`` could not be started at all."""
    wid: int
    code: int
    message: str


@dataclasses.dataclass(frozen=True)
class Discovered:
    """One discovery result: ``{host: slots}`` in the order printed."""
    hosts: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class DiscoveryFailed:
    """One discovery run failed (``first``: the job's first run, which fails the launch)."""
    message: str
    first: bool = False


@dataclasses.dataclass(frozen=True)
class HostOpened:
    """A host's check finished: ``failure`` is None when it can run ranks."""
    host: str
    failure: str | None


@dataclasses.dataclass(frozen=True)
class Tick:
    """Time passed; ``silent``: workers whose host has sent nothing over SSH for ``failures.SILENT_S``."""
    silent: frozenset = frozenset()


Event = Joined | Watching | Leaving | Exited | SpawnFailed | Discovered | DiscoveryFailed | HostOpened | Tick


# -- actions (machine -> shell) -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Spawn:
    """Start worker ``wid`` on ``host`` (slot ``index``) with the layout ``slot`` it is planned for;
    ``hosts``: the hosts ready to run ranks, ``first_host`` the oldest (the job plan's master)."""
    wid: int
    host: str
    index: int
    slot: Any
    hosts: tuple
    first_host: str


@dataclasses.dataclass(frozen=True)
class Remove:
    """Stop worker ``wid``: ``ask`` answers its held join with ``removed`` (it exits by itself),
    otherwise the mechanism terminates it (TERM, then KILL after the grace)."""
    wid: int
    why: str
    ask: bool


@dataclasses.dataclass(frozen=True)
class Kill:
    """SIGKILL worker ``wid`` (``term``: SIGTERM through the mechanism instead)."""
    wid: int
    term: bool = False


@dataclasses.dataclass(frozen=True)
class Answer:
    """Answer worker ``wid``'s held join with ``answer`` (an error or ``removed``); ``leave``: its
    held leave request instead (``{"leave": true}`` taken, or an error: it dies of the signal)."""
    wid: int
    answer: Mapping[str, Any]
    leave: bool = False


@dataclasses.dataclass(frozen=True)
class Member:
    wid: int
    host: str
    slot: Any                 # its ``Slot`` in the round
    join: Mapping[str, Any]   # its join request (the address and store port it sent)


@dataclasses.dataclass(frozen=True)
class Release:
    """Answer every member of round ``round_id`` with its place (members in rank order)."""
    round_id: int
    members: tuple
    sync: bool


@dataclasses.dataclass(frozen=True)
class Notify:
    """Tell ``wids`` that hosts changed (``result``: ``HostUpdate`` value) during round ``round_id``."""
    wids: tuple
    result: int
    round_id: int
    seq: int                  # the notice's number in this job (a new notice has a higher one)


@dataclasses.dataclass(frozen=True)
class OpenHosts:
    """Check these hosts (SSH preflight) off the main thread; each answers with ``HostOpened``."""
    hosts: tuple


@dataclasses.dataclass(frozen=True)
class CloseHosts:
    """Close these hosts' connections: no worker of the job is left on them and they are no longer
    wanted (not listed, or blacklisted for good); a host listed again is opened again."""
    hosts: tuple


@dataclasses.dataclass(frozen=True)
class Say:
    text: str


@dataclasses.dataclass(frozen=True)
class End:
    """The job is over: exit ``code``; ``rank``/``host`` blame a worker; ``reason`` is the line."""
    code: int
    reason: str = ""
    rank: int | None = None
    host: str | None = None


Action = Spawn | Remove | Kill | Answer | Release | Notify | OpenHosts | CloseHosts | Say | End

__all__ = ["Action", "Answer", "CloseHosts", "Discovered", "DiscoveryFailed", "End", "Event", "Exited", "HostOpened",
           "Joined", "Kill", "Leaving", "Member", "Notify", "OpenHosts", "Release", "Remove", "Say", "Spawn",
           "SpawnFailed", "Tick", "Watching"]
