#!/usr/bin/env python3
"""A palisade client in Python, written from docs/protocol/ alone (client.md).

  client.py selftest
  client.py submit --org ORG --target T --plugins a,b [--client-id C] [--key K]
                   [--path js|rr] [--timeout SECS]

Subjects are the client's own: <prefix>.v1.org.<org>.client.<client_id>.<verb>.
--path js (default): durable JetStream publish to ….request with
Nats-Msg-Id = {client_id}:{idempotency_key}:{fingerprint}; the outcome comes from events only.
--path rr: core-NATS request to ….submit, decoded as ScanRequestReply.
Either way the client reads its organization's events through the events verb (request/reply
on ….events, answered by ingestion): it asks where "now" is (from_now) BEFORE it submits, then
long-polls from the cursor of each reply until scan.completed / scan.failed / scan.rejected /
scan.cancelled of its request; enrichment.* events (and names it does not know) are logged and
passed over. A client needs no JetStream right for this.
--watch-tasks also follows the services' task.* events (<prefix>.v1.event.>) for progress, with a
pull consumer of its own: that needs a NATS user that may read them (an open server, as
`palisade dev` runs), never a client's; it is a developer's aid, not the client protocol.
NATS_CREDS (a .creds file from `palisade client add --creds`) authenticates the client; its
replies arrive under the inbox prefix _INBOX_<prefix>.client-<client_id>.
Prints JSON lines; the last one is {"event": "result", ...}; a completed scan's carries its
coverage summary (status, score, whether the required coverage is complete). Exit code 0 if the outcome was
received (whatever it is), 1 on timeout.
"""
import argparse
import asyncio
import hashlib
import json
import os
import struct
import sys
import time
import uuid

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

import palisade_pb2 as pb

EVENT_TYPES = {
    "scan.admitted": pb.ScanAdmitted, "scan.rejected": pb.ScanRejected,
    "scan.completed": pb.ScanCompleted, "scan.failed": pb.ScanFailed,
    "scan.cancelled": pb.ScanCancelled,
    "enrichment.completed": pb.EnrichmentCompleted, "enrichment.failed": pb.EnrichmentFailed,
    "task.ready": pb.TaskReady, "task.leased": pb.TaskLeased,
    "task.completed": pb.TaskCompleted, "task.failed": pb.TaskFailed,
}


def log(event, **kw):
    print(json.dumps({"t": round(time.time(), 3), "event": event, **kw}, default=str), flush=True)


def scan_request_fingerprint(r) -> str:
    """docs/protocol/reference.md section 3, 'Request fingerprint'."""
    h = hashlib.sha256()

    def field(b: bytes):
        h.update(struct.pack(">Q", len(b)))
        h.update(b)
    field(b"palisade.v1.ScanRequest")
    field(str(uuid.UUID(r.organization_id)).encode())
    field(r.target.encode())
    field(struct.pack(">Q", len(r.plugins)))
    for p in r.plugins:
        field(p.encode())
    field(struct.pack(">i", r.priority))
    field(struct.pack(">I", r.execution_deadline_seconds))
    return h.hexdigest()


def finding_key(plugin, rule_id, resource, discriminator):
    h = hashlib.sha256()
    for s in (plugin, rule_id, resource, discriminator):
        b = s.encode()
        h.update(struct.pack(">Q", len(b)))
        h.update(b)
    return h.hexdigest()


def selftest():
    """Test vectors of docs/protocol/reference.md section 11."""
    r = pb.ScanRequest(schema_version=1, organization_id="0193C3C4-0000-7000-8000-000000000001",
                       target="http://127.0.0.1:8080", plugins=["tcp_connect", "http_headers"],
                       priority=-5, execution_deadline_seconds=600)
    want = "97701d6579137e51cb61d43bc588f0b4c5ac6d6fc58cf7302d43460d533d2837"
    ok = True
    for spelling in ["0193C3C4-0000-7000-8000-000000000001", "0193c3c4-0000-7000-8000-000000000001",
                     "{0193c3c4-0000-7000-8000-000000000001}",
                     "urn:uuid:0193c3c4-0000-7000-8000-000000000001", "0193C3C4000070008000000000000001"]:
        r.organization_id = spelling
        got = scan_request_fingerprint(r)
        log("selftest_fingerprint", spelling=spelling, ok=got == want)
        ok &= got == want
    fk = finding_key("http_headers", "missing-hsts", "http://127.0.0.1:8080/", "")
    ok &= fk == "d18b46724d307d2119dc56b2719a1799b8bdd6a8461b63c001780e68bab1d550"
    log("selftest_finding_key", ok=fk == "d18b46724d307d2119dc56b2719a1799b8bdd6a8461b63c001780e68bab1d550")
    sh = hashlib.sha256(b"abc").hexdigest()
    ok &= sh == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    log("selftest_sha256_hex", ok=ok)
    return ok


def err_dict(msg):
    if not msg.HasField("error"):
        return None
    e = msg.error
    return {"code": e.code, "message": e.message, "active_scan_id": e.active_scan_id or None}


async def submit(a):
    url = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
    prefix = os.environ.get("PALISADE_SUBJECT_PREFIX", "palisade")
    org = str(uuid.UUID(a.org))     # canonical: lowercase hyphenated
    req = pb.ScanRequest(schema_version=1, organization_id=org, target=a.target,
                         plugins=[p for p in a.plugins.split(",") if p], priority=a.priority,
                         execution_deadline_seconds=a.deadline_secs, client_id=a.client_id,
                         idempotency_key=a.key or str(uuid.uuid4()))
    data = req.SerializeToString()
    fp = scan_request_fingerprint(req)
    me = (org, req.client_id, req.idempotency_key)

    nc = await nats.connect([server.strip() for server in url.split(",") if server.strip()],
                            user_credentials=os.environ.get("NATS_CREDS") or None,
                            inbox_prefix=f"_INBOX_{prefix}.client-{req.client_id}")
    js = nc.jetstream()
    subject = f"{prefix}.v1.org.{org}.client.{req.client_id}"
    # Where "now" is, before submitting, so no event of this request is missed (client guide, 4).
    cursor = None
    for attempt in range(1, 6):
        try:
            cursor = (await read_events(nc, subject, org, req.client_id, 0, from_now=True)).cursor
            break
        except (NatsTimeout, NoRespondersError, EventsRefused) as e:
            log("events_retry", reason=repr(e))
            await asyncio.sleep(0.1 * attempt)
    if cursor is None:
        log("result", outcome="no_events")
        return 1
    tasks = None
    if a.watch_tasks:  # a developer's aid: not the client protocol, and not a client's right
        tasks = await js.pull_subscribe(
            f"{prefix}.v1.event.>", stream=f"{prefix.replace('-', '_').upper()}_EVENTS",
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NONE,
                                  inactive_threshold=60.0))

    scan_id = None
    result = None
    if a.path == "js":
        msg_id = f"{req.client_id}:{req.idempotency_key}:{fp}"
        for attempt in range(5):                      # no PubAck: same request, same msg id
            try:
                pa = await js.publish(f"{subject}.request", data, headers={"Nats-Msg-Id": msg_id})
                log("puback", msg_id=msg_id, stream=pa.stream, seq=pa.seq, duplicate=bool(pa.duplicate))
                break
            except Exception as e:  # noqa: BLE001
                log("publish_retry", error=repr(e))
                await asyncio.sleep(0.2 * (attempt + 1))
        else:
            log("result", outcome="not_published")
            return 1
        if pa.duplicate:
            log("note", text="JetStream dropped it as a copy of one stored within 2 minutes; "
                             "no event will follow for it")
    else:
        for attempt in range(1, 6):                   # no reply / internal: identical request again
            try:
                raw = await nc.request(f"{subject}.submit", data, timeout=5)
            except (NatsTimeout, NoRespondersError) as e:
                log("submit_retry", reason=type(e).__name__)
                await asyncio.sleep(0.1 * attempt)
                continue
            rep = pb.ScanRequestReply()
            rep.ParseFromString(raw.data)
            e = err_dict(rep)
            log("scan_request_reply", scan_id=rep.scan_id or None, deduplicated=rep.deduplicated,
                state=rep.state or None, error=e)
            if e and e["code"] == "internal":
                await asyncio.sleep(0.1 * attempt)
                continue
            break
        else:
            log("result", outcome="no_reply")
            return 1
        if e:
            result = {"outcome": "refused", "error": e}
        else:
            scan_id = rep.scan_id
            if rep.state in ("completed", "failed", "cancelled"):
                result = {"outcome": rep.state, "scan_id": scan_id, "deduplicated": rep.deduplicated}
        if result is None and a.no_follow:
            result = {"outcome": rep.state, "scan_id": scan_id, "deduplicated": rep.deduplicated}

    deadline = time.monotonic() + a.timeout
    failures = 0
    while result is None:
        left = deadline - time.monotonic()
        if left <= 0:
            log("result", outcome="timeout", scan_id=scan_id)
            return 1
        if tasks is not None:
            try:
                for m in await tasks.fetch(64, timeout=0.2):
                    on_event(m.subject.rsplit(".event.", 1)[1], m.data, me, scan_id)
            except NatsTimeout:
                pass
        # Short long-polls while task events are watched too; a long one otherwise.
        wait_ms = int(min(left, 0.5 if tasks is not None else 20) * 1000)
        try:
            reply = await read_events(nc, subject, org, req.client_id, cursor, wait_ms=wait_ms)
        except (NatsTimeout, NoRespondersError, EventsRefused) as e:
            failures += 1                          # the same cursor again: it is safe
            log("events_retry", reason=repr(e))
            await asyncio.sleep(min(0.1 * 2 ** failures, 5))
            continue
        failures = 0
        cursor = reply.cursor                      # every event up to here was read
        for e in reply.events:
            result, scan_id = on_event(e.name, e.payload, me, scan_id, seq=e.sequence)
            if result is not None:
                break
    log("result", **result)
    await nc.drain()
    return 0


class EventsRefused(Exception):
    """The events verb answered with an error (internal: ask again with the same cursor)."""


async def read_events(nc, subject, org, client_id, after, from_now=False, wait_ms=0):
    """One request of the events verb (client guide, 4): the events after `after`, and the cursor
    to pass next."""
    req = pb.EventsRequest(schema_version=1, organization_id=org, client_id=client_id,
                           after_sequence=after, from_now=from_now, wait_ms=wait_ms)
    raw = await nc.request(f"{subject}.events", req.SerializeToString(), timeout=wait_ms / 1000 + 10)
    rep = pb.EventsReply()
    rep.ParseFromString(raw.data)
    if rep.HasField("error"):
        raise EventsRefused(f"{rep.error.code}: {rep.error.message}")
    return rep


def coverage_dict(ev):
    """scan.completed's coverage summary (reference 13): complete is not the gate, and a scan
    may complete with its required coverage incomplete (unknown or error entries)."""
    if not ev.HasField("coverage"):
        return None
    c = ev.coverage
    return {"status": c.status, "complete": c.complete,
            "required_incomplete": c.required_incomplete,
            "score": c.score if c.HasField("score") else None, "counts": dict(c.counts)}


def on_event(kind, data, me, scan_id, seq=None):
    """One event named `kind` (`scan.completed`, `task.failed`, …) with its message bytes: logs
    it; returns (the outcome if it ends our request, else None; the scan id)."""
    mid = seq
    cls = EVENT_TYPES.get(kind)
    if cls is None:                            # a name this client does not know: new ones may come
        return None, scan_id
    ev = cls()
    ev.ParseFromString(data)
    if kind.startswith("enrichment."):         # no client or key: ours when it names our scan
        if scan_id and ev.scan_id == scan_id:
            log(kind, scan_id=ev.scan_id, job_id=ev.job_id, seq=seq)
        return None, scan_id
    if kind.startswith("task."):
        if scan_id and ev.scan_id == scan_id:
            f = {k.name: v for k, v in ev.ListFields() if k.name != "error"}
            log(kind, **f, error=err_dict(ev) if hasattr(ev, "error") else None)
        return None, scan_id
    ev_org = str(uuid.UUID(ev.organization_id)) if ev.organization_id else ""
    if (ev_org, ev.client_id, ev.idempotency_key) != me:
        return None, scan_id
    if kind == "scan.admitted":
        log(kind, scan_id=ev.scan_id, seq=mid)
        return None, ev.scan_id
    if kind == "scan.rejected":
        log(kind, error=err_dict(ev), seq=mid)
        return {"outcome": "rejected", "error": err_dict(ev)}, scan_id
    if kind == "scan.completed":
        coverage = coverage_dict(ev)
        log(kind, scan_id=ev.scan_id, finding_count=ev.finding_count,
            enrichment_job_id=ev.enrichment_job_id, coverage=coverage, seq=mid)
        return {"outcome": "completed", "scan_id": ev.scan_id, "finding_count": ev.finding_count,
                "coverage": coverage}, ev.scan_id
    if kind == "scan.failed":
        log(kind, scan_id=ev.scan_id, error=err_dict(ev), seq=mid)
        return {"outcome": "failed", "scan_id": ev.scan_id, "error": err_dict(ev)}, ev.scan_id
    if kind == "scan.cancelled":
        log(kind, scan_id=ev.scan_id, reason=ev.reason, seq=mid)
        return {"outcome": "cancelled", "scan_id": ev.scan_id, "reason": ev.reason}, ev.scan_id
    return None, scan_id


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp = ap.add_subparsers(dest="cmd", required=True)
    sp.add_parser("selftest")
    s = sp.add_parser("submit")
    s.add_argument("--org", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--plugins", required=True)
    s.add_argument("--client-id", default="pyclient")
    s.add_argument("--key")
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--deadline-secs", type=int, default=0)
    s.add_argument("--path", choices=["js", "rr"], default="js")
    s.add_argument("--timeout", type=float, default=60)
    s.add_argument("--no-follow", action="store_true", help="rr: do not wait for a terminal event")
    s.add_argument("--watch-tasks", action="store_true",
                   help="also follow the services' task.* events (needs a user that may read them)")
    a = ap.parse_args()
    if a.cmd == "selftest":
        sys.exit(0 if selftest() else 1)
    sys.exit(asyncio.run(submit(a)))


if __name__ == "__main__":
    main()
