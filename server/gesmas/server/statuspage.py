"""The status page of a replica, served on its metrics port (`/status`, its data at
`/status.json`, refreshed every second by a little script; no build step). It shows what this
replica knows: the members with their role, match index and connectivity, the leader, the
objects with their class, version and waiters, the sessions and their age. It reads the local
state (not through the log), so a lagging replica shows its own view.

The port has no authentication: bind it to an address only operators reach (it shows object
names and session ids, never secrets).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

MAX_ROWS = 500          # objects and sessions listed (the counts are always complete)


def snapshot(node: Node) -> dict[str, Any]:
    """The page's data, read on the HTTP thread while the apply thread runs: dicts are
    copied first (a resize during the copy is retried)."""
    out: dict[str, Any] = {"generated": time.time(), "node": node.config.node_id,
                           "client_addr": node.config.client_addr}
    try:
        out.update(node.status())
    except Exception as e:          # not started yet, or stopped
        out["error"] = f"{type(e).__name__}: {e}"
    k = node.kernel
    if k is None:
        return out
    for _ in range(5):
        try:
            objects = list(k.objects.items())
            sessions = list(k.sessions.values())
            waiting: dict[str, int] = {}
            for s in sessions:
                for r in list(s.inflight.values()):
                    if r.waiter is not None:
                        waiting[r.obj] = waiting.get(r.obj, 0) + 1
            break
        except RuntimeError:        # a dict changed size while copied
            continue
    else:
        return out
    now = k.now
    out["kernel_time"] = now
    out["object_count"], out["session_count"] = len(objects), len(sessions)
    out["waiter_count"] = k._waiting
    out["objects"] = [{"name": n, "class": r.cls.name, "version": r.cls.version,
                       "waiters": waiting.get(n, 0), "owner": r.owner}
                      for n, r in sorted(objects)[:MAX_ROWS]]
    out["sessions"] = [{"id": s.id, "user": s.user, "ttl": s.ttl,
                        "age": round(now - s.opened, 1) if s.opened else None,
                        "waiting": sum(1 for r in s.inflight.values() if r.waiter is not None)}
                       for s in sessions[:MAX_ROWS]]
    return out


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
<th class="num">waiters</th><th>owner</th></tr></thead><tbody></tbody></table>
<h2>Sessions <span id="sesscount" class="muted"></span></h2>
<table id="sessions"><thead><tr><th class="num">id</th><th>user</th><th class="num">age (s)</th>
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
  document.getElementById('objcount').textContent='('+(s.object_count||0)+')';
  fill('objects', s.objects||[], o=>[cell(o.name), cell(o.class), cell(o.version,'num'),
   cell(o.waiters,'num'), cell(o.owner)]);
  document.getElementById('sesscount').textContent='('+(s.session_count||0)+')';
  fill('sessions', s.sessions||[], x=>[cell(x.id,'num'), cell(x.user), cell(x.age,'num'),
   cell(x.ttl,'num'), cell(x.waiting,'num')]);
 }catch(e){document.getElementById('summary').textContent='cannot reach the replica: '+e;}
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"""
