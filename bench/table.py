#!/usr/bin/env python3
"""Formats the two bench JSON results as a markdown table with ratios."""
import json
import sys

rust = json.load(open(sys.argv[1]))
torch = json.load(open(sys.argv[2]))
rows = [
    (f"prefill ({rust['prefill_tokens']} tokens, batch 1)", "tokens/s", "prefill_tok_s", True),
    (f"decode (greedy, after 128-token prompt, {rust['decode_tokens']} steps)", "tokens/s", "decode_tok_s", True),
    (f"LoRA r={rust['lora_rank']} fwd+bwd+AdamW, {rust['train_batch']}x{rust['train_seq']}", "s/step", "train_step_s", False),
]
print(f"| measure ({rust['threads']} threads) | unit | pathfinder-model | PyTorch | ratio (higher = pathfinder faster) |")
print("|---|---|---|---|---|")
for name, unit, key, higher_better in rows:
    r, t = rust.get(key), torch.get(key)
    if r is None or t is None:
        print(f"| {name} | {unit} | {r} | {t} | not measured |")
        continue
    ratio = r / t if higher_better else t / r
    print(f"| {name} | {unit} | {r:.2f} | {t:.2f} | {ratio:.2f}x |")
for rows, r in rust.get("decode_batch_tok_s", {}).items():
    t = torch.get("decode_batch_tok_s", {}).get(rows)
    name = f"decode, {rows} prompts together ({rust['decode_tokens']} steps each)"
    if t is None:
        print(f"| {name} | tokens/s | {r:.2f} | not measured | - |")
    else:
        print(f"| {name} | tokens/s | {r:.2f} | {t:.2f} | {r / t:.2f}x |")
print()
print(f"PyTorch side: {torch['impl']}")
