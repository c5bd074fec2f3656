#!/usr/bin/env python3
"""A palisade worker in Python, written from docs/protocol/ alone (worker.md).

Environment: NATS_URL (default nats://127.0.0.1:4222; a cluster's servers comma-separated),
PALISADE_SUBJECT_PREFIX (default palisade), PALISADE_WORKER_ID (the registered worker UUID;
required), NATS_CREDS (its .creds file, from `palisade worker add --creds`; unset on an
open server).

Plugins:
  py_echo   3 findings and 1 asset (http_service <target>)
  py_echo2  one finding per discovered asset (reads Lease.discovered_assets)
  py_slow   sleeps PY_SLOW_SECONDS (default 60) while renewing, then 1 finding; used to show release

Coverage (reference 6.3 "Declared rules", 6.7 "Evaluations", 13): the hello declares each
plugin's rules (RULES: HelloRequest.rules, one RuleDeclaration per plugin and rule), and each
plugin returns an evaluation of every rule it checked, sent in BatchPayload.evaluations after
the findings: "fail" naming the finding it produced (same rule_id and resource, its
discriminator), "pass", or "not_applicable"/"error" with a reason_code. An evaluation's resource
is exactly the target (kind "target") or an asset's value, for it to meet a required pair.

--demo enables protocol probes on py_echo attempts: batch 1 is held back so the first completion
gets batch_missing, and after the attempt completed the worker replays a batch (expects
duplicate=true), sends the same key with another payload (expects batch_conflict), and checks a
few lease_lost answers. Every step is logged as one JSON line on stdout.
"""
import argparse
import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import time
import uuid

import nats
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

import palisade_pb2 as pb

PROTOCOL_VERSION = "palisade.v1"
SOFTWARE_VERSION = "palisade-py-worker/0.1"
STOP_CODES = ("lease_lost", "cancel_requested")


def log(event, **kw):
    print(json.dumps({"t": round(time.time(), 3), "event": event, **kw}, default=str), flush=True)


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class LeaseLost(Exception):
    pass


class PluginFailed(Exception):
    def __init__(self, code, message, retryable):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.retryable = code, message, retryable


# ------------------------------------------------------------------------------------------
# plugins: (lease, stop_event) -> (findings, assets, evaluations)
# ------------------------------------------------------------------------------------------

# What each plugin checks, and on which kinds of resource: an asset kind, or "target" (the scan's
# target itself). Declared in the hello; a completed scan job requires an evaluation of each rule
# on each resource of those kinds its scan has.
RULES = {
    "py_echo": [
        ("py-echo-info", ["target"]),
        ("py-echo-low", ["target"]),
        # Its finding is on <target>/admin, which is no asset: its evaluation is shown in the
        # scan's coverage without being required.
        ("py-echo-high", ["admin_path"]),
        ("py-echo-url", ["target"]),
    ],
    "py_echo2": [
        ("py-echo2-asset", ["http_service"]),
        ("py-echo2-none", ["target"]),
    ],
    "py_slow": [
        ("py-slow-done", ["target"]),
    ],
}


def evaluation(rule_id, resource, status, reason_code="", evidence="", finding_discriminator=""):
    return pb.Evaluation(rule_id=rule_id, resource=resource, status=status, reason_code=reason_code,
                         evidence=evidence, finding_discriminator=finding_discriminator)


def failed(finding):
    """The FAIL evaluation of the rule that produced `finding`, naming it."""
    return evaluation(finding.rule_id, finding.resource, "fail",
                      finding_discriminator=finding.discriminator)


async def plugin_py_echo(lease, stop):
    t = lease.target
    findings = [
        pb.Finding(rule_id="py-echo-info", resource=t, severity="info", title="py_echo saw the target",
                   description="informational echo", evidence="echo"),
        pb.Finding(rule_id="py-echo-low", resource=t, discriminator="a", severity="low",
                   title="py_echo low finding", description="a low finding",
                   evidence="password=hunter2 should be redacted"),
        pb.Finding(rule_id="py-echo-high", resource=t + "/admin", severity="high",
                   title="py_echo high finding", cve_ids=["CVE-2021-44228"]),
    ]
    assets = [pb.Asset(kind="http_service", value=t)]
    evaluations = [failed(f) for f in findings]
    if "://" in t:
        evaluations.append(evaluation("py-echo-url", t, "pass"))
    else:
        evaluations.append(evaluation("py-echo-url", t, "not_applicable", reason_code="not_a_url"))
    return findings, assets, evaluations


async def plugin_py_echo2(lease, stop):
    findings = [
        pb.Finding(rule_id="py-echo2-asset", resource=a.value, discriminator=a.kind, severity="medium",
                   title=f"py_echo2 looked at {a.kind}",
                   description=f"asset discovered earlier in the scan: {a.kind} {a.value}")
        for a in lease.discovered_assets
    ]
    evaluations = []
    if findings:
        evaluations.append(evaluation("py-echo2-none", lease.target, "pass"))
    else:
        findings.append(pb.Finding(rule_id="py-echo2-none", resource=lease.target, severity="info",
                                   title="py_echo2 found no discovered assets"))
    # One evaluation per (rule, resource): two assets of one value give one.
    seen = set()
    for f in findings:
        if (f.rule_id, f.resource) not in seen:
            seen.add((f.rule_id, f.resource))
            evaluations.append(failed(f))
    return findings, [], evaluations


async def plugin_py_slow(lease, stop):
    secs = float(os.environ.get("PY_SLOW_SECONDS", "60"))
    try:
        await asyncio.wait_for(stop.wait(), timeout=secs)
        raise LeaseLost()
    except asyncio.TimeoutError:
        pass
    finding = pb.Finding(rule_id="py-slow-done", resource=lease.target, severity="info",
                         title=f"py_slow slept {secs}s")
    return [finding], [], [failed(finding)]


PLUGINS = {"py_echo": plugin_py_echo, "py_echo2": plugin_py_echo2, "py_slow": plugin_py_slow}


# ------------------------------------------------------------------------------------------

class Worker:
    def __init__(self, nc, prefix, wid, capacity, wait_ms, demo, findings_per_batch):
        self.nc, self.js = nc, nc.jetstream()
        self.prefix, self.wid, self.capacity = prefix, wid, capacity
        self.wait_ms, self.demo, self.findings_per_batch_override = wait_ms, demo, findings_per_batch
        self.routes = {}        # attempt_id -> {(kind, seq): Future[IngestAck]}
        self.sends = {}         # first msg id -> number of sends so far (an id is never reused)
        self.active = {}        # attempt_id -> (LeaseRef, asyncio.Task)
        self.stopping = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.hello = None
        self.acquire_replay_probed = False

    def subj(self, verb):
        return f"{self.prefix}.v1.worker.{self.wid}.{verb}"

    # -- step 2: ack subject -----------------------------------------------------------------
    async def on_ack(self, msg):
        ack = pb.IngestAck()
        try:
            ack.ParseFromString(msg.data)
        except Exception as e:  # noqa: BLE001
            log("ack_undecodable", error=str(e))
            return
        e = ack.error if ack.HasField("error") else None
        info = dict(kind=ack.kind, attempt_id=ack.attempt_id, idempotency_key=ack.idempotency_key,
                    seq=ack.sequence_number, duplicate=ack.duplicate,
                    error=(e.code if e else None), error_message=(e.message if e else None),
                    missing=(list(e.missing_sequence_numbers) if e else None))
        waiters = self.routes.get(ack.attempt_id)
        key = (ack.kind, ack.sequence_number if ack.kind == "result" else 0)
        fut = waiters.get(key) if waiters else None
        if fut is not None and not fut.done():
            log("ingest_ack", **info)
            fut.set_result(ack)
        else:
            log("ingest_ack_unrouted", **info)  # late duplicate ack, or nobody waiting

    # -- core-NATS request helpers ------------------------------------------------------------
    async def request(self, verb, msg, reply_cls, timeout=5.0):
        raw = await self.nc.request(self.subj(verb), msg.SerializeToString(), timeout=timeout)
        r = reply_cls()
        r.ParseFromString(raw.data)
        return r

    # -- step 3: hello ------------------------------------------------------------------------
    async def say_hello(self):
        rules = [pb.RuleDeclaration(plugin=plugin, rule_id=rule_id, resource_kinds=kinds)
                 for plugin in sorted(PLUGINS) for rule_id, kinds in RULES.get(plugin, [])]
        req = pb.HelloRequest(schema_version=1, worker_id=self.wid, software_version=SOFTWARE_VERSION,
                              protocol_version=PROTOCOL_VERSION, capabilities=sorted(PLUGINS),
                              capacity=self.capacity, rules=rules)
        delay = 0.25
        while True:
            try:
                r = await self.request("hello", req, pb.HelloReply)
                if not r.HasField("error"):
                    self.hello = r
                    log("hello_ok", lease_ttl_ms=r.lease_ttl_ms, renew_interval_ms=r.renew_interval_ms,
                        batch_findings_max=r.batch_findings_max, batch_bytes_max=r.batch_bytes_max,
                        organization_ids=list(r.organization_ids))
                    return
                if r.error.code != "internal":
                    log("hello_refused", code=r.error.code, message=r.error.message)
                    raise SystemExit(2)
                log("hello_retry", reason="internal")
            except (NatsTimeout, NoRespondersError) as e:
                log("hello_retry", reason=type(e).__name__)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 10.0)

    # -- step 4: acquire ----------------------------------------------------------------------
    async def acquire_loop(self):
        backoff = 0.25
        while not self.stopping.is_set():
            free = self.capacity - len(self.active)
            if free <= 0:
                self.slot_freed.clear()
                stop_w = asyncio.ensure_future(self.stopping.wait())
                slot_w = asyncio.ensure_future(self.slot_freed.wait())
                await asyncio.wait({stop_w, slot_w}, return_when=asyncio.FIRST_COMPLETED)
                stop_w.cancel(); slot_w.cancel()
                continue
            req = pb.AcquireRequest(schema_version=1, worker_id=self.wid, request_id=str(uuid.uuid4()),
                                    max_tasks=min(free, 256), wait_ms=self.wait_ms)
            sent_at = time.monotonic()
            tries = 0
            while True:  # no reply: resend the SAME request (same request_id)
                tries += 1
                try:
                    r = await self.request("acquire", req, pb.AcquireReply,
                                           timeout=self.wait_ms / 1000 + 5)
                    break
                except (NatsTimeout, NoRespondersError) as e:
                    log("acquire_resend_same_request_id", request_id=req.request_id, try_=tries,
                        reason=type(e).__name__)
                    await asyncio.sleep(min(0.25 * 2 ** tries, 5))
            if r.HasField("error"):
                code = r.error.code
                log("acquire_error", code=code, message=r.error.message)
                if code == "invalid_field" and "hello" in r.error.message:
                    await self.say_hello()
                    continue
                if code in ("internal", "worker_not_assigned"):
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, 10.0)
                    continue
                raise SystemExit(3)
            backoff = 0.25
            leases = list(r.leases)
            if self.demo and leases and not self.acquire_replay_probed:
                # Simulate a lost AcquireReply: resend the SAME request (same request_id); dispatch
                # must answer with the leases that request was granted, not new ones.
                self.acquire_replay_probed = True
                again = await self.request("acquire", req, pb.AcquireReply, timeout=self.wait_ms / 1000 + 5)
                first = sorted(l.lease.attempt_id for l in leases)
                second = sorted(l.lease.attempt_id for l in again.leases)
                log("probe", name="acquire replay with same request_id", expect=first, got=second,
                    remaining_ms=[l.lease_expires_in_ms for l in again.leases], ok=first == second)
            for i, lease in enumerate(leases):
                ref = lease.lease
                log("lease", task_id=ref.task_id, attempt_id=ref.attempt_id,
                    attempt_number=ref.attempt_number, plugin=lease.plugin, target=lease.target,
                    scan_id=lease.scan_id, position=lease.position,
                    lease_expires_in_ms=lease.lease_expires_in_ms,
                    execution_deadline_in_ms=lease.execution_deadline_in_ms,
                    discovered_assets=[(a.kind, a.value) for a in lease.discovered_assets])
                if self.stopping.is_set() or i >= free or ref.attempt_id in self.active:
                    if ref.attempt_id not in self.active:
                        asyncio.ensure_future(self.release(ref, "not wanted: stopping or over capacity"))
                    continue
                t = asyncio.ensure_future(self.run_lease(lease, sent_at))
                self.active[ref.attempt_id] = (ref, t)
            if not leases:
                await asyncio.sleep(0.1)

    # -- step 8: release ----------------------------------------------------------------------
    async def release(self, ref, reason):
        req = pb.ReleaseRequest(schema_version=1, worker_id=self.wid, lease=ref, reason=reason[:512])
        for attempt in range(2):  # no reply: once more, then leave it to expire
            try:
                r = await self.request("release", req, pb.ReleaseReply)
                code = r.error.code if r.HasField("error") else None
                log("release", attempt_id=ref.attempt_id, error=code)
                return code
            except (NatsTimeout, NoRespondersError) as e:
                log("release_no_reply", attempt_id=ref.attempt_id, reason=type(e).__name__)
        return "no_reply"

    async def shutdown(self):
        running = list(self.active.items())
        for aid, (ref, task) in running:
            task.cancel()
        for aid, (ref, task) in running:
            try:
                await task
            except BaseException:  # noqa: BLE001
                pass
            await self.release(ref, "worker shutting down")

    # -- step 5: renew ------------------------------------------------------------------------
    async def renewer(self, ref, expires_at, lost):
        h = self.hello
        every = min(h.renew_interval_ms, h.lease_ttl_ms // 3) / 1000
        try:
            while True:
                now = time.monotonic()
                if now >= expires_at:
                    log("lease_presumed_lost", attempt_id=ref.attempt_id)
                    return
                await asyncio.sleep(max(0.2, min(every, (expires_at - now) / 2)))
                t = time.monotonic()
                try:
                    r = await self.request("renew", pb.RenewRequest(schema_version=1, worker_id=self.wid,
                                                                    lease=ref), pb.RenewReply)
                except (NatsTimeout, NoRespondersError) as e:
                    log("renew_no_reply", attempt_id=ref.attempt_id, reason=type(e).__name__)
                    continue
                if not r.HasField("error"):
                    expires_at = t + r.lease_expires_in_ms / 1000
                    log("renew_ok", attempt_id=ref.attempt_id, lease_expires_in_ms=r.lease_expires_in_ms)
                elif r.error.code in STOP_CODES:
                    log("renew_stop", attempt_id=ref.attempt_id, code=r.error.code)
                    return
                else:
                    log("renew_error", attempt_id=ref.attempt_id, code=r.error.code)
        finally:
            lost.set()

    # -- sending to ingestion with IngestAck waits --------------------------------------------
    def _waiter(self, aid, kind, seq):
        fut = asyncio.get_running_loop().create_future()
        self.routes.setdefault(aid, {})[(kind, seq)] = fut
        return fut

    async def send_once(self, verb, first_id, data, aid, kind, seq, timeout, stop):
        """One send with the next msg id; returns the IngestAck or None on timeout."""
        n = self.sends.get(first_id, 0)
        self.sends[first_id] = n + 1
        msg_id = first_id if n == 0 else f"{first_id}:r{n}"
        fut = self._waiter(aid, kind, seq)
        try:
            pa = await self.js.publish(self.subj(verb), data, headers={"Nats-Msg-Id": msg_id})
            log("published", subject=verb, msg_id=msg_id, stream=pa.stream, seq=pa.seq,
                duplicate=bool(pa.duplicate))
        except Exception as e:  # noqa: BLE001  no PubAck: not stored, the next send covers it
            log("publish_failed", subject=verb, msg_id=msg_id, error=repr(e))
        waits = {fut}
        stop_w = None
        if stop is not None:
            stop_w = asyncio.ensure_future(stop.wait())
            waits.add(stop_w)
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if stop_w is not None:
            stop_w.cancel()
        self.routes.get(aid, {}).pop((kind, seq), None)
        if fut in done:
            return fut.result()
        fut.cancel()
        if stop is not None and stop.is_set():
            raise LeaseLost()
        return None

    async def send_and_wait_ack(self, verb, first_id, data, aid, kind, seq=0, stop=None):
        timeout = 5.0
        for _ in range(20):
            ack = await self.send_once(verb, first_id, data, aid, kind, seq, timeout, stop)
            if ack is not None:
                code = ack.error.code if ack.HasField("error") else None
                if code in STOP_CODES:
                    raise LeaseLost()
                if code != "internal":
                    if kind == "result" and code is not None:
                        raise PluginFailed("result_refused", f"batch {seq}: {code}: {ack.error.message}",
                                           retryable=False)
                    return ack
            timeout = min(timeout * 2, 60.0)
        raise LeaseLost()  # give up; the lease expires and the reaper retries

    # -- batching ------------------------------------------------------------------------------
    def cut_batches(self, findings, assets, evaluations):
        h = self.hello
        fmax = h.batch_findings_max or 1000
        if self.findings_per_batch_override:
            fmax = min(fmax, self.findings_per_batch_override)
        bmax = min(h.batch_bytes_max or 1048576, self.nc.max_payload - 8192)
        batches, cur = [], pb.BatchPayload()

        def flush():
            nonlocal cur
            if cur.findings or cur.assets or cur.evaluations:
                batches.append(cur.SerializeToString())
            cur = pb.BatchPayload()

        for a in assets:
            cur.assets.append(a)
            if cur.ByteSize() > bmax:
                del cur.assets[-1]; flush(); cur.assets.append(a)
        for f in findings:
            if len(cur.findings) >= fmax:
                flush()
            cur.findings.append(f)
            if cur.ByteSize() > bmax:
                del cur.findings[-1]; flush(); cur.findings.append(f)
            if cur.ByteSize() > bmax:
                raise PluginFailed("result_too_large", "one finding exceeds batch_bytes_max", False)
        # Findings and evaluations together count against batch_findings_max; each FAIL comes
        # after its finding.
        for e in evaluations:
            if len(cur.findings) + len(cur.evaluations) >= fmax:
                flush()
            cur.evaluations.append(e)
            if cur.ByteSize() > bmax:
                del cur.evaluations[-1]; flush(); cur.evaluations.append(e)
            if cur.ByteSize() > bmax:
                raise PluginFailed("result_too_large", "one evaluation exceeds batch_bytes_max", False)
        flush()
        return batches

    def result_batch(self, ref, seq, payload, key=None):
        key = key or f"{ref.attempt_id}:{seq}"
        return key, pb.ResultBatch(schema_version=1, worker_id=self.wid, lease=ref, sequence_number=seq,
                                   idempotency_key=key, payload_sha256=sha256_hex(payload),
                                   payload=payload).SerializeToString()

    # -- one lease -----------------------------------------------------------------------------
    async def run_lease(self, lease, sent_at):
        ref, aid = lease.lease, lease.lease.attempt_id
        self.routes.setdefault(aid, {})
        lost = asyncio.Event()
        expires_at = sent_at + lease.lease_expires_in_ms / 1000
        renew_task = asyncio.ensure_future(self.renewer(ref, expires_at, lost))
        demo = self.demo and lease.plugin == "py_echo"
        try:
            plugin = PLUGINS.get(lease.plugin)
            if plugin is None:
                raise PluginFailed("unknown_plugin", f"this worker has no plugin {lease.plugin}", True)
            try:
                timeout = lease.execution_deadline_in_ms / 1000 if lease.execution_deadline_in_ms else None
                if timeout is not None:
                    timeout = max(0.0, sent_at + timeout - time.monotonic())
                findings, assets, evaluations = await asyncio.wait_for(plugin(lease, lost),
                                                                       timeout=timeout)
            except asyncio.TimeoutError:
                raise PluginFailed("deadline_exceeded", "execution deadline passed", False)
            except (LeaseLost, PluginFailed):
                raise
            except Exception as e:  # noqa: BLE001
                raise PluginFailed("plugin_panicked", repr(e), True)
            if lost.is_set():
                raise LeaseLost()

            payloads = self.cut_batches(findings, assets, evaluations)
            batches = []
            for seq, payload in enumerate(payloads):
                key, msg = self.result_batch(ref, seq, payload)
                batches.append((key, msg))
                if demo and seq == 1:
                    log("demo_hold_back_batch", attempt_id=aid, seq=seq)
                    continue
                ack = await self.send_and_wait_ack("result", key, msg, aid, "result", seq, lost)
                log("batch_accepted", attempt_id=aid, seq=seq, duplicate=ack.duplicate)

            done = pb.TaskComplete(schema_version=1, worker_id=self.wid, lease=ref,
                                   batch_count=len(batches),
                                   summary=f"{lease.plugin}: {len(findings)} findings, {len(assets)} assets, "
                                           f"{len(evaluations)} evaluations"
                                   ).SerializeToString()
            for _ in range(5):
                ack = await self.send_and_wait_ack("complete", f"complete:{aid}", done, aid, "complete",
                                                   0, lost)
                code = ack.error.code if ack.HasField("error") else None
                if code is None or code == "evidence_conflict":
                    log("task_completed", attempt_id=aid, plugin=lease.plugin, duplicate=ack.duplicate,
                        code=code)
                    break
                if code != "batch_missing":
                    raise PluginFailed("completion_refused", code, False)
                missing = list(ack.error.missing_sequence_numbers)
                log("batch_missing", attempt_id=aid, missing=missing)
                for s in missing:
                    if s >= len(batches):
                        raise PluginFailed("completion_refused", f"ingestion misses unknown batch {s}", False)
                    key, msg = batches[s]
                    ack = await self.send_and_wait_ack("result", key, msg, aid, "result", s, lost)
                    log("batch_accepted", attempt_id=aid, seq=s, duplicate=ack.duplicate)
            else:
                raise PluginFailed("batch_missing", "still missing after 5 completions", True)

            if demo:
                renew_task.cancel()
                await self.probes(lease, batches)
        except LeaseLost:
            log("attempt_stopped_lease_lost", attempt_id=aid)
        except PluginFailed as e:
            log("attempt_failing", attempt_id=aid, code=e.code, message=e.message, retryable=e.retryable)
            fail = pb.TaskFail(schema_version=1, worker_id=self.wid, lease=ref,
                               error=pb.Error(code=e.code, message=e.message[:4096]),
                               retryable=e.retryable).SerializeToString()
            try:
                ack = await self.send_and_wait_ack("fail", f"fail:{aid}", fail, aid, "fail", 0, lost)
                log("task_failed_sent", attempt_id=aid,
                    error=ack.error.code if ack.HasField("error") else None)
            except LeaseLost:
                log("attempt_stopped_lease_lost", attempt_id=aid)
        finally:
            renew_task.cancel()
            self.routes.pop(aid, None)
            self.active.pop(aid, None)
            self.slot_freed.set()

    # -- demo probes after a completed attempt -------------------------------------------------
    async def probes(self, lease, batches):
        ref, aid = lease.lease, lease.lease.attempt_id

        async def probe(name, expect, coro):
            try:
                got = await coro
            except Exception as e:  # noqa: BLE001
                got = f"exception {e!r}"
            log("probe", name=name, expect=expect, got=got, ok=(got in expect.split(" or ")))

        async def batch_probe(first_id, data, seq):
            ack = await self.send_once("result", first_id, data, aid, "result", seq, 10.0, None)
            if ack is None:
                return "no ack"
            return (ack.error.code if ack.HasField("error") else "accepted") + \
                (" duplicate=true" if ack.duplicate else "")

        # 1. replay of an accepted batch, new msg id {key}:r{n}
        key0, msg0 = batches[0]
        await probe("replayed batch", "accepted duplicate=true", batch_probe(key0, msg0, 0))
        # 2. same key, other payload (correct checksum of the new payload)
        other = pb.BatchPayload()
        other.ParseFromString(pb.ResultBatch.FromString(msg0).payload)
        other.findings.append(pb.Finding(rule_id="py-echo-extra", resource=lease.target, severity="low",
                                         title="not in the original batch"))
        _, conflict = self.result_batch(ref, 0, other.SerializeToString(), key=key0)
        await probe("same key, other checksum", "batch_conflict", batch_probe(key0, conflict, 0))
        # 2b. another key for a sequence number this attempt already used (checked before or after
        # the lease? the document does not say)
        _, other_key = self.result_batch(ref, 0, pb.ResultBatch.FromString(msg0).payload, key=f"{aid}:0:x")
        await probe("other key for a used sequence number", "batch_conflict or lease_lost",
                    batch_probe(f"{aid}:0:x", other_key, 0))
        # 3. wrong checksum on a fresh key (checksum check vs lease check order is not documented)
        bad = pb.ResultBatch.FromString(msg0)
        bad.idempotency_key = f"{aid}:50"
        bad.sequence_number = 50
        bad.payload_sha256 = sha256_hex(b"not the payload")
        await probe("checksum mismatch after completion", "checksum_mismatch or lease_lost",
                    batch_probe(bad.idempotency_key, bad.SerializeToString(), 50))
        # 4. a new batch after the completion: lease_lost
        key9, msg9 = self.result_batch(ref, 9, pb.ResultBatch.FromString(msg0).payload)
        await probe("new batch after completion", "lease_lost", batch_probe(key9, msg9, 9))
        # 5. completion replay: duplicate
        done = pb.TaskComplete(schema_version=1, worker_id=self.wid, lease=ref, batch_count=len(batches),
                               summary="replay").SerializeToString()

        async def complete_probe():
            ack = await self.send_once("complete", f"complete:{aid}", done, aid, "complete", 0, 10.0, None)
            if ack is None:
                return "no ack"
            return (ack.error.code if ack.HasField("error") else "accepted") + \
                (" duplicate=true" if ack.duplicate else "")
        await probe("replayed completion", "accepted duplicate=true", complete_probe())
        # 6. renew and release after the attempt ended: lease_lost

        async def renew_probe():
            r = await self.request("renew", pb.RenewRequest(schema_version=1, worker_id=self.wid, lease=ref),
                                   pb.RenewReply)
            return r.error.code if r.HasField("error") else "ok"
        await probe("renew after completion", "lease_lost", renew_probe())
        await probe("release after completion", "lease_lost", self.release(ref, "probe"))


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=2)
    ap.add_argument("--wait-ms", type=int, default=10000)
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--findings-per-batch", type=int, default=0,
                    help="cap findings per batch below the hello's batch_findings_max")
    a = ap.parse_args()
    url = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
    prefix = os.environ.get("PALISADE_SUBJECT_PREFIX", "palisade")
    wid = os.environ.get("PALISADE_WORKER_ID")
    if not wid:
        sys.exit("PALISADE_WORKER_ID is required")
    wid = str(uuid.UUID(wid))  # canonical lowercase hyphenated, same in subject and fields

    # Its own credentials (NATS_CREDS, from `palisade worker add --creds`) and its own inbox:
    # the server delivers its replies only under _INBOX_<prefix>.worker-<id> (reference, 12).
    nc = await nats.connect([server.strip() for server in url.split(",") if server.strip()],
                            user_credentials=os.environ.get("NATS_CREDS") or None,
                            inbox_prefix=f"_INBOX_{prefix}.worker-{wid}")
    w = Worker(nc, prefix, wid, a.capacity, a.wait_ms, a.demo, a.findings_per_batch)
    await nc.subscribe(w.subj("ack"), cb=w.on_ack)   # step 2: before sending anything
    await nc.flush()
    log("subscribed", subject=w.subj("ack"))
    await w.say_hello()

    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, lambda s=s: (log("signal", sig=s.name), w.stopping.set()))
    acq = asyncio.ensure_future(w.acquire_loop())
    await w.stopping.wait()
    log("stopping", running=list(w.active))
    await w.shutdown()                 # stop plugins, release their leases
    await acq                          # the pending acquire returns within wait_ms; extra leases released
    await w.shutdown()
    await asyncio.sleep(0.5)
    await nc.drain()
    log("stopped")


if __name__ == "__main__":
    asyncio.run(main())
