#!/usr/bin/env python3
"""Formats the bench JSON results as a markdown table with ratios.

    table.py RUST.json TORCH.json
    table.py --rust R1.json R2.json ... --torch T1.json T2.json ...

With several results a side (interleaved rounds, bench/run.sh), each figure is the median of
the rounds and the table gives their range too."""
import json
import statistics
import sys


def load(paths):
    return [json.load(open(p)) for p in paths]


if "--rust" in sys.argv:
    i, j = sys.argv.index("--rust"), sys.argv.index("--torch")
    rust_runs, torch_runs = load(sys.argv[i + 1:j]), load(sys.argv[j + 1:])
else:
    rust_runs, torch_runs = load(sys.argv[1:2]), load(sys.argv[2:3])


def median_of(runs):
    """One result: numbers the median over the runs, dicts key by key, the rest the first's."""
    first = runs[0]
    out = {}
    for key, value in first.items():
        values = [r.get(key) for r in runs]
        if all(v == value for v in values):
            out[key] = value  # settings (threads, sizes) and anything the runs agree on
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and all(isinstance(v, (int, float)) for v in values):
            out[key] = statistics.median(values)
        elif isinstance(value, dict):
            out[key] = median_of([v for v in values if isinstance(v, dict)])
        else:
            out[key] = value
    return out


def spread(runs, key):
    values = [r.get(key) for r in runs if isinstance(r.get(key), (int, float))]
    return f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""


rust, torch = median_of(rust_runs), median_of(torch_runs)
if len(rust_runs) > 1 or len(torch_runs) > 1:
    print(f"medians of {len(rust_runs)} pathfinder and {len(torch_runs)} PyTorch runs, interleaved; ranges in brackets\n")
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
    print(f"| {name} | {unit} | {r:.2f}{spread(rust_runs, key)} | {t:.2f}{spread(torch_runs, key)} | {ratio:.2f}x |")
for rows, r in sorted(rust.get("decode_batch_tok_s", {}).items(), key=lambda kv: int(kv[0])):
    t = torch.get("decode_batch_tok_s", {}).get(rows)
    name = f"decode, {rows} prompts together ({rust['decode_tokens']} steps each)"
    if t is None:
        print(f"| {name} | tokens/s | {r:.2f} | not measured | - |")
    else:
        print(f"| {name} | tokens/s | {r:.2f} | {t:.2f} | {r / t:.2f}x |")
print()
print(f"PyTorch side: {torch['impl']}, device {torch.get('device', 'cpu')}")
kernels = ", ".join(f"{k} {v:.2f} s" for k, v in rust.get("train_step_s_by_kernels", {}).items())
print(f"pathfinder side: {rust['impl']}, device {rust.get('device', 'cpu')}; training kernels: {kernels}")
for side, result in (("pathfinder", rust), ("PyTorch", torch)):
    if result.get("gpu_peak_mib") is not None:
        print(f"{side}: peak GPU memory in use {result['gpu_peak_mib']} MiB (nvidia-smi, the whole run)")
if rust.get("cpu_relative_diff") is not None:
    print(f"prefill logits against the CPU (f32): max relative difference {rust['cpu_relative_diff']:.2e}")
fit = rust.get("fit_losses") or []
if fit:
    print(f"short fit of the training batch, {len(fit)} AdamW steps at lr {rust['fit_lr']}: "
          f"loss {fit[0]:.4f} -> {fit[-1]:.4f}")
