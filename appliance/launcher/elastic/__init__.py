"""Elastic jobs: hosts that come and go while training goes on (``docs/elastic.md``).

Rooms: ``discovery`` (the host discovery script, or the fixed host list), ``membership`` (pure
logic: hosts oldest first, the blacklist and its cool-down, resets, rank layout), ``rendezvous``
(the driver's server of the protocol in ``appliance.common.rendezvous``), ``driver`` (rounds,
failures, notifications), ``records`` (its worker and round records) and ``launch``
(``run_elastic``: what ``launcher.run`` does for an elastic job).
"""
