"""Configuration files and ring-building script of the one-node Swift (see embedded_swift).

Values that matter for asyncckpt: s3api ``max_upload_part_num`` and SLO
``max_manifest_segments`` raised to 10000 (AWS allows 10000 parts; Swift defaults to 1000),
region ``us-east-1`` (s3api ``location``), tempauth user ``test:tester`` with ``.admin``.
tempauth needs memcache (``Memcache required`` otherwise), hence ``cache`` in the pipeline.
"""

from __future__ import annotations

from pathlib import Path

SERVERS = ("account", "container", "object", "proxy")

#: run by the system interpreter: argv = etc_dir account_port container_port object_port
RING_SCRIPT = """
import sys
from swift.common.ring import RingBuilder
etc = sys.argv[1]
for name, port in zip(("account", "container", "object"), sys.argv[2:5]):
    b = RingBuilder(6, 1, 0)
    b.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": int(port),
               "device": "d1", "weight": 100.0, "meta": ""})
    b.rebalance()
    b.get_ring().save(f"{etc}/{name}.ring.gz")
"""

PROXY_PIPELINE = (
    "catch_errors gatekeeper healthcheck proxy-logging cache listing_formats s3api tempauth "
    "copy slo dlo versioned_writes proxy-logging proxy-server"
)


def render_configs(
    etc: Path,
    devices: Path,
    ports: dict[str, int],
    user: str,
    workers: int,
    log_level: str,
    secret: str,
    region: str,
    proxy_host: str = "127.0.0.1",
) -> dict[str, str]:
    """File name → contents for swift.conf and the four server configs (the proxy, the S3
    endpoint, binds ``proxy_host``; the servers behind it stay on 127.0.0.1)."""

    def default(name: str, n: int) -> str:
        host = proxy_host if name == "proxy" else "127.0.0.1"
        return (
            f"[DEFAULT]\nbind_ip = {host}\nbind_port = {ports[name]}\nbind_timeout = 1\nworkers = {n}\n"
            f"swift_dir = {etc}\ndevices = {devices}\nmount_check = false\nuser = {user}\n"
            f"log_level = {log_level}\nlog_name = {name}\n\n"
        )

    files = {
        # swift.conf is read from swift_dir, so /etc/swift is never used or touched
        "swift.conf": (
            "[swift-hash]\nswift_hash_path_suffix = asyncckpt\nswift_hash_path_prefix = asyncckpt\n\n"
            "[storage-policy:0]\nname = Policy-0\ndefault = yes\n\n[swift-constraints]\n"
        ),
        "proxy-server.conf": default("proxy", workers) + f"[pipeline:main]\npipeline = {PROXY_PIPELINE}\n\n"
        # one node: never "error-limit" it (a 507 from a full disk would refuse everything for 60 s)
        "[app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n"
        "allow_account_management = true\nerror_suppression_interval = 0\n\n"
        f"[filter:s3api]\nuse = egg:swift#s3api\nlocation = {region}\nmax_upload_part_num = 10000\n\n"
        f"[filter:tempauth]\nuse = egg:swift#tempauth\nuser_test_tester = {secret} .admin\n\n"
        f"[filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:{ports['memcached']}\n\n"
        "[filter:slo]\nuse = egg:swift#slo\nmax_manifest_segments = 10000\n\n",
    }
    for name in (
        "catch_errors",
        "gatekeeper",
        "healthcheck",
        "proxy-logging",
        "listing_formats",
        "copy",
        "dlo",
    ):
        files["proxy-server.conf"] += f"[filter:{name}]\nuse = egg:swift#{name.replace('-', '_')}\n\n"
    files["proxy-server.conf"] += "[filter:versioned_writes]\nuse = egg:swift#versioned_writes\n\n"
    for name in ("account", "container", "object"):
        n = workers if name == "object" else 1
        files[f"{name}-server.conf"] = (
            default(name, n) + f"[pipeline:main]\npipeline = {name}-server\n\n"
            f"[app:{name}-server]\nuse = egg:swift#{name}\n\n"
        )
    return files
