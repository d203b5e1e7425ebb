"""Elastic jobs: hosts that come and go while training goes on (``docs/elastic.md``).

Rooms: ``discovery`` (the host discovery script, or the fixed host list), ``membership`` (pure
logic: hosts oldest first, the blacklist and its cool-down, resets, rank layout), ``rendezvous``
(the driver's server of the protocol in ``appliance.common.rendezvous``), ``events`` (the typed
events and actions), ``machine`` (the pure state machine: phases, rounds, failures, notices; its
docstring tables every transition), ``records`` (its phase, worker and round records),
``driver`` (the I/O shell around the machine: processes, rendezvous, discovery poller, host
checks) and ``launch`` (``run_elastic``: what ``launcher.run`` does for an elastic job).
"""
