"""DeepSeek-style multi-head latent attention (MLA) decoding with flashattn.

MLA keeps one latent vector per token: 512 compressed dims followed by 64 rotary dims (576 in
all). Keys are the whole latent, values its first 512 dims, and every query head attends to the
same single latent head. flashattn reads the values straight out of the key cache when v_cache
is a view of k_cache (the same storage and strides, fewer columns): nothing is copied, and an
append writes each new latent once.

    python examples/mla_decode.py            # CPU (the CUDA kernels stop at head dim 256)

Checks the output against a float64 computation and prints the largest difference."""

import numpy as np

import flashattn

batch, heads, latent_dim, value_dim, capacity, new_tokens = 4, 128, 576, 512, 256, 2
rng = np.random.default_rng(0)

# the latent cache and the tokens already in it; the queries of 2 speculative tokens
cache = np.zeros((batch, capacity, 1, latent_dim), np.float32)
lengths = np.array([200, 17, 64, 130], np.int32)
for b, n in enumerate(lengths):
    cache[b, :n] = rng.standard_normal((n, 1, latent_dim)) * 0.5
q = rng.standard_normal((batch, new_tokens, heads, latent_dim)).astype(np.float32) * 0.5
latent_new = rng.standard_normal((batch, new_tokens, 1, latent_dim)).astype(np.float32) * 0.5

scale = 1.0 / np.sqrt(192.0)  # DeepSeek-V3 scales by its (nope + rope) query dim
out, lse = flashattn.flash_attn_with_kvcache(
    q, cache, cache[..., :value_dim],              # values: the first 512 dims of the cache
    k=latent_new, v=latent_new[..., :value_dim],   # appended once, at cache_seqlens
    cache_seqlens=lengths, softmax_scale=scale, causal=True, return_softmax_lse=True)

# float64 reference: each sequence's keys are its cache plus the new tokens
worst = 0.0
for b, n in enumerate(lengths):
    keys = cache[b, :n + new_tokens, 0].astype(np.float64)  # the append landed in the cache
    values = keys[:, :value_dim]
    for i in range(new_tokens):
        visible = n + i + 1                                   # causal: up to this token
        s = q[b, i].astype(np.float64) @ keys[:visible].T * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        ref = (p / p.sum(axis=1, keepdims=True)) @ values[:visible]
        worst = max(worst, float(np.abs(out[b, i] - ref).max()))
print("MLA decode: out", out.shape, "lse", lse.shape, "max |out - float64| = %.2e" % worst)
assert worst < 1e-4
