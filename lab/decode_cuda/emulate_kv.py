"""emulate_kv.py: a pure-Python (no GPU, no numpy) transcription of the index logic of
src/cuda/kvcache_kernel.cuh (its fused split merge included), run on small random problems and
compared with a direct reference. It checks what a GPU run cannot show by itself on this machine:
block key ranges, slot-aligned tiles, the split partition, warp slices, the loader's validity /
source choice (cache, page, k_new), page lookups, rotary positions, masks, the per-warp online
softmax with its shared-memory merge, the sink added once, the merge of the splits and the done
flags that pick the merging block. Every cache slot the call must not read holds NaN, as in
check_kv.py. The loader's fast path (kernel issue_tile, d <= 128) reads the same rows as the
one-page branch transcribed here.

It does not check the PTX fragment layouts, swizzle or the pipeline (those are the forward's,
reused as they are); check_kv.py on the GPU does.

Usage: python3 lab/decode_cuda/emulate_kv.py [cases]    (default 400)
"""
import math
import random
import sys

NAN = float("nan")
BLOCK_M, BLOCK_N, WARPS, WARP_N = 16, 64, 4, 16


def key_range(t, sq, len_k, wl, wr):
    diag = t + len_k - sq
    lo = diag - wl if wl >= 0 else 0
    hi = diag + wr + 1 if wr >= 0 else len_k
    return min(max(lo, 0), len_k), min(max(hi, 0), len_k)


def rotate_pair(xa, xb, c, s):
    return xa * c - xb * s, xa * s + xb * c


def rotary_dims(p, half, interleaved):
    return (2 * p, 2 * p + 1) if interleaved else (p, p + half)


def rotate_row(x, pos, cos, sin, rd, interleaved):
    y = list(x)
    half = rd // 2
    for p in range(half):
        da, db = rotary_dims(p, half, interleaved)
        y[da], y[db] = rotate_pair(x[da], x[db], cos[pos][p], sin[pos][p])
    return y


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def make_problem(rng):
    b = rng.randint(1, 3)
    hkv = rng.choice([1, 2])
    g = rng.choice([1, 2, 4, 8, 12])
    hq = hkv * g
    sq = rng.choice([1, 1, 2, 5, 3])
    d = rng.choice([4, 6])
    dv = rng.choice([4, 2])
    append = rng.random() < 0.5
    cap = rng.randint(sq if append else 0, 300)
    paged = rng.random() < 0.5
    page_size = rng.choice([1, 2, 3, 4, 8, 12, 16, 24, 40, 64, 128]) if paged else 0
    rot = rng.choice([None, "i", "h"]) if append else None
    rd = rng.choice([2, d]) if rot else 0
    causal = rng.random() < 0.4
    wl = rng.choice([-1, -1, 0, 5, 70])
    wr = rng.choice([-1, -1, 0, 3])
    use_window = rng.random() < 0.5
    if not use_window:
        wl = wr = -1
    if causal:
        wr = 0 if wr < 0 else min(wr, 0)
    softcap = rng.choice([0.0, 0.0, 3.0])
    alibi = [rng.random() * 0.3 for _ in range(hq)] if rng.random() < 0.3 else None
    sinks = [rng.gauss(0, 2) for _ in range(hq)] if rng.random() < 0.3 else None
    n_new = sq if append else 0
    lens = [rng.randint(0, cap - n_new) for _ in range(b)]
    pads = [rng.randint(0, L) if rng.random() < 0.4 else 0 for L in lens]
    # logical caches with NaN outside [pad, L0)
    k_log = [[[[rng.gauss(0, 1) if pads[i] <= c < lens[i] else NAN for _ in range(d)] for _ in range(hkv)]
              for c in range(cap)] for i in range(b)]
    v_log = [[[[rng.gauss(0.5, 1) if pads[i] <= c < lens[i] else NAN for _ in range(dv)] for _ in range(hkv)]
              for c in range(cap)] for i in range(b)]
    cache_batch_idx = None
    if paged:
        pps = (cap + page_size - 1) // page_size
        num_pages = b * pps + 2
        ids = list(range(num_pages))
        rng.shuffle(ids)
        table = [ids[i * pps:(i + 1) * pps] for i in range(b)]
        pool_k = [[[[NAN] * d for _ in range(hkv)] for _ in range(page_size)] for _ in range(num_pages)]
        pool_v = [[[[NAN] * dv for _ in range(hkv)] for _ in range(page_size)] for _ in range(num_pages)]
        for i in range(b):
            for c in range(cap):
                pool_k[table[i][c // page_size]][c % page_size] = k_log[i][c]
                pool_v[table[i][c // page_size]][c % page_size] = v_log[i][c]
        cache = dict(paged=True, table=table, page_size=page_size, num_pages=num_pages, k=pool_k, v=pool_v,
                     stride=pps)
    else:
        cache_batch = b + (1 if rng.random() < 0.5 else 0)
        rows = list(range(cache_batch))
        rng.shuffle(rows)
        cache_batch_idx = rows[:b] if cache_batch > b else None
        ck = [[[[NAN] * d for _ in range(hkv)] for _ in range(cap)] for _ in range(cache_batch)]
        cv = [[[[NAN] * dv for _ in range(hkv)] for _ in range(cap)] for _ in range(cache_batch)]
        for i in range(b):
            r = cache_batch_idx[i] if cache_batch_idx else i
            ck[r], cv[r] = k_log[i], v_log[i]
        cache = dict(paged=False, k=ck, v=cv, cache_batch=cache_batch, batch_idx=cache_batch_idx)
    q = [[[rng.gauss(0, 1) for _ in range(d)] for _ in range(hq)] for _ in range(b * sq)]
    k_new = [[[rng.gauss(0, 1) for _ in range(d)] for _ in range(hkv)] for _ in range(b * sq)] if append else None
    v_new = [[[rng.gauss(0.5, 1) for _ in range(dv)] for _ in range(hkv)] for _ in range(b * sq)] if append else None
    cos = sin = None
    if rot:
        ang = [[rng.random() * 6.28 for _ in range(rd // 2)] for _ in range(cap)]
        cos = [[math.cos(a) for a in r] for r in ang]
        sin = [[math.sin(a) for a in r] for r in ang]
    splits = rng.choice([1, 1, 2, 3, 5, 8, 33])
    return dict(b=b, hkv=hkv, g=g, hq=hq, sq=sq, d=d, dv=dv, cap=cap, append=append, lens=lens, pads=pads,
                k_log=k_log, v_log=v_log, cache=cache, q=q, k_new=k_new, v_new=v_new, rot=rot, rd=rd, cos=cos,
                sin=sin, wl=wl, wr=wr, has_mask=wl >= 0 or wr >= 0, softcap=softcap, alibi=alibi, sinks=sinks,
                scale=1.0 / math.sqrt(d), splits=splits, load_passes=rng.choice([4, 8, 16]))


def reference(P):
    """Direct attention per (b, t, hq) in float64; returns o[b][t][hq], lse[b][hq][t]."""
    o = [[[None] * P["hq"] for _ in range(P["sq"])] for _ in range(P["b"])]
    lse = [[[None] * P["sq"] for _ in range(P["hq"])] for _ in range(P["b"])]
    for bi in range(P["b"]):
        L0, pad = P["lens"][bi], P["pads"][bi]
        for h in range(P["hq"]):
            hk = h // P["g"]
            keys = [P["k_log"][bi][c][hk] for c in range(pad, L0)]
            vals = [P["v_log"][bi][c][hk] for c in range(pad, L0)]
            if P["append"]:
                for t in range(P["sq"]):
                    kn = P["k_new"][bi * P["sq"] + t][hk]
                    if P["rot"]:
                        kn = rotate_row(kn, L0 - pad + t, P["cos"], P["sin"], P["rd"], P["rot"] == "i")
                    keys.append(kn)
                    vals.append(P["v_new"][bi * P["sq"] + t][hk])
            len_k = len(keys)
            for t in range(P["sq"]):
                qr = P["q"][bi * P["sq"] + t][h]
                if P["rot"]:
                    pos = L0 - pad + (t if P["has_mask"] else 0)
                    qr = rotate_row(qr, pos, P["cos"], P["sin"], P["rd"], P["rot"] == "i")
                lo, hi = key_range(t, P["sq"], len_k, P["wl"], P["wr"])
                sc = []
                for j in range(lo, hi):
                    s = P["scale"] * dot(qr, keys[j])
                    if P["softcap"] > 0:
                        s = P["softcap"] * math.tanh(s / P["softcap"])
                    if P["alibi"]:
                        s -= P["alibi"][h] * abs(t + len_k - P["sq"] - j)
                    sc.append((s, j))
                terms = [s for s, _ in sc] + ([P["sinks"][h]] if P["sinks"] else [])
                if not terms:
                    o[bi][t][h] = [0.0] * P["dv"]
                    lse[bi][h][t] = -math.inf
                    continue
                m = max(terms)
                z = sum(math.exp(x - m) for x in terms)
                lse[bi][h][t] = m + math.log(z)
                acc = [0.0] * P["dv"]
                for s, j in sc:
                    w = math.exp(s - lse[bi][h][t])
                    acc = [a + w * x for a, x in zip(acc, vals[j])]
                o[bi][t][h] = acc
    return o, lse


def kernel(P, reads):
    """The decode kernel's logic, block by block; returns partials [split][b][hq][t] = (o, lse)."""
    S, sq, g, hq = P["splits"], P["sq"], P["g"], P["hq"]
    rows_packed = g * sq
    row_tiles = (rows_packed + BLOCK_M - 1) // BLOCK_M
    cache = P["cache"]
    part = {}
    writes = []
    for bi in range(P["b"]):
        for hk in range(P["hkv"]):
            for x in range(row_tiles * S):
                row_tile, split = x % row_tiles, x // row_tiles
                append = P["append"]
                l0_max = max(0, P["cap"] - (sq if append else 0))
                cache_len = min(max(P["lens"][bi], 0), l0_max)
                pad = min(max(P["pads"][bi], 0), cache_len)
                slot_end = cache_len + (sq if append else 0)
                len_k = slot_end - pad
                r0 = row_tile * BLOCK_M
                r_last = min(r0 + BLOCK_M, rows_packed) - 1
                t_first, t_last = r0 // g, r_last // g
                blk_lo = pad + key_range(t_first, sq, len_k, P["wl"], P["wr"])[0]
                blk_hi = pad + key_range(t_last, sq, len_k, P["wl"], P["wr"])[1]
                nomask_lo = pad + key_range(t_last, sq, len_k, P["wl"], P["wr"])[0]
                nomask_hi = pad + key_range(t_first, sq, len_k, P["wl"], P["wr"])[1]
                tile_first, n_tiles = 0, 0
                if blk_hi > blk_lo:
                    m_begin, m_end = blk_lo // BLOCK_N, (blk_hi - 1) // BLOCK_N + 1
                    per = (m_end - m_begin + S - 1) // S
                    tile_first = m_begin + split * per
                    n_tiles = max(0, min(per, m_end - tile_first))
                # rows of the tile (16), with padding rows clamped to the last one
                rows = []
                for r in range(BLOCK_M):
                    rr = min(r0 + r, rows_packed - 1)
                    t = rr // g
                    lo, hi = key_range(t, sq, len_k, P["wl"], P["wr"])
                    h = hk * g + rr % g
                    qv = P["q"][bi * sq + t][h] if r0 + r < rows_packed else [0.0] * P["d"]
                    if P["rot"] and r0 + r < rows_packed:
                        pos = cache_len - pad + (t if P["has_mask"] else 0)
                        qv = rotate_row(qv, pos, P["cos"], P["sin"], P["rd"], P["rot"] == "i")
                    rows.append(dict(t=t, h=h, lo=pad + lo, hi=pad + hi, diag=pad + t + len_k - sq, q=qv))
                # the append writer: block (split 0, row tile 0)
                if append and split == 0 and row_tile == 0:
                    for t in range(sq):
                        c = cache_len + t
                        if c >= P["cap"]:
                            continue
                        kn = P["k_new"][bi * sq + t][hk]
                        if P["rot"]:
                            kn = rotate_row(kn, c - pad, P["cos"], P["sin"], P["rd"], P["rot"] == "i")
                        writes.append((bi, hk, c, kn, P["v_new"][bi * sq + t][hk]))
                # per warp state
                wst = [dict(m=[-math.inf] * BLOCK_M, l=[0.0] * BLOCK_M, o=[[0.0] * P["dv"] for _ in range(BLOCK_M)])
                       for _ in range(WARPS)]
                for it in range(n_tiles):
                    m = tile_first + it
                    c0 = m * BLOCK_N
                    # loader: thread group q copies rows [q * LP, q * LP + LP) (LP = load passes:
                    # 4 / 8 / 16 for d 64 / 128 / 256); fetch_pages then issue_tile per group
                    LP = P["load_passes"]
                    ktile, vtile = [None] * BLOCK_N, [None] * BLOCK_N
                    for q in range(BLOCK_N // LP):
                        row_first = q * LP
                        c_first = c0 + row_first
                        ids, first_in_page = [0] * LP, 0
                        if cache["paged"]:
                            ps = cache["page_size"]
                            one_page = ps % LP == 0
                            index = c_first // ps
                            in_page = c_first - index * ps
                            first_in_page = in_page
                            if one_page:
                                ids[0] = cache["table"][bi][min(index, cache["stride"] - 1)]
                            else:
                                for pas in range(LP):
                                    ids[pas] = cache["table"][bi][min(index, cache["stride"] - 1)]
                                    in_page += 1
                                    if in_page == ps:
                                        in_page, index = 0, index + 1
                            in_page = first_in_page
                        for pas in range(LP):
                            row = row_first + pas
                            c = c_first + pas
                            valid = blk_lo <= c < blk_hi
                            if not valid:
                                ktile[row], vtile[row] = [0.0] * P["d"], [0.0] * P["dv"]
                            elif c >= cache_len:
                                assert append and c - cache_len < sq, "k_new row out of range"
                                kr = P["k_new"][bi * sq + c - cache_len][hk]
                                vr = P["v_new"][bi * sq + c - cache_len][hk]
                                if P["rot"]:
                                    kr = rotate_row(kr, c - pad, P["cos"], P["sin"], P["rd"], P["rot"] == "i")
                                reads.append(("new", bi, c - cache_len))
                                ktile[row], vtile[row] = kr, vr
                            elif cache["paged"]:
                                if one_page:  # the group's first row + pas rows of the same page
                                    pid, prow = ids[0], first_in_page + pas
                                else:
                                    pid, prow = ids[pas], in_page
                                pid = min(max(pid, 0), cache["num_pages"] - 1)
                                assert prow < ps, "in-page row past the page"
                                ktile[row], vtile[row] = cache["k"][pid][prow][hk], cache["v"][pid][prow][hk]
                                reads.append(("cache", bi, c))
                            else:
                                crow = cache["batch_idx"][bi] if cache["batch_idx"] else bi
                                crow = min(max(crow, 0), cache["cache_batch"] - 1)
                                ktile[row], vtile[row] = cache["k"][crow][c][hk], cache["v"][crow][c][hk]
                                reads.append(("cache", bi, c))
                            if cache["paged"] and not one_page:
                                in_page += 1
                                if in_page == ps:
                                    in_page = 0
                    for w in range(WARPS):
                        cw = c0 + w * WARP_N
                        need_mask = not (cw >= nomask_lo and cw + WARP_N <= nomask_hi)
                        st = wst[w]
                        for r in range(BLOCK_M):
                            R = rows[r]
                            sc = []
                            for jj in range(WARP_N):
                                c = cw + jj
                                x = dot(R["q"], ktile[c - c0])
                                # transform in natural units (the kernel works in log2 units; same math)
                                x *= P["scale"]
                                if P["softcap"] > 0:
                                    x = P["softcap"] * math.tanh(x / P["softcap"])
                                if P["alibi"]:
                                    x -= P["alibi"][R["h"]] * abs(R["diag"] - c)
                                if need_mask and not (R["lo"] <= c < R["hi"]):
                                    x = -math.inf
                                elif not need_mask:
                                    assert R["lo"] <= c < R["hi"] or r0 + r >= rows_packed, "unmasked invisible key"
                                sc.append(x)
                            new_max = max(st["m"][r], max(sc))
                            ms = 0.0 if new_max == -math.inf else new_max
                            rescale = math.exp(st["m"][r] - ms) if st["m"][r] > -math.inf else 0.0
                            st["m"][r] = new_max
                            p = [math.exp(x - ms) if x > -math.inf else 0.0 for x in sc]
                            st["l"][r] = st["l"][r] * rescale + sum(p)
                            o = [a * rescale for a in st["o"][r]]
                            for jj in range(WARP_N):
                                if p[jj] != 0.0:
                                    o = [a + p[jj] * vv for a, vv in zip(o, vtile[cw - c0 + jj])]
                            st["o"][r] = o
                # epilogue merge of the warps
                for r in range(BLOCK_M):
                    rr = r0 + r
                    if rr >= rows_packed:
                        continue
                    t, h = rr // g, hk * g + rr % g
                    M = max(wst[w]["m"][r] for w in range(WARPS))
                    ms = 0.0 if M == -math.inf else M
                    f = [math.exp(wst[w]["m"][r] - ms) if wst[w]["m"][r] > -math.inf else 0.0 for w in range(WARPS)]
                    L = sum(f[w] * wst[w]["l"][r] for w in range(WARPS))
                    if P["sinks"] and split == 0:
                        L += math.exp(P["sinks"][h] - ms)
                    inv = 1.0 / L if L > 0 else 0.0
                    o = [sum(f[w] * wst[w]["o"][r][i] for w in range(WARPS)) * inv for i in range(P["dv"])]
                    lse = ms + math.log(L) if L > 0 else -math.inf
                    part[(split, bi, h, t)] = (o, lse)
    return part, writes


def merge(parts_list):
    """The fused merge of the last block (kernel step 6): weights e^{lse_s - M} in split order."""
    m = max(l for _, l in parts_list)
    ws = [math.exp(l - m) if l > -math.inf else 0.0 for _, l in parts_list]
    z = sum(ws)
    dv = len(parts_list[0][0])
    inv = 1.0 / z if z > 0 else 0.0
    o = [sum(w * p[0][i] for w, p in zip(ws, parts_list) if w > 0) * inv for i in range(dv)]
    return o, (m + math.log(z) if z > 0 else -math.inf)


def arrivals(rng, splits, calls=4):
    """The done flags of step 6 over consecutive calls (fresh tags, then a repeated tag as in a
    graph replay), starting from garbage: every block stores its flag, then reads all flags one
    by one; one that saw all = tag merges and clears them. The blocks' steps interleave at random
    (sequentially consistent, as the kernel's fences make it). At least one block must merge, and
    only after every flag was stored; the flags are 0 after the call. Returns a list of errors."""
    errs = []
    flags = [rng.getrandbits(64) for _ in range(splits)]
    for tag in [11, 12, 13, 13, 13]:
        # per block: ("w",), ("r", j) for j < splits, ("c",) clear if it merges
        progs = {i: [("w",)] + [("r", j) for j in range(splits)] for i in range(splits)}
        seen_all = {i: True for i in range(splits)}
        stored = set()
        mergers = 0
        while progs:
            i = rng.choice(list(progs))
            op = progs[i].pop(0)
            if op[0] == "w":
                flags[i] = tag
                stored.add(i)
            elif op[0] == "r":
                seen_all[i] = seen_all[i] and flags[op[1]] == tag
                if op[1] == splits - 1 and seen_all[i]:
                    mergers += 1
                    if len(stored) != splits:
                        errs.append("merge before every split stored its flag")
                    progs[i].append(("c",))
            else:
                flags = [0] * splits
            if not progs[i]:
                del progs[i]
        if mergers < 1 or any(flags):
            errs.append("flags: %d merging blocks, flags %r after a call with tag %d" % (mergers, flags[:4], tag))
    return errs


def close(a, b, tol=1e-9):
    if a == b:
        return True
    if math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) <= tol * max(1.0, abs(b))


def check(P):
    reads = []
    part, writes = kernel(P, reads)
    o_ref, lse_ref = reference(P)
    errs = []
    for bi in range(P["b"]):
        for h in range(P["hq"]):
            for t in range(P["sq"]):
                states = [part[(s, bi, h, t)] for s in range(P["splits"])]
                o, lse = merge(states) if P["splits"] > 1 else states[0]
                if not close(lse, lse_ref[bi][h][t]) or not all(close(x, y) for x, y in zip(o, o_ref[bi][t][h])):
                    errs.append("b%d h%d t%d: lse %r vs %r" % (bi, h, t, lse, lse_ref[bi][h][t]))
    if P["splits"] > 1:
        errs += arrivals(random.Random(P["splits"] * 7919 + P["b"]), P["splits"])
    # reads: cache slots only in [pad, L0), k_new rows only < sq; no slot twice per (b, split, row tile, hk)
    for kind, bi, c in reads:
        if kind == "cache" and not (P["pads"][bi] <= c < P["lens"][bi]):
            errs.append("read cache slot %d of b%d outside [%d, %d)" % (c, bi, P["pads"][bi], P["lens"][bi]))
    # writes: exactly the appended slots, once per (b, hk)
    if P["append"]:
        want = {(bi, hk, P["lens"][bi] + t) for bi in range(P["b"]) for hk in range(P["hkv"]) for t in range(P["sq"])}
        got = [(w[0], w[1], w[2]) for w in writes]
        if sorted(got) != sorted(want):
            errs.append("append writes differ")
    return errs


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    rng = random.Random(7)
    bad = 0
    for i in range(n):
        P = make_problem(rng)
        errs = check(P)
        if errs:
            bad += 1
            print("FAIL case %d (b=%d hkv=%d g=%d sq=%d cap=%d append=%s paged=%s splits=%d wl=%d wr=%d): %s" % (
                i, P["b"], P["hkv"], P["g"], P["sq"], P["cap"], P["append"], P["cache"]["paged"], P["splits"],
                P["wl"], P["wr"], "; ".join(errs[:3])))
    print("%d cases, %d failed" % (n, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
