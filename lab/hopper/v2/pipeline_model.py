"""pipeline_model.py: a randomised model of hopper_fwd.cu's synchronisation, run on the CPU.

It replays the kernel's producer / consumer programs (same order of waits, arrivals, TMA issues,
wgmma issues, wgmma waits and named-barrier turns, same parity formulas) under random timing of
the asynchronous parts (TMA landing, wgmma completion, which thread runs next) and checks:
  - no deadlock (some actor can always move until all are done);
  - a consumer that passed full[s] sees the tile it expects in stage s;
  - a TMA never lands in a stage whose previous tile an issued, unretired wgmma still reads;
  - mbarrier arrival counts never overflow a phase; named barriers end balanced.
It checks the protocol, not the arithmetic. v2: 2 or 3 consumer warpgroups (the round-robin
ping-pong of hopper_sched_pass_turn). Usage: python3 lab/hopper/v2/pipeline_model.py [runs]
"""
import random
import sys


class MBarrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, tx=0):
        assert self.pending > 0, "arrival beyond the phase's count"
        self.pending -= 1
        self.tx += tx
        self._maybe_complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1
            self.pending = self.count

    def done(self, parity):  # try_wait.parity semantics
        return self.phase != parity


def simulate(n_tiles, stages, pingpong, rng, wgs=2):
    empty_arrivals = 4 * wgs
    q_full = MBarrier(1)
    k_full = [MBarrier(1) for _ in range(stages)]
    v_full = [MBarrier(1) for _ in range(stages)]
    k_empty = [MBarrier(empty_arrivals) for _ in range(stages)]
    v_empty = [MBarrier(empty_arrivals) for _ in range(stages)]
    content = {("k", s): None for s in range(stages)} | {("v", s): None for s in range(stages)}
    readers = {key: 0 for key in content}  # issued, unretired wgmma reading the stage
    in_flight = []  # TMA loads: (kind, stage, tile, barrier)
    named = {1 + c: [0, 0] for c in range(wgs)}  # barrier id -> [arrived warpgroups, unused]
    named_count = {1 + c: 0 for c in range(wgs)}  # completed phases
    named_who = {1 + c: None for c in range(wgs)}  # which consumer is counted in the open phase
    groups = {w: [] for w in range(wgs)}  # per consumer: list of in-order wgmma groups (lists of stage keys)

    def producer():
        yield ("wait_none",)
        q_full.arrive(tx=1)
        in_flight.append(("q", 0, 0, q_full))
        for j in range(n_tiles + 1):
            if j < n_tiles:
                s = j % stages
                yield ("wait", k_empty[s], ((j // stages) & 1) ^ 1)
                k_full[s].arrive(tx=1)
                in_flight.append(("k", s, j, k_full[s]))
            if j > 0:
                jv = j - 1
                s = jv % stages
                yield ("wait", v_empty[s], ((jv // stages) & 1) ^ 1)
                v_full[s].arrive(tx=1)
                in_flight.append(("v", s, jv, v_full[s]))

    def named_sync(bid, w):
        assert named_who[bid] != w, f"wg{w} counted twice in one phase of named barrier {bid}"
        named_who[bid] = w
        named[bid][0] += 1
        if named[bid][0] == 2:
            named[bid][0] = 0
            named_who[bid] = None
            named_count[bid] += 1
            return None
        target = named_count[bid] + 1
        return ("named", bid, target)

    def named_arrive(bid, w):
        assert named_who[bid] != w, f"wg{w} counted twice in one phase of named barrier {bid}"
        named_who[bid] = w
        named[bid][0] += 1
        if named[bid][0] == 2:
            named[bid][0] = 0
            named_who[bid] = None
            named_count[bid] += 1

    def pass_turn(w, last_round):
        """hopper_sched_pass_turn: arrive on the next consumer's barrier; the last consumer
        skips its arrival after its last round."""
        if w < wgs - 1:
            named_arrive(2 + w, w)
        elif not last_round:
            named_arrive(1, w)

    def issue(w, keys):
        for key in keys:
            readers[key] += 1
        groups[w].append(list(keys))

    def consumer(w):
        yield ("wait", q_full, 0)
        if n_tiles == 0:
            return
        if pingpong and w == wgs - 1:
            named_arrive(1, w)
        # round 0
        yield ("wait", k_full[0], 0)
        assert content[("k", 0)] == 0, f"wg{w} round 0 sees K tile {content[('k', 0)]}"
        if pingpong:
            r = named_sync(1 + w, w)
            if r:
                yield r
        issue(w, [("k", 0)])
        if pingpong:
            pass_turn(w, n_tiles == 1)
        yield ("wgmma_wait", w, 0)
        for _ in range(4):
            k_empty[0].arrive()
        for j in range(1, n_tiles):
            ks, vs = j % stages, (j - 1) % stages
            yield ("wait", k_full[ks], (j // stages) & 1)
            assert content[("k", ks)] == j, f"wg{w} round {j} sees K tile {content[('k', ks)]} in stage {ks}"
            if pingpong:
                r = named_sync(1 + w, w)
                if r:
                    yield r
            issue(w, [("k", ks)])
            yield ("wait", v_full[vs], ((j - 1) // stages) & 1)
            assert content[("v", vs)] == j - 1, f"wg{w} round {j} sees V tile {content[('v', vs)]}"
            issue(w, [("v", vs)])
            if pingpong:
                pass_turn(w, j == n_tiles - 1)
            yield ("wgmma_wait", w, 1)
            for _ in range(4):
                k_empty[ks].arrive()
            yield ("wgmma_wait", w, 0)
            for _ in range(4):
                v_empty[vs].arrive()
        jv = n_tiles - 1
        vs = jv % stages
        yield ("wait", v_full[vs], (jv // stages) & 1)
        assert content[("v", vs)] == jv
        issue(w, [("v", vs)])
        yield ("wgmma_wait", w, 0)
        for _ in range(4):
            v_empty[vs].arrive()

    actors = {"producer": producer()} | {f"wg{w}": consumer(w) for w in range(wgs)}
    blocked = {name: None for name in actors}

    def runnable(cond):
        if cond is None:
            return True
        kind = cond[0]
        if kind == "wait_none":
            return True
        if kind == "wait":
            return cond[1].done(cond[2])
        if kind == "named":
            return named_count[cond[1]] >= cond[2]
        if kind == "wgmma_wait":
            return len(groups[cond[1]]) <= cond[2]
        raise AssertionError(kind)

    steps = 0
    while True:
        steps += 1
        assert steps < 100000
        choices = [n for n in actors if runnable(blocked[n])]
        choices += ["tma"] * (len(in_flight) > 0)
        choices += [f"wgmma{w}" for w in range(wgs) if groups[w]]
        if not choices:
            if all(v == "done" for v in blocked.values()):
                break
            raise AssertionError(f"deadlock: {blocked}, in flight {in_flight}")
        pick = rng.choice(choices)
        if pick == "tma":
            kind, s, tile, bar = in_flight.pop(rng.randrange(len(in_flight)))
            if kind != "q":
                assert readers[(kind, s)] == 0, f"TMA {kind} tile {tile} lands in stage {s} while a wgmma reads it"
                content[(kind, s)] = tile
            bar.complete_tx(1)
        elif pick.startswith("wgmma"):
            w = int(pick[-1])
            for key in groups[w].pop(0):  # groups retire in order
                readers[key] -= 1
        else:
            try:
                blocked[pick] = next(actors[pick])
            except StopIteration:
                blocked[pick] = "done"
                actors.pop(pick)
                continue
    assert all(v[0] == 0 for v in named.values()), f"named barriers unbalanced: {named}"
    assert not in_flight


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(1)
    for i in range(runs):
        n_tiles = rng.choice([0, 1, 2, 3, 4, 5, 7, 16])
        stages = rng.choice([2, 3, 4])
        pingpong = rng.choice([True, False])
        wgs = rng.choice([2, 3])
        try:
            simulate(n_tiles, stages, pingpong, rng, wgs)
        except AssertionError as e:
            print(f"run {i}: n_tiles {n_tiles} stages {stages} pingpong {pingpong} consumers {wgs}: {e}")
            return 1
    print(f"pipeline model: {runs} random schedules (2 and 3 consumers), no deadlock, no stage overwritten while read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
