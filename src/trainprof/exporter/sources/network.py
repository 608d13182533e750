"""Bytes received and sent per network interface from /proc/net/dev (psutil)."""

from __future__ import annotations

import re

import psutil

from trainprof.contract.sampling import HostSample
from trainprof.exporter.sources.base import NETWORK_EXCLUDE


class NetworkSource:
    """Cumulative bytes received and transmitted by each interface but loopback.

    /proc/net/dev belongs to the reader's network namespace: a DaemonSet sees the host's
    interfaces only with `hostNetwork: true`.

        # HELP trainprof_network_receive_bytes_total Bytes received on a network interface ...
        # TYPE trainprof_network_receive_bytes_total counter
        trainprof_network_receive_bytes_total{device="eth0",node="n1"} 1.048576e+06

    Check by hand: `cat /proc/net/dev`.
    """

    name = "network"

    def __init__(self, exclude: re.Pattern[str] = re.compile(NETWORK_EXCLUDE)):
        self._exclude = exclude

    def read(self, sample: HostSample) -> bool:
        counters = psutil.net_io_counters(pernic=True, nowrap=False) or {}
        sample.network = {
            name: (float(c.bytes_recv), float(c.bytes_sent))
            for name, c in counters.items()
            if not self._exclude.match(name)
        }
        return True

    def close(self) -> None:
        pass
