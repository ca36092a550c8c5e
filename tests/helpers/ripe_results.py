"""RIPE Atlas ping results, one of each real shape, as the results API and dumps give them:
what the ingest tests feed to `ingest` and to its compiled scanner."""

T0 = 1_751_328_000

# Firmware 4400 and later (a `result` list of packets), and a result of another type.
MODERN = [
  {  # replies, a timeout, an error and a duplicate; `from` beats the private src_addr
    "fw": 5080,
    "type": "ping",
    "af": 4,
    "msm_id": 1001,
    "prb_id": 7,
    "timestamp": T0 + 10,
    "dst_addr": "193.0.14.129",
    "src_addr": "192.168.1.10",
    "from": "77.1.2.3",
    "result": [
      {"rtt": 12.5},
      {"x": "*"},
      {"error": "Network is unreachable"},
      {"rtt": 12.6, "dup": 1},
      {"rtt": 13.25, "ttl": 55},
    ],
  },
  {  # IPv6, `src_addr` only (no `from`), a reply carrying its source address
    "fw": 4790,
    "type": "ping",
    "af": 6,
    "msm_id": 2001,
    "prb_id": 8,
    "timestamp": T0 + 5,
    "dst_addr": "2001:db8::1",
    "src_addr": "2a00:1::5",
    "result": [{"srcaddr": "2a00:1::5", "rtt": 40.0}, {"x": "*"}],
  },
  {  # `addr` and `from` (firmware 1), no src_addr, no af: the version comes from the address
    "fw": 1,
    "type": "ping",
    "msm_id": 1002,
    "prb_id": 9,
    "timestamp": T0 + 7,
    "addr": "8.8.8.8",
    "from": "95.4.3.2",
    "result": [{"rtt": 20}],
  },
  {"type": "traceroute", "msm_id": 5001, "timestamp": T0, "result": [{"hop": 1, "result": []}]},
]
# Firmware 0 (numbers as strings, `avg` only), and a result whose `result` is an object.
FIRMWARE_0 = [
  {  # numbers as strings, `avg` only, no type
    "msm_id": 1003,
    "prb_id": 10,
    "timestamp": T0 + 3,
    "addr": "193.0.14.129",
    "from": "80.1.1.1",
    "avg": "58.042",
    "rcvd": "3",
    "sent": "3",
  },
  {
    "msm_id": 1003,
    "prb_id": 11,
    "timestamp": T0 + 4,
    "dst_addr": "193.0.14.129",
    "src_addr": "81.1.1.1",
    "avg": "-1",
    "rcvd": "0",
  },  # fmt: skip
  {"type": "dns", "msm_id": 6001, "timestamp": T0, "result": {"rt": 5.1, "size": 40}},
]
