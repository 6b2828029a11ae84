"""flash_attn.layers' counterparts: `flashattn.layers.rotary` (rotary position embeddings)."""
