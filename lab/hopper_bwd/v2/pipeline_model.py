"""pipeline_model.py: a randomised model of lab/hopper_bwd/v2/hopper_bwd.cu's synchronisation, run
on the CPU.

Actors, each replaying its program of the main kernel (same order of mbarrier waits and arrivals,
TMA issues, st.shared of the vectors, wgmma issues / commit groups / wait_group counts, dS writes
and named barriers, same parity formulas):
  - the TMA thread (K, V once; Q_t, dO_t per iteration; arrive.expect_tx on stage_full);
  - the vector warp (waits stage_empty, st.shared LSE2_t and D_t, arrives on stage_full);
  - the 4 warps of each of the 2 consumers, each warp its own actor: a wgmma is modelled per warp
    (warp w's part reads A rows 16w.. and the whole B; it starts when warp w issues it and retires
    at a random later time, in order per warp; warp w's wait_group waits for its own parts). That
    is more freedom than the hardware has, so a protocol that passes here is safe there.
Random timing of everything asynchronous (TMA landing, part retirement, which actor moves). Checks:
  - no deadlock (some actor or async event can always move until all are done);
  - a consumer warp that passed stage_full[s] finds Q, dO, LSE2 and D of its own iteration there;
  - a TMA or a vector st.shared never writes a stage that an unretired wgmma part still reads or
    that a consumer warp still reads with ld.shared (from passing full to its release);
  - a warp never writes (stmatrix) a dS buffer that a dQ part of its consumer still reads;
  - a dQ part reads the dS of its own iteration written by all 4 warps of its consumer;
  - every accumulator is used only after its part retired; arrival counts never overflow a phase;
    the named barriers end balanced.
Both EARLY_DV orders and both DQ_AFTER_DKV orders; 2-3 stages; 0-13 iterations.
It checks the protocol, not the arithmetic (layout_model.py). Deliberate slips must be caught.
Usage: python3 lab/hopper_bwd/v2/pipeline_model.py [runs]
"""
import random
import sys

SLIPS = set()
WARPS = 4
CONSUMERS = 2


class Violation(Exception):
    pass


class MBarrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, tx=0):
        if self.pending <= 0:
            raise Violation("arrival beyond the phase's count")
        self.pending -= 1
        self.tx += tx
        self._maybe_complete()

    def complete_tx(self, n):
        self.tx -= n
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase ^= 1
            self.pending = self.count

    def done(self, parity):  # try_wait.parity: the phase of this parity has completed
        return self.phase != parity


def simulate(iterations, stages, early_dv, dq_after_dkv, rng):
    empty_count = 4 * CONSUMERS if "empty_count_7" not in SLIPS else 4 * CONSUMERS - 1
    full_count = 2 if "full_count_1" not in SLIPS else 1
    kv_full = MBarrier(1)
    full = [MBarrier(full_count) for _ in range(stages)]
    empty = [MBarrier(empty_count) for _ in range(stages)]
    tiles = [None] * stages              # iteration whose Q/dO are (being) in the stage
    vectors = [None] * stages            # iteration whose LSE2/D are in the stage
    stage_users = [set() for _ in range(stages)]   # (consumer, warp) between passing full and release
    stage_readers = [0] * stages         # unretired wgmma parts reading the stage
    ds_content = [[[None] * WARPS for _ in range(2)] for _ in range(CONSUMERS)]  # [c][buffer][warp]
    ds_readers = [[0, 0] for _ in range(CONSUMERS)]  # unretired dQ parts reading [c][buffer]
    in_flight = []                       # TMA: (barrier, callback)
    parts = {(c, w): [] for c in range(CONSUMERS) for w in range(WARPS)}  # in-order unretired parts
    named = [{"arrived": 0, "phase": 0} for _ in range(CONSUMERS)]

    def tma(bar, on_land):
        in_flight.append((bar, on_land))

    def tma_thread():
        kv_full.arrive(tx=1)
        tma(kv_full, lambda: None)
        for t in range(iterations):
            s, use = t % stages, t // stages
            parity = ((use & 1) ^ 1) if "producer_parity" not in SLIPS else (use & 1)
            yield lambda s=s, p=parity: empty[s].done(p)
            if stage_readers[s] or stage_users[s]:
                raise Violation(f"TMA into stage {s} (iteration {t}) while it is still read")
            tiles[s] = ("loading", t)
            full[s].arrive(tx=1)

            def land(s=s, t=t):
                if stage_readers[s] or stage_users[s]:
                    raise Violation(f"TMA landed in stage {s} while it is still read")
                tiles[s] = t
            tma(full[s], land)

    def vector_warp():
        for t in range(iterations):
            s, use = t % stages, t // stages
            if "vector_no_wait" not in SLIPS:
                yield lambda s=s, p=(use & 1) ^ 1: empty[s].done(p)
            else:
                yield None
            if stage_users[s]:
                raise Violation(f"vector st.shared into stage {s} (iteration {t}) while a consumer reads it")
            vectors[s] = t
            yield None                   # __syncwarp, then lane 0 arrives
            full[s].arrive()

    def issue(c, w, reads_stage=None, reads_ds=None):
        if reads_stage is not None:
            stage_readers[reads_stage] += 1
        if reads_ds is not None:
            ds_readers[c][reads_ds] += 1
        token = {"retired": False}

        def retire():
            if reads_stage is not None:
                stage_readers[reads_stage] -= 1
            if reads_ds is not None:
                ds_readers[c][reads_ds] -= 1
            token["retired"] = True
        parts[(c, w)].append(retire)
        return token

    def need(token, what):
        if not token["retired"]:
            raise Violation(f"{what} used before its wgmma part retired")

    def wait_group(c, w, n):
        yield lambda: len(parts[(c, w)]) <= n

    def bar_sync(c):
        nb = named[c]
        nb["arrived"] += 1               # bar.sync DS_READY_c, 128 threads = the consumer's 4 warps
        my_phase = nb["phase"]
        if nb["arrived"] == WARPS:
            nb["arrived"] = 0
            nb["phase"] += 1
        yield lambda ph=my_phase: nb["phase"] > ph

    def consumer_warp(c, w):
        yield lambda: kv_full.done(0)
        for t in range(iterations):
            s, use = t % stages, t // stages
            parity = (use & 1) if "consumer_parity" not in SLIPS else ((use & 1) ^ 1)
            yield lambda s=s, p=parity: full[s].done(p)
            if tiles[s] != t or vectors[s] != t:
                raise Violation(f"consumer {c} warp {w} iteration {t}: stage {s} holds tiles {tiles[s]}, "
                                f"vectors {vectors[s]}")
            stage_users[s].add((c, w))
            s_tok = issue(c, w, reads_stage=s)       # Sᵀ
            dp_tok = issue(c, w, reads_stage=s)      # dPᵀ
            yield from wait_group(c, w, 1)           # Sᵀ ready; P reads LSE2 (ld.shared)
            need(s_tok, "Sᵀ")
            if early_dv:
                issue(c, w, reads_stage=s)           # dV_c += Pᵀ dO
                yield from wait_group(c, w, 1)       # dPᵀ ready
            else:
                yield from wait_group(c, w, 0)
            need(dp_tok, "dPᵀ")
            # dS reads D (ld.shared); stmatrix into this consumer's buffer t % 2
            buf = (t & 1) if "single_ds_buffer" not in SLIPS else 0
            if ds_readers[c][buf]:
                raise Violation(f"consumer {c} warp {w} writes dS buffer {buf} (iteration {t}) while a dQ part "
                                "reads it")
            ds_content[c][buf][w] = t
            if not early_dv:
                issue(c, w, reads_stage=s)           # dV_c
            issue(c, w, reads_stage=s)               # dK_c += dSᵀ Q
            if "release_early" in SLIPS:
                stage_users[s].discard((c, w))
                empty[s].arrive()
            if "no_ds_barrier" not in SLIPS:
                yield from bar_sync(c)               # fence.proxy.async; bar.sync DS_READY_c, 128
            if dq_after_dkv:
                yield from wait_group(c, w, 0)
            if ds_content[c][buf] != [t] * WARPS:
                raise Violation(f"consumer {c} warp {w}: dQ part of iteration {t} reads dS {ds_content[c][buf]}")
            dq_tok = issue(c, w, reads_ds=buf)       # dQ_c part of this warp
            yield from wait_group(c, w, 0)
            need(dq_tok, "dQ_c (red.global)")
            if "release_early" not in SLIPS:
                stage_users[s].discard((c, w))
                yield None                           # __syncwarp, then lane 0 arrives
                empty[s].arrive()
        yield from wait_group(c, w, 0)

    actors = {"tma_thread": tma_thread(), "vector_warp": vector_warp()}
    for c in range(CONSUMERS):
        for w in range(WARPS):
            actors[(c, w)] = consumer_warp(c, w)
    waiting = {name: None for name in actors}
    done = set()
    steps = 0
    while len(done) < len(actors):
        steps += 1
        if steps > 400000:
            raise Violation("livelock")
        choices = [n for n in actors if n not in done and (waiting[n] is None or waiting[n]())]
        events = []
        if in_flight:
            events.append("tma_landing")
        for key, lst in parts.items():
            if lst:
                events.append(("part", key))
        if not choices and not events:
            raise Violation(f"deadlock: waiting {[n for n in actors if n not in done]}, "
                            f"full phases {[b.phase for b in full]}, empty {[b.phase for b in empty]}")
        pick = rng.choice(choices + events)
        if pick == "tma_landing":
            i = rng.randrange(len(in_flight))
            bar, land = in_flight.pop(i)
            land()
            bar.complete_tx(1)
        elif isinstance(pick, tuple) and pick[0] == "part":
            parts[pick[1]].pop(0)()                  # the oldest part of that warp completes first
        else:
            try:
                waiting[pick] = next(actors[pick])
            except StopIteration:
                done.add(pick)
    for nb in named:
        if nb["arrived"] != 0:
            raise Violation("named barrier unbalanced at the end")
    if in_flight:
        raise Violation("TMA still in flight at the end")


def run(runs, seed=1):
    rng = random.Random(seed)
    for _ in range(runs):
        iterations = rng.choice([0, 1, 2, 3, 5, 8, 13])
        stages = rng.choice([2, 2, 3])
        simulate(iterations, stages, rng.random() < 0.5, rng.random() < 0.5, rng)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    run(runs)
    print(f"pipeline_model: {runs} random schedules (2-3 stages, 0-13 iterations, both dV and dQ orders, "
          "warps as separate actors): no deadlock, no hazard")
    slips = ["empty_count_7", "full_count_1", "producer_parity", "consumer_parity", "single_ds_buffer",
             "no_ds_barrier", "release_early", "vector_no_wait"]
    caught = 0
    for slip in slips:
        SLIPS.clear()
        SLIPS.add(slip)
        try:
            run(300, seed=7)
            print(f"slip {slip}: NOT CAUGHT")
        except Violation as e:
            caught += 1
            print(f"slip {slip}: caught ({e})")
    SLIPS.clear()
    print(f"pipeline_model: {caught}/{len(slips)} slips caught")
    return 0 if caught == len(slips) else 1


if __name__ == "__main__":
    sys.exit(main())
