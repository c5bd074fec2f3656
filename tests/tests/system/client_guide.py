"""Drives the client guide's Python (docs/protocol/client.md), which client_guide.rs wrote next
to this file as `guide.py`, the way a client would use it: two scans submitted at once on the
durable path and followed to their outcome by the guide's `submit`, the first submitted again
(the PubAck is a duplicate, so the guide asks over request/reply), then a finding of the first
marked a false positive twice over with the guide's findings functions, the second time on the
revision the first change moved past. The test plays the worker meanwhile.

Reads GUIDE_* (what to submit) besides what the guide reads (NATS_URL, NATS_CREDS,
PALISADE_SUBJECT_PREFIX). Prints one JSON line: what the guide's functions returned, and the
event names each `submit` loop was handed.
"""
import asyncio
import contextvars
import json
import os
import uuid

import guide

ORG = os.environ["GUIDE_ORG"]                 # as the test spelt it; the guide canonicalises
CLIENT = os.environ["GUIDE_CLIENT_ID"]
PLUGIN = os.environ["GUIDE_PLUGIN"]
SCANS = {"a": (os.environ["GUIDE_TARGET_A"], os.environ["GUIDE_KEY_A"]),
         "b": (os.environ["GUIDE_TARGET_B"], os.environ["GUIDE_KEY_B"])}

# Which submit a read belongs to, and the event names each one's loop read.
current = contextvars.ContextVar("current")
seen = {}
read_events = guide.read_events


async def recorded(*args, **kwargs):
    reply = await read_events(*args, **kwargs)
    seen[current.get()].extend(e.name for e in reply.events)
    return reply


guide.read_events = recorded


async def submit(nc, label, scan):
    current.set(label)
    seen[label] = []
    target, key = SCANS[scan]
    return await guide.submit(nc, ORG, target, [PLUGIN], CLIENT, key)


def outcome(name, ev):
    fields = {"name": name, "scan_id": ev.scan_id}
    if name == "scan.completed":
        fields["finding_count"] = ev.finding_count
        fields["enrichment_job_id"] = ev.enrichment_job_id
    if name == "reply":
        fields.update(deduplicated=ev.deduplicated, state=ev.state,
                      error=ev.error.code if ev.HasField("error") else None)
    return fields


async def main():
    nc = await guide.connect(CLIENT)
    a, b = await asyncio.gather(submit(nc, "a", "a"), submit(nc, "b", "b"))
    replay = await submit(nc, "replay", "a")
    target, key = SCANS["a"]
    fingerprint = guide.scan_request_fingerprint(guide.pb.ScanRequest(
        schema_version=1, organization_id=ORG, target=target, plugins=[PLUGIN], priority=0,
        execution_deadline_seconds=0, client_id=CLIENT, idempotency_key=key))

    org = str(uuid.UUID(ORG))
    page = await guide.findings(nc, org, CLIENT, list=guide.pb.ListFindings(scan_id=a[1].scan_id))
    assert not page.HasField("error"), page.error
    finding = page.page.findings[0]
    first = await guide.mark_false_positive(nc, org, CLIENT, finding)
    again = await guide.mark_false_positive(nc, org, CLIENT, finding)
    await nc.close()
    print(json.dumps({
        "a": outcome(*a), "b": outcome(*b), "replay": outcome(*replay), "seen": seen,
        "fingerprint": fingerprint,
        "findings": [{"id": f.id, "revision": f.revision} for f in page.page.findings],
        "first": {"error": first.error.code if first.HasField("error") else None,
                  "revision": first.set.revision},
        "again": {"error": again.error.code if again.HasField("error") else None},
    }), flush=True)


asyncio.run(main())
