#!/usr/bin/env python3
"""A real client of flashattn: a Hugging Face transformers Llama decoder (random init from a small
LlamaConfig, nothing downloaded) with its attention routed through flashattn, checked against the
same model on transformers' SDPA path.

  1. logits and every parameter gradient of one batch: the flashattn model's error against a
     float64 SDPA model must be <= 2x the error of the SDPA model in the same dtype (+ a floor
     of half a unit in the last place): FlashAttention's rule, applied to a whole model;
  2. the same with right-padded sequences (a 2-D attention mask: flashattn runs varlen);
  3. a short training run (AdamW, same seed, same data) with each attention: the loss curves
     must match step by step.

Prints a table and exits non-zero if a check fails.

    python python/examples/hf_llama_check.py                   # GPU if present, else CPU
    python python/examples/hf_llama_check.py --device cpu --size tiny --steps 20
    python python/examples/hf_llama_check.py --device cuda --dtype bfloat16 --size small

Needs torch and transformers (>= 4.53; written against 5.x). flashattn is imported from the
installed package, or from this repository's python/ directory.
"""

import argparse
import copy
import math
import os
import sys
import time

import torch

try:
    import flashattn
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import flashattn

from flashattn.bert_padding import pad_input, unpad_input

try:
    import transformers
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
except ImportError as err:  # keep the failure readable when transformers is missing or too old
    sys.exit("hf_llama_check: needs transformers >= 4.53 with AttentionInterface (%s)" % err)

# The registered name must not contain "flash": transformers reads any such name as a request for
# a flash-attention kernel from its hub.
IMPLEMENTATION = "libfa_attention"
CALLS = {"count": 0}  # proves transformers really routed attention through flashattn

SIZES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, batch, seqlen
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, intermediate_size=256, vocab_size=512,
                 batch=2, seqlen=64),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, intermediate_size=1376, vocab_size=4096,
                  batch=4, seqlen=512),
    "medium": dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=128, intermediate_size=5504,
                   vocab_size=32000, batch=4, seqlen=2048),
}


# ---- the attention function transformers calls ------------------------------------------------


def flashattn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                        sliding_window=None, softcap=None, **kwargs):
    """transformers attention interface: query (batch, heads, q_len, d), key/value (batch,
    kv_heads, kv_len, d); returns (output (batch, q_len, heads, d), None). The transposed views
    go to flashattn by strides (no copy). attention_mask is None (no padding: plain causal) or
    the 2-D padding mask (batch, kv_len) from flash_attention_mask: then the batch is unpadded
    and runs as variable-length sequences."""
    CALLS["count"] += 1
    if dropout and module.training:
        raise NotImplementedError("flashattn: attention dropout is not supported")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    window = (sliding_window - 1, 0) if sliding_window else (-1, -1)
    sinks = kwargs.get("s_aux")
    options = dict(softmax_scale=scaling, causal=causal, window_size=window,
                   softcap=softcap or 0.0, sink_logits=sinks)
    if attention_mask is None:
        return flashattn.flash_attn_func(q, k, v, **options), None
    if attention_mask.dim() != 2:
        raise ValueError("flashattn attention expects no mask or a 2-D padding mask, got shape %s"
                         % tuple(attention_mask.shape))
    batch, q_len = q.shape[0], q.shape[1]
    q_unpad, q_indices, cu_q, max_q, _ = unpad_input(q, attention_mask[:, -q_len:])
    k_unpad, _, cu_k, max_k, _ = unpad_input(k, attention_mask)
    v_unpad = unpad_input(v, attention_mask)[0]
    out = flashattn.flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_q, cu_k, max_q, max_k,
                                           **options)
    return pad_input(out, q_indices, batch, q_len), None


def register():
    AttentionInterface.register(IMPLEMENTATION, flashattn_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, flash_attention_mask)


def use_attention(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return model


# ---- the rule ------------------------------------------------------------------------------------


def floor_for(dtype, magnitude):
    """Half a unit in the last place of dtype at the tensor's own magnitude (fp32: 1e-5
    relative): gradients of a whole model span many magnitudes, so no absolute offset."""
    if magnitude == 0.0:
        return 0.0
    if dtype == torch.float32:
        return 1e-5 * magnitude
    bits = {torch.float16: 10, torch.bfloat16: 7}[dtype]
    return 2.0 ** (math.floor(math.log2(magnitude)) - bits - 1)


class RuleTable:
    def __init__(self, dtype):
        self.dtype = dtype
        self.rows = []

    def add(self, name, ours, base, ref, mask=None):
        ours, base, ref = ours.double(), base.double(), ref.double()
        if mask is not None:
            ours, base, ref = ours[mask], base[mask], ref[mask]
        err = (ours - ref).abs().max().item()
        base_err = (base - ref).abs().max().item()
        tol = 2.0 * base_err + floor_for(self.dtype, ref.abs().max().item())
        self.rows.append((name, err, base_err, tol, err <= tol))

    def print(self, title):
        print("\n%s" % title)
        header = ("tensor", "flashattn err", "sdpa err", "tolerance", "ok")
        print("| %-34s | %12s | %12s | %12s | %4s |" % header)
        print("|%s|%s|%s|%s|%s|" % ("-" * 36, "-" * 15, "-" * 14, "-" * 14, "-" * 6))
        for name, err, base_err, tol, ok in self.rows:
            print("| %-34s | %12.3e | %12.3e | %12.3e | %4s |"
                  % (name[:34], err, base_err, tol, "yes" if ok else "NO"))

    def passed(self):
        return all(row[4] for row in self.rows)


# ---- checks --------------------------------------------------------------------------------------


def make_config(size):
    fields = {k: v for k, v in SIZES[size].items() if k not in ("batch", "seqlen")}
    return LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5, attention_dropout=0.0,
                       tie_word_embeddings=False, **fields)


def logits_and_grads(model, input_ids, attention_mask, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, attention_mask=attention_mask)
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                             reduction="none")
    if attention_mask is not None:
        loss = loss * attention_mask.flatten()
    loss.sum().div(labels.numel()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def check_one_batch(model, ref_model, input_ids, attention_mask, labels, dtype, title):
    table = RuleTable(dtype)
    base_logits, base_grads = logits_and_grads(use_attention(model, "sdpa"), input_ids,
                                               attention_mask, labels)
    calls = CALLS["count"]
    ours_logits, ours_grads = logits_and_grads(use_attention(model, IMPLEMENTATION), input_ids,
                                               attention_mask, labels)
    routed = CALLS["count"] - calls
    if routed != model.config.num_hidden_layers:
        print("attention was routed through flashattn %d times, expected %d (one per layer)"
              % (routed, model.config.num_hidden_layers))
        return False
    ref_logits, ref_grads = logits_and_grads(ref_model, input_ids, attention_mask, labels)
    valid = None if attention_mask is None else attention_mask.bool()
    table.add("logits", ours_logits, base_logits, ref_logits, valid)
    for name in ref_grads:
        table.add("grad " + name.replace("model.", ""), ours_grads[name], base_grads[name],
                  ref_grads[name])
    table.print(title)
    return table.passed()


def training_curves(model, steps, batch, seqlen, vocab, device, seed, lr):
    """Loss per step for `model` trained on a fixed synthetic stream (same seed -> same data)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    period = 17
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, seconds = [], 0.0
    model.train()
    for step in range(steps):
        # next-token task on noisy periodic sequences, learnable within a few steps
        span = min(vocab, 64)
        start = torch.randint(0, span, (batch, 1), generator=generator)
        offsets = torch.arange(seqlen + 1) % period
        tokens = (start + offsets * 7) % span
        noise = torch.rand(tokens.shape, generator=generator) < 0.05
        tokens = torch.where(noise, torch.randint(0, vocab, tokens.shape, generator=generator),
                             tokens).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(out.logits.float().flatten(0, 1),
                                                 tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step > 0:  # the first step pays one-time costs (allocator, thread pools)
            seconds += time.perf_counter() - t0
        losses.append(loss.item())
    return losses, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--size", default=None, choices=list(SIZES),
                        help="model size (default: small on cuda, tiny on cpu)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (>= 20)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss-tol", type=float, default=None,
                        help="max |loss_flashattn - loss_sdpa| / loss_sdpa per step (default "
                             "1e-4 fp32, 3e-2 fp16/bf16)")
    args = parser.parse_args()

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    size = args.size or ("small" if device.type == "cuda" else "tiny")
    shape = SIZES[size]
    loss_tol = args.loss_tol or (1e-4 if dtype == torch.float32 else 3e-2)
    print("hf_llama_check: torch %s, transformers %s, flashattn %s (%s), device %s, dtype %s, "
          "size %s" % (torch.__version__, transformers.__version__, flashattn.__version__,
                       flashattn.library_path, device, str(dtype).replace("torch.", ""), size))
    register()

    torch.manual_seed(args.seed)
    config = make_config(size)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    ref_model = use_attention(copy.deepcopy(model).to(torch.float64), "sdpa")

    batch, seqlen, vocab = shape["batch"], shape["seqlen"], shape["vocab_size"]
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    input_ids = torch.randint(0, vocab, (batch, seqlen), generator=gen).to(device)
    labels = torch.randint(0, vocab, (batch, seqlen), generator=gen).to(device)
    ok = check_one_batch(model, ref_model, input_ids, None, labels, dtype,
                         "1. one batch (%d x %d tokens): error vs float64 SDPA model"
                         % (batch, seqlen))

    mask = torch.ones(batch, seqlen, dtype=torch.long)
    for b in range(batch):  # right padding of different lengths, one row unpadded
        mask[b, seqlen - (b * seqlen) // (2 * batch):] = 0
    mask = mask.to(device)
    ok &= check_one_batch(model, ref_model, input_ids, mask, labels, dtype,
                          "2. padded batch (lengths %s): varlen path"
                          % mask.sum(1).tolist())
    del ref_model

    steps = max(args.steps, 1)
    torch.manual_seed(args.seed)
    init = LlamaForCausalLM(config).to(device=device, dtype=dtype)
    curves = {}
    for name in ("sdpa", IMPLEMENTATION):
        trained = use_attention(copy.deepcopy(init), name)
        calls = CALLS["count"]
        curves[name] = training_curves(trained, steps, batch, seqlen, vocab, device,
                                       args.seed + 2, args.lr)
        routed = CALLS["count"] - calls
        expected = steps * config.num_hidden_layers if name == IMPLEMENTATION else 0
        if routed != expected:
            print("training with %s: %d flashattn calls, expected %d" % (name, routed, expected))
            ok = False
        del trained
    print("\n3. training, %d steps of AdamW (lr %g), same init and data" % (steps, args.lr))
    print("| step | loss sdpa | loss flashattn | rel. diff |")
    print("|------|-----------|----------------|-----------|")
    worst = 0.0
    for i, (a, b) in enumerate(zip(curves["sdpa"][0], curves[IMPLEMENTATION][0])):
        rel = abs(a - b) / max(abs(a), 1e-12)
        worst = max(worst, rel)
        print("| %4d | %9.5f | %14.5f | %9.2e |" % (i + 1, a, b, rel))
    losses = curves[IMPLEMENTATION][0]
    window = max(1, min(5, len(losses) // 4))
    decreased = sum(losses[-window:]) < sum(losses[:window])
    train_ok = worst <= loss_tol and decreased
    tokens = max(steps - 1, 1) * batch * seqlen
    print("max relative loss difference %.2e (tolerance %.0e); loss %s; time per run: sdpa "
          "%.2f s, flashattn %.2f s (%.0f / %.0f tokens/s fwd+bwd+step, first step excluded)"
          % (worst, loss_tol, "decreased" if decreased else "did NOT decrease",
             curves["sdpa"][1], curves[IMPLEMENTATION][1],
             tokens / max(curves["sdpa"][1], 1e-9), tokens / max(curves[IMPLEMENTATION][1], 1e-9)))
    ok &= train_ok
    if steps < 20:
        print("note: fewer than 20 steps were run (--steps %d)" % steps)
    print("\nRESULT: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
