"""Pure decision logic: plain synchronous Python, values and ``now`` in, decisions out.

Nothing here imports Kafka, faust, river, Prometheus or ClickHouse (a test
enforces it).

Time is one type here: ``now`` and every remembered instant (``last_at``,
``fresh_at``, ``opened_at``) is an aware UTC :class:`~datetime.datetime` on
the events' clock, and every duration is a float of seconds named ``*_s``.
Why a datetime and not float seconds: the instants controllers compare come
from events (``observed_at``) and go out on decisions and commands
(``decided_at``, ``issued_at``, ``expires_at``), all aware datetimes on the
wire, so a controller never converts at its edges; and a float cannot say which
clock it is on (epoch, monotonic, seconds since a replay began), where mixing
an aware datetime with a naive one fails loudly. Elapsed time is
``(now - then).total_seconds()``; steps that count periods or forecast steps
(warming) count integers, not time.
"""
