"""Zeroconf (mDNS) advertisement of the Wyoming service, `_wyoming._tcp`, so that Home Assistant discovers
it (KOKORO_WYOMING_ZEROCONF). Run once by the server's main process, not per worker: one name on the
network however many workers listen on the port."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from zeroconf import ServiceInfo, Zeroconf

from api.settings import Settings

logger = logging.getLogger(__name__)

SERVICE_TYPE = "_wyoming._tcp.local."
MDNS_GROUP = "224.0.0.251"
EVERY_INTERFACE = ("", "0.0.0.0")


def service_info(name: str, address: str, port: int) -> ServiceInfo:
    return ServiceInfo(
        SERVICE_TYPE,
        f"{name}.{SERVICE_TYPE}",
        addresses=[socket.inet_aton(address)],
        port=port,
        server=f"{socket.gethostname()}.local.",
    )


def advertised_address(host: str) -> str:
    """The address to advertise: the one the service listens on, or where it listens on every interface,
    the one this machine reaches the mDNS group from."""
    if host not in EVERY_INTERFACE:
        return socket.gethostbyname(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((MDNS_GROUP, 1))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])


@contextmanager
def advertise(settings: Settings) -> Iterator[ServiceInfo | None]:
    """The Wyoming service advertised while the block runs, where it is on and a name is set."""
    if not (settings.wyoming and settings.wyoming_zeroconf):
        yield None
        return
    address = advertised_address(settings.wyoming_host)
    info = service_info(settings.wyoming_zeroconf, address, settings.wyoming_port)
    zeroconf = Zeroconf(interfaces=[address])
    try:
        zeroconf.register_service(info)
        logger.info("Wyoming service advertised over zeroconf as %s at %s:%d", info.name, address, info.port)
        yield info
    finally:
        zeroconf.unregister_all_services()
        zeroconf.close()
