"""pipeline_model.py: a randomised model of hopper_bwd.cu's synchronisation, run on the CPU.

It replays the main kernel's producer and two consumer programs (same order of mbarrier waits and
arrivals, TMA issues, wgmma issues / commit groups / wait_group counts, dS writes and the DS_FULL
named barrier, same parity formulas, both EARLY_DV orders) under random timing of everything
asynchronous (TMA landing, in-order wgmma group completion, which actor runs next), and checks:
  - no deadlock (some actor or async event can always move until all are done);
  - a consumer that passed stage_full[s] finds the Q/dO/LSE/D of its own iteration there;
  - a TMA never writes a stage that an issued, unretired wgmma still reads, or that a consumer is
    still reading with ordinary loads (LSE, D) before its release;
  - a consumer never writes (stmatrix) a dS buffer that a dQ wgmma (either consumer's) still reads;
  - a dQ wgmma reads both halves of dS of its own iteration;
  - a wait_group returns only with the groups the code then uses retired; mbarrier arrival counts
    never overflow a phase; the named barrier ends balanced.
It checks the protocol, not the arithmetic (layout_model.py). Deliberate slips must be caught.
Usage: python3 lab/hopper_bwd/v1/pipeline_model.py [runs]
"""
import random
import sys

SLIPS = set()


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


def simulate(iterations, stages, early_dv, rng):
    empty_count = 8 if "empty_count_7" not in SLIPS else 7
    kv_full = MBarrier(1)
    full = [MBarrier(1) for _ in range(stages)]
    empty = [MBarrier(empty_count) for _ in range(stages)]
    stage_content = [None] * stages      # iteration whose tiles are (being) in the stage
    stage_users = [set() for _ in range(stages)]  # consumers between passing full and their release
    stage_readers = [0] * stages         # unretired wgmma groups reading the stage
    ds_content = [[None, None], [None, None]]  # [buffer][half] -> iteration written
    ds_readers = [0, 0]                  # unretired dQ wgmma groups reading the buffer
    in_flight = []                       # TMA: (barrier, callback)
    groups = {0: [], 1: []}              # per consumer, in-order wgmma groups: lists of release callbacks
    named = {"arrived": 0, "phase": 0}

    def tma(bar, on_land):
        in_flight.append((bar, on_land))

    def producer():
        kv_full.arrive(tx=1)
        tma(kv_full, lambda: None)
        for t in range(iterations):
            s, use = t % stages, t // stages
            parity = ((use & 1) ^ 1) if "producer_parity" not in SLIPS else (use & 1)
            yield lambda s=s, p=parity: empty[s].done(p)
            if stage_readers[s] or stage_users[s]:
                raise Violation(f"TMA into stage {s} (iteration {t}) while it is still read")
            stage_content[s] = ("loading", t)
            full[s].arrive(tx=1)

            def land(s=s, t=t):
                if stage_readers[s] or stage_users[s]:
                    raise Violation(f"TMA landed in stage {s} while it is still read")
                stage_content[s] = t
            tma(full[s], land)

    def issue(c, reads_stage=None, reads_ds=None):
        if reads_stage is not None:
            stage_readers[reads_stage] += 1
        if reads_ds is not None:
            ds_readers[reads_ds] += 1

        token = {"retired": False}

        def retire():
            if reads_stage is not None:
                stage_readers[reads_stage] -= 1
            if reads_ds is not None:
                ds_readers[reads_ds] -= 1
            token["retired"] = True
        groups[c].append(retire)
        return token

    def need(token, what):
        if not token["retired"]:
            raise Violation(f"{what} used before its wgmma group retired")

    def wait_group(c, n):
        yield lambda: len(groups[c]) <= n

    def consumer(c):
        yield lambda: kv_full.done(0)
        for t in range(iterations):
            s, use = t % stages, t // stages
            parity = (use & 1) if "consumer_parity" not in SLIPS else ((use & 1) ^ 1)
            yield lambda s=s, p=parity: full[s].done(p)
            if stage_content[s] != t:
                raise Violation(f"consumer {c} iteration {t}: stage {s} holds {stage_content[s]}")
            stage_users[s].add(c)
            s_tok = issue(c, reads_stage=s)          # Sᵀ
            dp_tok = issue(c, reads_stage=s)         # dPᵀ
            yield from wait_group(c, 1)              # Sᵀ ready; P reads LSE2 from the stage
            need(s_tok, "Sᵀ")
            if early_dv:
                issue(c, reads_stage=s)              # dV += Pᵀ dO
                yield from wait_group(c, 1)          # dPᵀ ready
            else:
                yield from wait_group(c, 0)
            need(dp_tok, "dPᵀ")
            # dS reads D from the stage; then stmatrix into buffer t % 2
            buf = (t & 1) if "single_ds_buffer" not in SLIPS else 0
            if ds_readers[buf]:
                raise Violation(f"consumer {c} writes dS buffer {buf} (iteration {t}) while a dQ GEMM reads it")
            ds_content[buf][c] = t
            if not early_dv:
                issue(c, reads_stage=s)              # dV
            issue(c, reads_stage=s)                  # dK += dSᵀ Q
            if "no_ds_barrier" not in SLIPS:
                named["arrived"] += 1                # bar.sync DS_FULL, 256 threads = both consumers
                my_phase = named["phase"]
                if named["arrived"] == 2:
                    named["arrived"] = 0
                    named["phase"] += 1
                yield lambda ph=my_phase: named["phase"] > ph
            if ds_content[buf] != [t, t]:
                raise Violation(f"consumer {c} dQ GEMM of iteration {t} reads dS halves {ds_content[buf]}")
            dq_tok = issue(c, reads_ds=buf)          # dQ piece
            n_wait = 0 if "release_wait1" not in SLIPS else 1
            yield from wait_group(c, n_wait)
            need(dq_tok, "dQ piece (red.global)")
            stage_users[s].discard(c)
            for _ in range(4):                       # lane 0 of each of the 4 warps
                empty[s].arrive()
        yield from wait_group(c, 0)

    actors = {"producer": producer(), 0: consumer(0), 1: consumer(1)}
    waiting = {name: None for name in actors}   # current blocking condition
    done = set()
    steps = 0
    while len(done) < len(actors):
        steps += 1
        if steps > 200000:
            raise Violation("livelock")
        choices = [name for name in actors if name not in done and (waiting[name] is None or waiting[name]())]
        events = []
        if in_flight:
            events.append("tma")
        for c in (0, 1):
            if groups[c]:
                events.append(("wgmma", c))
        if not choices and not events:
            raise Violation(f"deadlock: waiting {[n for n in actors if n not in done]}, "
                            f"full phases {[b.phase for b in full]}, empty {[b.phase for b in empty]}")
        pick = rng.choice(choices + events)
        if pick == "tma":
            i = rng.randrange(len(in_flight))
            bar, land = in_flight.pop(i)
            land()
            bar.complete_tx(1)
        elif isinstance(pick, tuple):
            c = pick[1]
            groups[c].pop(0)()                      # the oldest group completes first
        else:
            try:
                waiting[pick] = next(actors[pick])
            except StopIteration:
                done.add(pick)
    if named["arrived"] != 0:
        raise Violation("named barrier unbalanced at the end")
    if in_flight:
        raise Violation("TMA still in flight at the end")


def run(runs, seed=1):
    rng = random.Random(seed)
    for r in range(runs):
        iterations = rng.choice([0, 1, 2, 3, 5, 8, 13])
        stages = rng.choice([2, 2, 3])
        early_dv = rng.random() < 0.5
        simulate(iterations, stages, early_dv, rng)


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    run(runs)
    print(f"pipeline_model: {runs} random schedules (2-3 stages, 0-13 iterations, both dV orders): "
          "no deadlock, no hazard")
    slips = ["empty_count_7", "producer_parity", "consumer_parity", "single_ds_buffer", "no_ds_barrier",
             "release_wait1"]
    caught = 0
    for slip in slips:
        SLIPS.clear()
        SLIPS.add(slip)
        try:
            run(400, seed=7)
            print(f"slip {slip}: NOT CAUGHT")
        except Violation as e:
            caught += 1
            print(f"slip {slip}: caught ({e})")
    SLIPS.clear()
    print(f"pipeline_model: {caught}/{len(slips)} slips caught")
    return 0 if caught == len(slips) else 1


if __name__ == "__main__":
    sys.exit(main())
