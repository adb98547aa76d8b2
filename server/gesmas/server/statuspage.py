"""The status page of a replica, served on its metrics port (`/status`, its data at
`/status.json`, refreshed every second by a little script; no build step). It shows what this
replica knows: the members with their role, match index and connectivity, the leader, the
objects with their class, version, waiters, who created them and, for the standard classes that
have one, who holds them now (a lock's holder, an election's leader...), the sessions with their
age and, on the leader, how long since it heard from each. It reads the local state (not through
the log), so a lagging replica shows its own view; ages and silences are measured by this
replica's clock at the moment of the request, so they go on growing on an idle cluster.

The port has no authentication: bind it to an address only operators reach (it shows object
names and session ids, never secrets).
"""
from __future__ import annotations

import threading
import time
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable

from .kernel.auth import SYSTEM

if TYPE_CHECKING:  # pragma: no cover
    from .kernel import Kernel
    from .node import Node

MAX_ROWS = 500          # objects and sessions listed (the counts are always complete)
READ_WAIT = 1.0         # seconds to wait for a moment between two entries
wall = time.time        # this replica's clock (sessions' opening times are wall times)
monotonic = time.monotonic      # the clock the leader's duties note keep-alives by

#: The standard classes whose objects have a holder, and how to show it: the declared
#: read-only method that tells, and its answer as text (names only the replicas may register,
#: so these readers are the trusted ones and run on the live object).
HOLDERS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "Lock": ("holder", lambda h: f"session {h['session']} (fence {h['fence']})"),
    "LeaderElection": ("leader", lambda h: f"session {h['session']} (term {h['term']})"),
    "ReadWriteLock": ("state", lambda h: f"writer: session {h['writer']}" if h["writer"]
                      else f"{h['readers']} reader(s)" if h["readers"] else ""),
    "Semaphore": ("holders", lambda h: ", ".join(f"session {s}: {n}"
                                                 for s, n in sorted(h.items()))),
}


def snapshot(node: Node) -> dict[str, Any]:
    """The page's data, read on the HTTP thread. The counts are read at once (sizes, each
    read atomic); the rows (the first MAX_ROWS objects in name order, from the names the
    kernel keeps sorted, and the first sessions) are read between two entries, as a read
    without a log entry is. While the replica applies an entry longer than READ_WAIT the
    page shows the counts alone and says why."""
    out: dict[str, Any] = {"generated": time.time(), "node": node.config.node_id,
                           "client_addr": node.config.client_addr}
    try:
        out.update(node.status())
    except Exception as e:          # not started yet, or stopped
        out["error"] = f"{type(e).__name__}: {e}"
    k = node.kernel
    if k is None:
        return out
    out["kernel_time"] = k.now
    out["object_count"], out["session_count"] = len(k.objects), len(k.sessions)
    out["waiter_count"] = k._waiting
    rows = _rows(node)
    if rows is None:
        out["rows_note"] = f"the replica is applying an entry (over {READ_WAIT:g} s): counts only"
    else:
        out.update(rows)
    return out


def _rows(node: Node) -> dict[str, Any] | None:
    replica = node.replica
    if replica is None:
        return None
    done = threading.Event()
    box: list[Any] = []

    def read(kernel: Kernel) -> dict[str, Any]:
        now, clock = wall(), monotonic()
        sessions = list(islice(kernel.sessions.values(), MAX_ROWS))
        objects = kernel.queries.page(limit=MAX_ROWS)["objects"]
        for o in objects:
            o["holder"] = _holder(kernel, o["name"], o["class"])
        silent = node.leader_duties.silent_for
        return {
            "kernel_time": kernel.now, "object_count": len(kernel.objects),
            "session_count": len(kernel.sessions), "waiter_count": kernel._waiting,
            "objects": objects,
            "sessions": [{"id": s.id, "user": s.user, "ttl": s.ttl,
                          "age": round(max(0.0, now - s.opened), 1) if s.opened else None,
                          "silent": _rounded(silent(s.id, clock)),
                          "waiting": sum(1 for r in s.inflight.values()
                                         if r.waiter is not None)}
                         for s in sessions]}

    def finish(value: Any, index: int, error: BaseException | None) -> None:
        box.append(value if error is None else None)
        done.set()
    try:
        handle = replica.read_applied(0, lambda sm: read(sm.kernel), finish)
    except Exception:               # stopped meanwhile
        return None
    if not done.wait(READ_WAIT):
        handle.cancelled = True
        return None
    return box[0]


def _holder(kernel: Kernel, name: str, class_name: str) -> str:
    """Who holds object `name` now, as text ("" if nobody, or if its class has no holder)."""
    shown = HOLDERS.get(class_name)
    if shown is None:
        return ""
    try:
        held = kernel.read(SYSTEM, name, shown[0])
        return shown[1](held) if held else ""
    except Exception as e:          # a standard class of another version, say
        return f"? ({type(e).__name__})"


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gesmas status</title>
<style>
 body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
 h1{font-size:20px;margin:0 0 .2em} h2{font-size:16px;margin:1.2em 0 .4em}
 table{border-collapse:collapse;min-width:40em} td,th{padding:.25em .8em;text-align:left;
 border-bottom:1px solid #ddd} th{background:#f4f4f4} .num{text-align:right}
 .ok{color:#17803d;font-weight:600} .bad{color:#b42318;font-weight:600} .muted{color:#777}
</style></head><body>
<h1>gesmas <span id="node"></span></h1>
<div id="summary" class="muted">loading…</div>
<h2>Members</h2>
<table id="members"><thead><tr><th>Raft address</th><th>client address</th><th>role</th>
<th class="num">match index</th><th>reached</th></tr></thead><tbody></tbody></table>
<h2>Objects <span id="objcount" class="muted"></span></h2>
<table id="objects"><thead><tr><th>name</th><th>class</th><th class="num">version</th>
<th class="num">waiters</th><th>holder</th><th>created by</th></tr></thead><tbody></tbody>
</table>
<h2>Sessions <span id="sesscount" class="muted"></span></h2>
<table id="sessions"><thead><tr><th class="num">id</th><th>user</th><th class="num">age (s)</th>
<th class="num" title="since the leader last heard from it (shown on the leader only);
 the session expires when this passes its ttl">silent (s)</th>
<th class="num">ttl (s)</th><th class="num">waiting calls</th></tr></thead><tbody></tbody>
</table>
<script>
function cell(v, cls){const td=document.createElement('td'); td.textContent=(v===null||v===undefined)?'':v;
 if(cls) td.className=cls; return td;}
function fill(id, rows, make){const tb=document.querySelector('#'+id+' tbody'); tb.replaceChildren();
 for(const r of rows){const tr=document.createElement('tr'); for(const c of make(r)) tr.appendChild(c);
 tb.appendChild(tr);}}
async function refresh(){
 try{
  const s=await (await fetch('status.json',{cache:'no-store'})).json();
  document.getElementById('node').textContent='node '+s.node+' ('+s.client_addr+')';
  document.getElementById('summary').textContent=s.error ? s.error :
   'leader '+(s.leader_address||'unknown')+' · term '+s.term+' · commit '+s.commit_index+
   ' · applied '+s.last_applied+' · '+s.waiter_count+' waiters · updated '+
   new Date(s.generated*1000).toLocaleTimeString()+
   (s.rejoining ? ' · REJOINING (started empty): no votes until caught up' : '');
  fill('members', s.nodes||[], n=>[cell(n.node_id), cell(n.address),
   cell(n.address && n.address===s.leader_address ? 'leader':'follower'),
   cell(n.match_index,'num'), cell(n.connected?'yes':'NO', n.connected?'ok':'bad')]);
  const shown=(s.objects||[]).length, count=s.object_count||0;
  document.getElementById('objcount').textContent=s.rows_note ? '('+count+'; '+s.rows_note+')' :
   shown<count ? '(the first '+shown+' of '+count+', by name)' : '('+count+')';
  fill('objects', s.objects||[], o=>[cell(o.name), cell(o.class), cell(o.version,'num'),
   cell(o.waiters,'num'), cell(o.holder), cell(o.owner)]);
  const sshown=(s.sessions||[]).length, scount=s.session_count||0;
  document.getElementById('sesscount').textContent=
   sshown<scount ? '(the first '+sshown+' of '+scount+')' : '('+scount+')';
  fill('sessions', s.sessions||[], x=>[cell(x.id,'num'), cell(x.user), cell(x.age,'num'),
   cell(x.silent,'num'), cell(x.ttl,'num'), cell(x.waiting,'num')]);
 }catch(e){document.getElementById('summary').textContent='cannot reach the replica: '+e;}
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""
