"""Render docker/nginx/kokoro.conf.template into a complete nginx.conf for a bare nginx process.

The compose file lets the nginx image fill the template with envsubst; this module fills the same
template for tests and for nginx outside a container, with concrete upstreams and every path nginx
writes (pid, logs, temporary files) under one prefix, so it runs as an unprivileged process:

    python docker/render_nginx.py --upstream 127.0.0.1:8001 --upstream 127.0.0.1:8002 \
        --listen 127.0.0.1:8080 --prefix /tmp/kokoro-nginx
    nginx -p /tmp/kokoro-nginx -e /tmp/kokoro-nginx/error.log -c /tmp/kokoro-nginx/nginx.conf \
        -g 'daemon off;'
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

TEMPLATE = Path(__file__).parent / "nginx" / "kokoro.conf.template"
UPSTREAM = "KOKORO_UPSTREAM"
LISTEN = "KOKORO_LISTEN"
CONF_NAME = "nginx.conf"
# Where the template includes additions to its server block from (docker/compose.tls.yml mounts TLS there);
# a bare nginx reads them from <prefix>/kokoro.d instead.
INCLUDES = "/etc/nginx/kokoro.d"
INCLUDES_NAME = "kokoro.d"
TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
# host:port, [v6]:port or unix:/path; nothing that could end the directive or open a block.
UPSTREAM_PATTERN = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$|^unix:/[^\s;{}]+$")


def render_site(upstreams: Sequence[str], listen: str, template: str | None = None) -> str:
    """The template with one `server` line per upstream and the listen address filled in."""
    if not upstreams:
        raise ValueError("at least one upstream is needed")
    for upstream in upstreams:
        if not UPSTREAM_PATTERN.match(upstream):
            raise ValueError(f"not a host:port upstream: {upstream!r}")
    if not re.fullmatch(r"[\w.:\[\]]+", listen):
        raise ValueError(f"not a port or address:port to listen on: {listen!r}")
    text = TEMPLATE.read_text() if template is None else template
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        is_comment = line.lstrip().startswith("#")
        if f"${{{UPSTREAM}}}" in line and not is_comment:
            lines.extend(line.replace(f"${{{UPSTREAM}}}", upstream) for upstream in upstreams)
        else:
            lines.append(line)
    return "".join(lines).replace(f"${{{LISTEN}}}", listen)


def render_main(site: str, prefix: Path) -> str:
    """A complete nginx.conf around `site` that writes only under `prefix`."""
    temp_paths = "\n".join(f"    {name}_temp_path {prefix / name};" for name in TEMP_DIRS)
    body = "\n".join(f"    {line}" if line.strip() else "" for line in site.splitlines())
    # Started as root (a CI container), nginx runs its workers as nobody, who cannot enter a private
    # prefix (pytest's temporary directories are 0700) to spool a large body: a book's upload got 500.
    user = "user root;\n" if hasattr(os, "geteuid") and os.geteuid() == 0 else ""
    return (
        f"{user}worker_processes 1;\n"
        f"pid {prefix / 'nginx.pid'};\n"
        f"error_log {prefix / 'error.log'} info;\n\n"
        f"events {{\n    worker_connections 1024;\n}}\n\n"
        f"http {{\n"
        f"    access_log {prefix / 'access.log'};\n"
        f"{temp_paths}\n\n"
        f"{body}\n"
        f"}}\n"
    )


def write_config(prefix: Path, upstreams: Sequence[str], listen: str) -> Path:
    """Write prefix/nginx.conf (creating prefix, the temporary directories and kokoro.d, for additions to
    the server block such as docker/nginx/tls.conf); return its path."""
    prefix = prefix.resolve()
    for name in TEMP_DIRS:
        (prefix / name).mkdir(parents=True, exist_ok=True)
    (prefix / INCLUDES_NAME).mkdir(exist_ok=True)
    site = render_site(upstreams, listen).replace(INCLUDES, str(prefix / INCLUDES_NAME))
    conf = prefix / CONF_NAME
    conf.write_text(render_main(site, prefix))
    return conf


def nginx_command(conf: Path, *, test: bool = False) -> list[str]:
    """The nginx command line that runs (or, with test=True, checks) `conf` in the foreground."""
    prefix = conf.parent
    command = ["nginx", "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf)]
    return [*command, "-t"] if test else [*command, "-g", "daemon off;"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", action="append", required=True, help="host:port of a replica (repeat)")
    parser.add_argument("--listen", default="8080", help="port or address:port (default 8080)")
    parser.add_argument("--prefix", type=Path, required=True, help="directory for the config, pid, logs")
    args = parser.parse_args(argv)
    conf = write_config(args.prefix, args.upstream, args.listen)
    print(shlex.join(nginx_command(conf)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
