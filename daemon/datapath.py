"""Runs the C data path: one thread per queue pair, each inside nicd_run (the GIL is released
while it runs), each with its own counters that snapshot() sums."""
from __future__ import annotations

import threading
import time

from ..errors import UserError
from ._datapath import ffi, lib
from .config import NicdConfig
from .settings import SETTINGS

# Named by the C side (the NICD_COUNTERS list in nicd_queue.h), in the order of struct nicd_stats.
COUNTERS = [ffi.string(lib.nicd_counter_name(i)).decode().lower() for i in range(lib.NICD_NCOUNTERS)]


class Datapath:
    def __init__(self, cfg: NicdConfig):
        self.cfg = cfg
        if lib.nicd_flows_init(cfg.flow_capacity, cfg.flow_timeout, cfg.flow_owner_cap) != 0:
            raise UserError("cannot allocate the flow table")
        self._workers = []
        for egress, ingress in zip(cfg.egress_queues, cfg.ingress_queues):
            c = ffi.new("struct nicd_config *")
            c.egress_queue, c.ingress_queue = egress, ingress
            for s in SETTINGS:  # the settings the C loop reads (gso resolved to true or false by now)
                if s.c_field:
                    setattr(c, s.c_field, int(getattr(cfg, s.name)))
            st = ffi.new("struct nicd_stats *")
            err = ffi.new("char[256]")
            self._workers.append({"cfg": c, "stats": st, "err": err, "rc": None, "thread": None})
        self.started = time.monotonic()

    def start(self, timeout: float = 5.0) -> None:
        """Start the slow path's conntrack thread (without ctnetlink every flow is taken as the
        hook sees it, daemon/nicd_conntrack.h), then every queue thread, and wait until each has
        bound its queues."""
        lib.nicd_ct_start()
        for w in self._workers:
            def run(w=w):
                w["rc"] = lib.nicd_run(w["cfg"], w["stats"], w["err"], 256)
            w["thread"] = threading.Thread(target=run, name=f"nicd-q{w['cfg'].egress_queue}", daemon=True)
            w["thread"].start()
        deadline = time.monotonic() + timeout
        for w in self._workers:
            while not w["cfg"].ready:
                if w["rc"] is not None and w["rc"] != 0:
                    self.stop()
                    raise UserError(ffi.string(w["err"]).decode())
                if time.monotonic() > deadline:
                    self.stop()
                    raise UserError("the queue threads did not start in time")
                time.sleep(0.01)

    def failed(self) -> str | None:
        """The first queue thread's error if one died, else None."""
        for w in self._workers:
            if w["thread"] is not None and not w["thread"].is_alive() and w["rc"] != 0:
                return ffi.string(w["err"]).decode() or "queue thread stopped"
        return None

    def reload(self, cfg: NicdConfig) -> None:
        """Copy the settings SIGHUP applies (settings.py: reload=True) that the C loop reads into
        every queue thread's config; the loop reads them per packet."""
        for w in self._workers:
            for s in SETTINGS:
                if s.reload and s.c_field:
                    setattr(w["cfg"], s.c_field, int(getattr(cfg, s.name)))

    def stop(self) -> None:
        for w in self._workers:
            w["cfg"].stop = 1
        for w in self._workers:
            if w["thread"] is not None:
                w["thread"].join(timeout=5)
        lib.nicd_ct_stop()
        lib.nicd_flows_free()
        lib.nicd_pmtu_free()

    def expire_flows(self) -> tuple[int, int]:
        """Once a second, off the queue threads: drop idle flows and stale hellos, and look the
        path MTUs of gso's destinations up again (daemon/nicd_pmtu.h). Returns (flows expired,
        negotiated flows active)."""
        active = ffi.new("uint32_t *")
        expired = lib.nicd_flows_expire(active, ffi.NULL)
        if self.cfg.gso:
            lib.nicd_pmtu_refresh()
        return int(expired), int(active[0])

    def snapshot_queues(self) -> list[dict]:
        """Each queue pair's own counters (its thread's), in queue order."""
        return [{"egress_queue": int(w["cfg"].egress_queue), "ingress_queue": int(w["cfg"].ingress_queue),
                 "counters": {name: int(w["stats"].c[i]) for i, name in enumerate(COUNTERS)}}
                for w in self._workers]

    def snapshot(self) -> dict:
        """The counters summed over the queue pairs."""
        totals = dict.fromkeys(COUNTERS, 0)
        for q in self.snapshot_queues():
            for name, v in q["counters"].items():
                totals[name] += v
        return totals
