"""Elastic jobs: hosts that come and go while training goes on (``docs/elastic.md``).

Rooms: ``discovery`` (the host discovery script, or the fixed host list), ``membership`` (pure
logic: hosts oldest first, the blacklist and its cool-down, resets, rank layout), ``rendezvous``
(the driver's server of the protocol in ``appliance.common.rendezvous``), ``events`` (the typed
events and actions), ``machine`` (the pure state machine: the event dispatch and a worker's own
events; its docstring tables every transition), the concerns that implement that table:
``rounds`` (form, release, break, grow, notify), ``failures`` (a failure, the doomed round, the
lost, reaping) and ``hosts`` (discovery, host checks, the target), with ``pending`` (hosts
listed that do not answer yet) and ``waiting`` (the members and slots waited for), all on
``state`` (what the transitions share) and ``records`` (the phase, a worker's one state and its
moves, the round), ``driver`` (the I/O shell around the machine: processes, rendezvous,
discovery poller, host checks, one inbox) and ``launch`` (``run_elastic``: what
``launcher.run`` does for an elastic job).
"""
