"""Assignment of writers to workers: one active plus ``replicas - 1`` standbys per datastream,
sticky, spread by load. Pure: no store, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ACTIVE = "active"
STANDBY = "standby"

Placement = list[tuple[str, str]]  # [(worker_id, role)], the active first


def assign(
    replicas: Mapping[str, int],
    workers: Sequence[str],
    current: Mapping[str, Placement],
) -> dict[str, Placement]:
    """The new placement of every datastream in ``replicas`` over the live ``workers``.

    * Placements on live workers are kept (sticky); dead workers lose theirs.
    * If the active is gone, the first surviving standby is promoted (it is warm).
    * Missing replicas go to the least-loaded live workers that do not hold the datastream yet;
      ties break by worker id so the result is deterministic.
    """
    live = sorted(set(workers))
    load = dict.fromkeys(live, 0)
    result: dict[str, Placement] = {}
    for name in sorted(replicas):
        kept = [(w, r) for w, r in current.get(name, []) if w in load]
        kept = kept[: max(0, replicas[name])]
        for w, _ in kept:
            load[w] += 1
        result[name] = kept
    for name in sorted(replicas):
        holders = {w for w, _ in result[name]}
        while len(result[name]) < replicas[name]:
            free = [w for w in live if w not in holders]
            if not free:
                break
            w = min(free, key=lambda x: (load[x], x))
            result[name].append((w, STANDBY))
            holders.add(w)
            load[w] += 1
    for name, placement in result.items():
        if placement and not any(r == ACTIVE for _, r in placement):
            placement[0] = (placement[0][0], ACTIVE)
        # exactly one active, listed first
        actives = [p for p in placement if p[1] == ACTIVE][:1]
        standbys = [(w, STANDBY) for w, r in placement if (w, r) not in actives]
        result[name] = actives + standbys
    return result
